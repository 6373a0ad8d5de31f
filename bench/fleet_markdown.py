#!/usr/bin/env python3
"""Benchmark: ``vgpu-state fleet plan --from SNAPSHOT -o markdown`` for N nodes (1,000).

The fleet is ``bench/fleet.py``'s (six pools, 1 to 8 GPUs a node, every fourth
node with a held vGPU, the config under review changing three pools), written
as a fleet snapshot (``docs/gitops.md``) instead of served as list responses.
Timed: ``fleet plan --from`` as a process (imports, reading the snapshot,
planning, the review comment), the median of ``--runs`` runs after a warm-up
run; ``-o text`` beside it for comparison. Printed: wall time, CPU time (user +
system), peak RSS, the comment's size in characters against GitHub's 65,536,
and the ratio to the goal (1,000 nodes: 3 s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import fleet as fleet_bench  # noqa: E402 - bench/fleet.py: its fleet and its runner

GOAL = {1000: 3.0}
"""Fleet size -> wall seconds ``-o markdown`` must stay within."""


def write_snapshot(path: Path, count: int) -> dict[str, int]:
    """The fleet as ``fleet snapshot`` writes it: header, Node labels, statuses, end."""
    scanned = datetime.datetime.now(tz=datetime.UTC)
    nodes: list[tuple[str, dict[str, str]]] = []
    states: list[str] = []
    for node, state in fleet_bench.fleet_items(count, scanned):
        nodes.append((node["metadata"]["name"], node["metadata"].get("labels") or {}))
        record = {"kind": "VGPUNodeState", "name": state["metadata"]["name"]}
        record["status"] = state["status"]
        states.append(json.dumps(record, separators=(",", ":")))
    header = {
        "kind": "vgpu-state-fleet-snapshot",
        "format_version": "1",
        "taken_at": scanned.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": {"server": "https://bench.example:6443", "context": None},
    }
    with path.open("w") as out:
        out.write(json.dumps(header) + "\n")
        for name, labels in sorted(nodes):
            out.write(json.dumps({"kind": "Node", "name": name, "labels": labels}) + "\n")
        for line in states:
            out.write(line + "\n")
        out.write(json.dumps({"kind": "end", "nodes": len(nodes), "states": len(states)}) + "\n")
    return {"nodes": len(nodes), "bytes": path.stat().st_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000, help="fleet size (%(default)s)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per output")
    args = parser.parse_args()
    tree = REPO
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, "
        f"load {Path('/proc/loadavg').read_text().strip()}, "
        f"{datetime.datetime.now(tz=datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )
    print(f"code: {fleet_bench.which_code(tree)}")
    fleet_bench.compile_bytecode(tree)
    ok = True
    with tempfile.TemporaryDirectory(prefix="vgpu-fleet-md-") as tmp:
        root = Path(tmp)
        config = root / "fleet.yaml"
        config.write_text(fleet_bench.CONFIG)
        snapshot = root / "fleet.jsonl"
        started = time.perf_counter()
        sizes = write_snapshot(snapshot, args.nodes)
        print(
            f"snapshot: {sizes['nodes']} nodes, {sizes['bytes'] / 1e6:.1f} MB, written in "
            f"{time.perf_counter() - started:.1f} s"
        )
        base = ["fleet", "plan", "-f", str(config), "--from", str(snapshot), "--max-age", "0"]
        for what, extra in (("-o markdown", ["-o", "markdown"]), ("-o text", [])):
            out = root / "out"
            runs = [
                fleet_bench.run_once([*base, *extra], tree, out) for _ in range(args.runs + 1)
            ][1:]
            wall = statistics.median(r.wall for r in runs)
            cpu = statistics.median(r.cpu for r in runs)
            rss = statistics.median(r.rss_mb for r in runs)
            verdict = ""
            goal = GOAL.get(args.nodes)
            if goal is not None and what == "-o markdown":
                good = wall <= goal
                ok = ok and good
                verdict = f"; goal {goal} s: ratio {wall / goal:.2f} {'OK' if good else 'MISSED'}"
            size = ""
            if what == "-o markdown":
                text = out.read_text()
                groups = text.count("| GPU | change | count | vGPU type |")
                size = (
                    f", comment {len(text):,} characters (GitHub holds 65,536), "
                    f"{groups} group table(s), {text.count('<details>')} collapsed section(s)"
                )
            print(
                f"fleet plan --from {what}, {args.nodes} nodes: wall median {wall:.3f} s "
                f"(min {min(r.wall for r in runs):.3f}, max {max(r.wall for r in runs):.3f}), "
                f"CPU {cpu:.3f} s, peak RSS {rss:.0f} MB, exit {runs[-1].code}{size}{verdict}",
                flush=True,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
