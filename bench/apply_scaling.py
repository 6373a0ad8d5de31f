#!/usr/bin/env python3
"""Benchmark: how `vgpu-state apply` grows with the number of GPUs on a node.

A layout change that touches every GPU (4 vGPUs destroyed and 4 of another
size created on each), applied by the real command as a process:

- ``sim``: ``apply --sim SPEC`` (the simulated driver in the command's memory,
  its state written back to the spec file);
- ``fuse``: ``apply --sysfs-root MOUNT`` on a FUSE-mounted simulated sysfs.

Two node kinds: L40S with the vendor-specific VFIO layout (32 VFs each,
``L40S-12Q`` x 4 -> ``L40S-8Q`` x 4) and A16 with mdevs on its VFs
(``A16-4Q`` x 4 -> ``A16-2Q`` x 4). Prints the median wall time of each
command per GPU count and the exponent of a least-squares fit of
log(time) against log(GPUs) over the counts from 8 up (``time ~ GPUs^k``),
then the same for CPU time (the command's, plus its FUSE server's), which a
machine shared with other work disturbs much less than wall time.

``--tree NAME=DIR`` (repeatable) runs the commands and the FUSE servers of
the source tree ``DIR`` (``PYTHONPATH``), so an older checkout can be measured
on the same machine, interleaved run by run with the current one. Without it
the installed package is measured.

    python bench/apply_scaling.py                       # 1, 8, 16, 32, 64 GPUs, 3 runs
    python bench/apply_scaling.py --gpus 16 --runs 5 --modes sim
    python bench/apply_scaling.py --tree before=/tmp/old --tree after=.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

KINDS = {
    "vfio": ("L40S", "vendor-vfio", "L40S-12Q", "L40S-8Q"),
    "mdev": ("A16", "mdev", "A16-4Q", "A16-2Q"),
}
PER_GPU = 4
RESET = ".vgpu-sim/reset"
"""The mount's control file that puts the node back to its spec (the simulator's)."""
ATTR_TIMEOUT = 1.0
"""How long the kernel may cache a FUSE lookup; waited out after a reset."""


def node_spec(kind: str, gpus: int) -> str:
    model, layout, old, _new = KINDS[kind]
    lines = ["node: bench", "driver: {flavour: graphics}", "extra-pci-devices: 16", "gpus:"]
    for i in range(gpus):
        vgpus = ", ".join(f"{{type: {old}, vf: {v}}}" for v in range(PER_GPU))
        lines.append(
            f'  - {{address: "0000:{0x10 + i:02x}:00.0", model: {model}, layout: {layout}, '
            f"vgpus: [{vgpus}]}}"
        )
    return "\n".join(lines) + "\n"


def layout(kind: str) -> str:
    new = KINDS[kind][3]
    return (
        "version: v1\npolicy: {prune: true}\nvgpu-configs:\n  bench:\n"
        f"    - devices: all\n      vgpu-devices: {{{new}: {PER_GPU}}}\n"
    )


def env_for(tree: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(Path(tree).resolve())
    env.pop("VGPU_STATE_JOURNAL", None)
    env.pop("VGPU_STATE_LOCK_FILE", None)
    return env


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ")[0]
    except OSError:
        return "?"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def mount(spec: Path, mnt: Path, tree: str | None) -> Iterator[tuple[Path, int]]:
    """Serve ``spec`` at ``mnt`` with the FUSE server of ``tree``."""
    mnt.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "vgpu_state.sim", "mount", "--spec", str(spec), str(mnt)]
    proc = subprocess.Popen(
        [*argv, "--foreground"],
        env=env_for(tree),
        cwd=mnt.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (os.path.ismount(mnt) and (mnt / "bus").is_dir()):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"FUSE server exited: {proc.stderr.read() if proc.stderr else ''}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mnt} not mounted within 60 s")
            time.sleep(0.05)
        yield mnt, proc.pid
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, check=False)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, check=False)
        if proc.stderr:
            proc.stderr.close()


class Case:
    """One (tree, mode, kind, GPU count): its files, its mount, its measured runs."""

    def __init__(self, work: Path, tree: str | None, mode: str, kind: str, gpus: int) -> None:
        self.work, self.tree, self.mode, self.kind, self.gpus = work, tree, mode, kind, gpus
        work.mkdir(parents=True)
        self.spec_text = node_spec(kind, gpus)
        self.spec = work / "node.yaml"
        self.spec.write_text(self.spec_text)
        self.config = work / "layout.yaml"
        self.config.write_text(layout(kind))
        self.mnt: Path | None = None
        self.server: int | None = None

    def open(self, stack: ExitStack) -> None:
        if self.mode == "fuse":
            self.mnt, self.server = stack.enter_context(
                mount(self.spec, self.work / "sys", self.tree)
            )

    def reset(self) -> None:
        for stale in (self.work / "state").glob("*"):
            stale.unlink()
        if self.mnt is None:
            for extra in self.work.glob("node.yaml*"):
                extra.unlink()
            self.spec.write_text(self.spec_text)
        else:
            (self.mnt / RESET).write_text("1")
            time.sleep(ATTR_TIMEOUT + 0.1)

    def run(self) -> tuple[float, float]:
        """Wall seconds of one apply, and CPU seconds (the command's and its FUSE server's)."""
        self.reset()
        target = ["--sim", str(self.spec)] if self.mnt is None else ["--sysfs-root", str(self.mnt)]
        argv = [
            sys.executable, "-m", "vgpu_state.cli.main", "apply", "-f", str(self.config),
            "-c", "bench", *target, "--node", "bench", "--auto-approve",
            "--state-dir", str(self.work / "state"),
        ]  # fmt: skip
        server_before = cpu_seconds(self.server) if self.server is not None else 0.0
        with tempfile.TemporaryFile() as out:
            started = time.perf_counter()
            proc = subprocess.Popen(
                argv, env=env_for(self.tree), cwd=self.work, stdout=out, stderr=out
            )
            _pid, status, usage = os.wait4(proc.pid, 0)
            seconds = time.perf_counter() - started
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            output = out.read().decode("utf-8", "replace")
        cpu = usage.ru_utime + usage.ru_stime
        if self.server is not None:
            cpu += cpu_seconds(self.server) - server_before
        if proc.returncode != 0 or "Apply complete" not in output:
            raise RuntimeError(f"{self.label()}: apply exited {proc.returncode}\n{output}")
        return seconds, cpu

    def label(self) -> str:
        return f"{self.mode} {self.kind} {self.gpus} GPUs"


def exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(seconds) against log(GPUs)."""
    pts = [(math.log(n), math.log(s)) for n, s in points if s > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gpus", default="1,8,16,32,64", help="GPU counts (comma-separated)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each case (median quoted)")
    ap.add_argument("--modes", default="sim,fuse", help="sim, fuse or both")
    ap.add_argument("--kinds", default="vfio,mdev", help="vfio, mdev or both")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    args = ap.parse_args(argv)
    counts = [int(n) for n in args.gpus.split(",")]
    modes = args.modes.split(",")
    kinds = args.kinds.split(",")
    trees: list[tuple[str, str | None]] = [
        (t.split("=", 1)[0], t.split("=", 1)[1]) for t in args.tree
    ] or [("installed", None)]
    if "fuse" in modes:
        from vgpu_state.sim.fuse import fuse_unavailable_reason

        reason = fuse_unavailable_reason()
        if reason:
            print(f"FUSE skipped: {reason}")
            modes = [m for m in modes if m != "fuse"]
    for name, tree in trees:
        # Each tree's commands run from a scratch directory, so that ``-m`` finds
        # the package of ``--tree`` (or the installed one), never the current one.
        with tempfile.TemporaryDirectory() as scratch:
            where = subprocess.run(
                [sys.executable, "-c", "import vgpu_state; print(vgpu_state.__file__)"],
                env=env_for(tree),
                cwd=scratch,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        print(f"{name}: {where}")
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.runs} run(s) per case, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {loadavg()}"
    )
    times: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    cpus: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-scaling-") as tmp:
        for kind in kinds:
            for n in counts:
                cases = [
                    Case(Path(tmp) / f"{name}-{mode}-{kind}-{n}", tree, mode, kind, n)
                    for name, tree in trees
                    for mode in modes
                ]
                names = [name for name, _ in trees for _ in modes]
                with ExitStack() as stack:
                    for c in cases:
                        c.open(stack)
                    for _ in range(args.runs):
                        # Interleaved: every tree and mode once per round.
                        for name, c in zip(names, cases, strict=True):
                            loads.append(float(loadavg()))
                            s, cpu = c.run()
                            times[(name, c.mode, kind, n)].append(s)
                            cpus[(name, c.mode, kind, n)].append(cpu)
                            print(
                                f"  {name:10s} {c.label():22s} {s:8.2f} s wall {cpu:7.2f} s CPU"
                                f"  (load {loadavg()})",
                                flush=True,
                            )
    print()
    for title, table in (("wall time", times), ("CPU time (apply + FUSE server)", cpus)):
        print(f"median {title}:")
        print("| tree | apply | node | " + " | ".join(f"{n}" for n in counts) + " | exponent |")
        print("|" + "---|" * (len(counts) + 4))
        for name, _tree in trees:
            for mode in modes:
                for kind in kinds:
                    medians = [statistics.median(table[(name, mode, kind, n)]) for n in counts]
                    k = exponent([(n, m) for n, m in zip(counts, medians, strict=True) if n >= 8])
                    cells = " | ".join(f"{m:.2f} s" for m in medians)
                    label = "--sim" if mode == "sim" else "FUSE"
                    node = "L40S vendor VFIO" if kind == "vfio" else "A16 mdev"
                    fit = "—" if k is None else f"{k:.2f}"
                    print(f"| {name} | {label} | {node} | {cells} | {fit} |")
        print()
    if loads:
        print(
            f"\nload average during the runs: min {min(loads):.2f}, "
            f"median {statistics.median(loads):.2f}, max {max(loads):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
