#!/usr/bin/env python3
"""Benchmark: how `vgpu-state apply` grows with the number of GPUs on a node.

A layout change that touches every GPU, applied by the real command as a process:

- ``sim``: ``apply --sim SPEC`` (the simulated driver in the command's memory,
  its state written back to the spec file);
- ``fuse``: ``apply --sysfs-root MOUNT`` on a FUSE-mounted simulated sysfs.

Two node kinds: L40S with the vendor-specific VFIO layout (32 VFs each) and
A16 with mdevs on its VFs (16 VFs each), and two shapes of change:

- ``light``: 4 vGPUs destroyed and 4 of another size created on each GPU
  (``L40S-12Q`` x 4 -> ``L40S-8Q`` x 4; ``A16-4Q`` x 4 -> ``A16-2Q`` x 4);
- ``every-vf``: every VF holds a vGPU and every VF's type changes
  (``L40S-1Q`` x 32 -> ``L40S-2Q`` x 24, 56 actions per GPU;
  ``A16-1Q`` x 16 -> ``A16-2Q`` x 8, 24 actions per GPU), the heavy case.

Prints, per GPU count, the median wall time, CPU time (the command's, plus its
FUSE server's; a machine shared with other work disturbs it much less than wall
time) and peak memory (the command's peak RSS; through FUSE also the server's),
and for each the exponent of a least-squares fit of log(value) against
log(GPUs) over the counts from 8 up (``value ~ GPUs^k``), against the goal
(``GOAL_EXPONENT``).

``--tree NAME=DIR`` (repeatable) runs the commands and the FUSE servers of
the source tree ``DIR`` (``PYTHONPATH``), so an older checkout can be measured
on the same machine, interleaved run by run with the current one. Without it
the installed package is measured.

    python bench/apply_scaling.py                       # 1, 8, 16, 32, 64 GPUs, 3 runs
    python bench/apply_scaling.py --gpus 16 --runs 5 --modes sim
    python bench/apply_scaling.py --shapes every-vf --gpus 8,16,32,64 --kinds vfio
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

KINDS = {"vfio": ("L40S", "vendor-vfio"), "mdev": ("A16", "mdev")}
SHAPES = {
    # shape -> kind -> (type before, vGPUs before, type after, vGPUs after), per GPU
    "light": {"vfio": ("L40S-12Q", 4, "L40S-8Q", 4), "mdev": ("A16-4Q", 4, "A16-2Q", 4)},
    "every-vf": {"vfio": ("L40S-1Q", 32, "L40S-2Q", 24), "mdev": ("A16-1Q", 16, "A16-2Q", 8)},
}
GOAL_EXPONENT = 1.1
"""The growth from 8 GPUs up that each measure (wall, CPU, peak memory) must stay within."""
RESET = ".vgpu-sim/reset"
"""The mount's control file that puts the node back to its spec (the simulator's)."""
ATTR_TIMEOUT = 1.0
"""How long the kernel may cache a FUSE lookup; waited out after a reset."""


def node_spec(shape: str, kind: str, gpus: int) -> str:
    model, layout = KINDS[kind]
    old, count, _new, _after = SHAPES[shape][kind]
    lines = ["node: bench", "driver: {flavour: graphics}", "extra-pci-devices: 16", "gpus:"]
    for i in range(gpus):
        vgpus = ", ".join(f"{{type: {old}, vf: {v}}}" for v in range(count))
        lines.append(
            f'  - {{address: "0000:{0x10 + i:02x}:00.0", model: {model}, layout: {layout}, '
            f"vgpus: [{vgpus}]}}"
        )
    return "\n".join(lines) + "\n"


def layout(shape: str, kind: str) -> str:
    _old, _count, new, after = SHAPES[shape][kind]
    return (
        "version: v1\npolicy: {prune: true}\nvgpu-configs:\n  bench:\n"
        f"    - devices: all\n      vgpu-devices: {{{new}: {after}}}\n"
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


def peak_rss_mb(pid: int) -> float:
    """The peak resident memory of a running process so far (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


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
    """One (tree, mode, shape, kind, GPU count): its files, its mount, its measured runs."""

    def __init__(
        self, work: Path, tree: str | None, mode: str, shape: str, kind: str, gpus: int
    ) -> None:
        self.work, self.tree, self.mode, self.kind, self.gpus = work, tree, mode, kind, gpus
        self.shape = shape
        work.mkdir(parents=True)
        self.spec_text = node_spec(shape, kind, gpus)
        self.spec = work / "node.yaml"
        self.spec.write_text(self.spec_text)
        self.config = work / "layout.yaml"
        self.config.write_text(layout(shape, kind))
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

    def run(self) -> tuple[float, float, float, float]:
        """One apply: wall seconds, CPU seconds (the command's and its FUSE server's), the
        command's peak RSS and its FUSE server's peak RSS so far (MB; 0 without FUSE)."""
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
        server_rss = 0.0
        if self.server is not None:
            cpu += cpu_seconds(self.server) - server_before
            server_rss = peak_rss_mb(self.server)
        if proc.returncode != 0 or "Apply complete" not in output:
            raise RuntimeError(f"{self.label()}: apply exited {proc.returncode}\n{output}")
        return seconds, cpu, usage.ru_maxrss / 1024, server_rss

    def label(self) -> str:
        return f"{self.mode} {self.shape} {self.kind} {self.gpus} GPUs"


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
    ap.add_argument("--shapes", default="light,every-vf", help="light, every-vf or both")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    args = ap.parse_args(argv)
    counts = [int(n) for n in args.gpus.split(",")]
    modes = args.modes.split(",")
    kinds = args.kinds.split(",")
    shapes = args.shapes.split(",")
    for shape in shapes:
        if shape not in SHAPES:
            ap.error(f"--shapes: unknown shape {shape!r} (one of {', '.join(SHAPES)})")
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
    Key = tuple[str, str, str, str, int]
    times: dict[Key, list[float]] = defaultdict(list)
    cpus: dict[Key, list[float]] = defaultdict(list)
    rss: dict[Key, list[float]] = defaultdict(list)
    server_rss: dict[Key, list[float]] = defaultdict(list)
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-scaling-") as tmp:
        for shape in shapes:
            for kind in kinds:
                for n in counts:
                    cases = [
                        Case(
                            Path(tmp) / f"{name}-{mode}-{shape}-{kind}-{n}",
                            tree,
                            mode,
                            shape,
                            kind,
                            n,
                        )
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
                                s, cpu, mem, server = c.run()
                                key = (name, c.mode, shape, kind, n)
                                times[key].append(s)
                                cpus[key].append(cpu)
                                rss[key].append(mem)
                                if c.mode == "fuse":
                                    server_rss[key].append(server)
                                print(
                                    f"  {name:10s} {c.label():32s} {s:8.2f} s wall {cpu:7.2f} s CPU"
                                    f" {mem:6.0f} MB"
                                    + (f" (server {server:.0f} MB)" if c.mode == "fuse" else "")
                                    + f"  (load {loadavg()})",
                                    flush=True,
                                )
    print()
    tables = (
        ("wall time", times, "s"),
        ("CPU time (apply + FUSE server)", cpus, "s"),
        ("peak RSS of the apply command", rss, "MB"),
        ("peak RSS of the FUSE server", server_rss, "MB"),
    )
    for title, table, unit in tables:
        if not table:
            continue
        print(f"median {title}:")
        print(
            "| tree | apply | shape | node | "
            + " | ".join(f"{n}" for n in counts)
            + f" | exponent (goal ≤ {GOAL_EXPONENT}) |"
        )
        print("|" + "---|" * (len(counts) + 5))
        for name, _tree in trees:
            for mode in modes:
                for shape in shapes:
                    for kind in kinds:
                        row = (name, mode, shape, kind)
                        if (*row, counts[0]) not in table:
                            continue
                        medians = [statistics.median(table[(*row, n)]) for n in counts]
                        k = exponent(
                            [(n, m) for n, m in zip(counts, medians, strict=True) if n >= 8]
                        )
                        cells = " | ".join(
                            f"{m:.2f} s" if unit == "s" else f"{m:.0f} MB" for m in medians
                        )
                        label = "--sim" if mode == "sim" else "FUSE"
                        node = "L40S vendor VFIO" if kind == "vfio" else "A16 mdev"
                        fit = (
                            "—"
                            if k is None
                            else f"{k:.2f} {'OK' if k <= GOAL_EXPONENT else 'MISSED'}"
                        )
                        print(f"| {name} | {label} | {shape} | {node} | {cells} | {fit} |")
        print()
    if loads:
        print(
            f"\nload average during the runs: min {min(loads):.2f}, "
            f"median {statistics.median(loads):.2f}, max {max(loads):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
