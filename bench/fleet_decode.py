#!/usr/bin/env python3
"""Benchmark: ``fleet plan``'s decoding of the nodes' reports, CPU time per node.

From a page of the ``VGPUNodeState`` list (the text the API server sends, 500
objects) to the plan's input (``ReportedNode``: the status validated, the scan
inflated, decoded and its fingerprint checked), as a process planning the fleet
decodes it (one ``SnapshotDecoder``, ``SharedParts`` remembering per page), in
this process: no HTTP, no start-up, no planning. The fleet is bench/fleet.py's.
Printed per checkout: CPU time per node, the best and the median of the runs;
``--compare TREE`` interleaves another checkout's runs with this one's, run by
run (each run a process of its own, the checkout first on the path).
``--instructions`` counts instructions instead (valgrind's cachegrind, no cache
simulation), which other processes on the machine do not change: those of a
process that decodes the first two pages less those of one that decodes the first,
per node of the second page.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import fleet as fleet_bench  # noqa: E402 - bench/fleet.py: the fleet and its list pages

NODES = 1000
RUNS = 7
PAGE = 500

CHILD = (
    "import runpy, sys; sys.argv.pop(0); tree = sys.argv.pop(0); sys.path.insert(0, tree); "
    "sys.meta_path[:] = [f for f in sys.meta_path "
    "if not type(f).__module__.startswith('__editable__')]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
"""Runs this script from a given checkout's code (see bench/fleet.py's ``LAUNCH``)."""


def decode(fleet: Path, repeat: int, pages_to_decode: int | None = None) -> float:
    """The best of ``repeat`` decodes of the whole fleet (or of its first
    ``pages_to_decode`` pages), CPU seconds per node."""
    from vgpu_state.kube.fleet import reported_nodes
    from vgpu_state.kube.node import labels_of
    from vgpu_state.kube.nodestate import SnapshotDecoder
    from vgpu_state.model.snapshot import SharedParts

    states = (fleet / "states.jsonl").read_bytes().splitlines()
    labels = {}
    for line in (fleet / "nodes.jsonl").read_bytes().splitlines():
        node = json.loads(line)
        labels[node["metadata"]["name"]] = labels_of(node)
    pages = [
        fleet_bench.list_body("VGPUNodeStateList", states, start, PAGE)
        for start in range(0, len(states), PAGE)
    ][:pages_to_decode]
    best = float("inf")
    for _ in range(repeat):
        decoder = SnapshotDecoder()
        started = time.process_time()
        decoded = 0
        for page in pages:
            with SharedParts.remembering():
                for _node in reported_nodes(page, labels, decoder):
                    decoded += 1
        best = min(best, (time.process_time() - started) / decoded)
    return best


def run(tree: Path, fleet: Path, repeat: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), __file__, "--child", str(fleet), str(repeat)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tree,
    )
    return float(done.stdout.split()[-1])


def instructions(tree: Path, fleet: Path, pages: int) -> int:
    """Instructions of a process that decodes the fleet's first ``pages`` pages once."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            "-c",
            CHILD,
            str(tree),
            __file__,
            "--child",
            str(fleet),
            "1",
            str(pages),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tree,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind: {done.stderr[-500:]}")
    return int(found.group(1).replace(",", ""))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=NODES, help="fleet size (%(default)s)")
    parser.add_argument("--runs", type=int, default=RUNS, help="runs per checkout")
    parser.add_argument(
        "--repeat", type=int, default=3, help="decodes of the fleet per run (the best counts)"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        help="another checkout (e.g. a worktree of main): its runs interleave with this "
        "tree's, run by run",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the built fleet in this directory and reuse it"
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per node of the second page (valgrind) instead of timing",
    )
    return parser.parse_args(argv)


def main() -> int:
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--child":
        pages = int(sys.argv[4]) if len(sys.argv) == 5 else None
        print(decode(Path(sys.argv[2]), int(sys.argv[3]), pages))
        return 0
    args = parse_args(sys.argv[1:])
    trees = [("this", REPO)] + ([("compare", args.compare.resolve())] if args.compare else [])
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, "
        f"load {Path('/proc/loadavg').read_text().strip()}, "
        f"{datetime.datetime.now(tz=datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )
    for label, tree in trees:
        print(f"{label}: {fleet_bench.which_code(tree)}")
        fleet_bench.compile_bytecode(tree)
    with tempfile.TemporaryDirectory(prefix="vgpu-decode-") as tmp:
        fleet = fleet_bench.fleet_dir(Path(tmp), args.nodes, args.keep)
        if args.instructions:
            second = min(PAGE, args.nodes - PAGE)
            if second <= 0:
                raise SystemExit(f"--instructions needs more than {PAGE} nodes")
            print(f"\ndecode, instructions per node of the second page ({second} nodes):")
            for label, tree in trees:
                one, two = (instructions(tree, fleet, n) for n in (1, 2))
                print(f"{label:<8} {(two - one) / second / 1e6:8.3f} M")
            return 0
        times: dict[str, list[float]] = {label: [] for label, _ in trees}
        for _ in range(args.runs):
            for label, tree in trees:
                times[label].append(run(tree, fleet, args.repeat))
    print(f"\ndecode, CPU ms per node ({args.runs} runs, best of {args.repeat} decodes each):")
    print(f"{'tree':<8} {'best':>8} {'median':>8}")
    for label, _ in trees:
        best, median = min(times[label]), statistics.median(times[label])
        print(f"{label:<8} {best * 1e3:8.3f} {median * 1e3:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
