#!/usr/bin/env python3
"""Benchmark: ``vgpu-state fleet plan``'s fixed cost, from process start to its first request.

What every ``fleet plan`` pays before it plans its first node: the interpreter,
the command's imports, the config file, the Kubernetes client and the
kubeconfig (a token user, as bench/fleet.py's), up to the first list request.
An HTTP server in this process notes when that request arrives and answers an
empty list, so the command also runs to its end; printed per checkout: the
minimum and median time from the process's start to its first request, and the
whole run's wall and CPU time (user + system; an empty fleet, so no workers).
The command runs as bench/fleet.py runs it (bytecode compiled, the checkout
first on the path); ``--compare TREE`` interleaves another checkout's runs with
this one's, run by run.

Then the local commands ``vgpu-state validate`` (the shipped layouts) and
``vgpu-state plan --sim`` (a small simulated node): each command's median wall
and CPU time next to those of a bare interpreter importing only the modules
its work needs (:data:`LOCAL`), their ratio (goal <= 1.5), and the command's
largest import costs by package (``python -X importtime``, self time).
``--local-only`` skips ``fleet plan``.
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import fleet as fleet_bench  # noqa: E402 - bench/fleet.py: its config, kubeconfig and runner

RUNS = 9
LOCAL_GOAL = 1.5
"""A local command's time over its bare imports' time, at most."""

# Each local command and the modules its work needs: the layouts loader and the
# catalog (validate); with them the simulated node, the planner and the plan's
# rendering (plan --sim). Both need click to read their arguments.
LOCAL = [
    (
        "validate",
        ["validate", "-f", str(REPO / "configs" / "default.yaml")],
        ["click", "vgpu_state.catalog", "vgpu_state.config"],
    ),
    (
        "plan --sim",
        [
            "plan",
            "-f",
            str(REPO / "configs" / "default.yaml"),
            "-c",
            "all-disabled",
            "--sim",
            str(REPO / "configs" / "sim" / "a2-host.yaml"),
        ],
        [
            "click",
            "vgpu_state.catalog",
            "vgpu_state.config",
            "vgpu_state.compose",
            "vgpu_state.planner",
            "vgpu_state.render.plan",
        ],
    ),
]


class FirstRequest:
    """The moment (``time.perf_counter``) the current run's first request arrived."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.lock = threading.Lock()

    def note(self) -> None:
        now = time.perf_counter()
        with self.lock:
            if self.at is None:
                self.at = now


def serve(first: FirstRequest) -> http.server.ThreadingHTTPServer:
    """Empty lists for every path, on a free port, in a thread of this process."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            first.note()
            body = json.dumps({"kind": "List", "metadata": {}, "items": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_once(args: list[str], tree: Path, first: FirstRequest) -> tuple[float, float, float]:
    """Seconds to the first request, the whole run's wall and CPU seconds."""
    first.at = None
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*fleet_bench.command(tree), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or first.at is None:
        raise SystemExit(f"fleet plan failed ({code}): {err.decode()[-2000:]}")
    return first.at - started, wall, usage.ru_utime + usage.ru_stime


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one run; its exit status is not judged
    (``plan`` exits 1 when it plans changes)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{argv[3:]} failed: {err.decode()[-2000:]}")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def bare_imports(tree: Path, modules: list[str]) -> list[str]:
    """An interpreter started as :func:`fleet.command` starts one, importing ``modules``."""
    probe = fleet_bench.LAUNCH.replace(
        "runpy.run_module('vgpu_state.cli.main', run_name='__main__')",
        "import " + ", ".join(modules),
    )
    return [sys.executable, "-c", probe, str(tree)]


def import_costs(tree: Path, args: list[str], top: int = 8) -> str:
    """The command's largest import costs (self time) summed by top-level package."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *fleet_bench.command(tree)[1:], *args],
        capture_output=True,
        text=True,
    )
    costs: dict[str, int] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        package = name.strip().split(".")[0]
        if package == "vgpu_state":
            package = ".".join(name.strip().split(".")[:2])
        costs[package] = costs.get(package, 0) + int(own)
    ranked = sorted(costs.items(), key=lambda item: -item[1])[:top]
    return ", ".join(f"{name} {us / 1000:.0f} ms" for name, us in ranked)


def local_commands(tree: Path, runs: int) -> None:
    for label, args, modules in LOCAL:
        command, bare = [*fleet_bench.command(tree), *args], bare_imports(tree, modules)
        results: dict[str, list[tuple[float, float]]] = {"command": [], "bare": []}
        for i in range(runs + 1):  # the first round warms the page cache
            for kind, argv in (("command", command), ("bare", bare)):
                run = timed(argv)
                if i:
                    results[kind].append(run)
        wall = {k: statistics.median(r[0] for r in v) for k, v in results.items()}
        cpu = {k: statistics.median(r[1] for r in v) for k, v in results.items()}
        print(
            f"{label}: median {wall['command'] * 1000:.0f} ms wall, "
            f"{cpu['command'] * 1000:.0f} ms CPU; its bare imports ({', '.join(modules)}) "
            f"{wall['bare'] * 1000:.0f} ms wall, {cpu['bare'] * 1000:.0f} ms CPU; ratio "
            f"{wall['command'] / wall['bare']:.2f} wall, {cpu['command'] / cpu['bare']:.2f} CPU "
            f"(goal <= {LOCAL_GOAL}; {runs} runs)"
        )
        print(f"  largest imports: {import_costs(tree, args)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="timed runs per checkout")
    parser.add_argument(
        "--compare",
        type=Path,
        help="another checkout (e.g. a worktree of main): its runs interleave with this "
        "tree's, run by run",
    )
    parser.add_argument(
        "--local-only", action="store_true", help="only validate and plan --sim"
    )
    args = parser.parse_args()
    trees = [("this", REPO)] + ([("compare", args.compare.resolve())] if args.compare else [])
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, "
        f"load {Path('/proc/loadavg').read_text().strip()}, "
        f"{datetime.datetime.now(tz=datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )
    for label, tree in trees:
        print(f"{label}: {fleet_bench.which_code(tree)}")
        fleet_bench.compile_bytecode(tree)
    if args.local_only:
        local_commands(REPO, args.runs)
        return 0
    first = FirstRequest()
    server = serve(first)
    results: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in trees}
    try:
        with tempfile.TemporaryDirectory(prefix="vgpu-startup-") as tmp:
            root = Path(tmp)
            config = root / "fleet.yaml"
            config.write_text(fleet_bench.CONFIG)
            kube = fleet_bench.kubeconfig(root / "kubeconfig", server.server_address[1])
            command = ["fleet", "plan", "-f", str(config), "--kubeconfig", str(kube)]
            for i in range(args.runs + 1):  # the first round warms the page cache
                for label, tree in trees:
                    run = run_once(command, tree, first)
                    if i:
                        results[label].append(run)
    finally:
        server.shutdown()
        server.server_close()
    for label, _ in trees:
        runs = results[label]
        to_first = sorted(r[0] for r in runs)
        print(
            f"{label}: to the first request min {to_first[0] * 1000:.0f} ms, median "
            f"{statistics.median(to_first) * 1000:.0f} ms; whole run (empty fleet) median "
            f"{statistics.median(r[1] for r in runs) * 1000:.0f} ms wall, "
            f"{statistics.median(r[2] for r in runs) * 1000:.0f} ms CPU ({len(runs)} runs)"
        )
    local_commands(REPO, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
