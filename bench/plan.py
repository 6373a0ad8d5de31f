#!/usr/bin/env python3
"""Benchmark: planning a layout change on a simulated node of 8 GPUs x 32 VFs.

Two measurements, medians:

* ``plan()`` itself on a snapshot scanned from the simulator, for a layout
  change that touches every GPU (target 20 ms). Two nodes: 8 x L40S with the
  vendor-specific VFIO layout (32 vGPUs per GPU, 16 swapped for another series
  of the same size) and 8 x A40 with the mdev layout on 32 VFs each (12 vGPUs
  per GPU, 4 swapped).
* ``vgpu-state plan -f CONFIG -c NAME --sim SPEC`` as a subprocess, wall time
  (target 0.5 s), for the L40S node and for a two-GPU node.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.model.desired import DesiredState
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.planner import plan
from vgpu_state.ports import MemoryCluster
from vgpu_state.reconcile import Ports, Settings, gather
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import parse_spec

CATALOG = default_catalog()

PLAN_TARGET_MS = 20.0
CLI_TARGET_S = 0.5
PLAN_RUNS = 21
CLI_RUNS = 9


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    layout: str
    existing: tuple[tuple[str, int], ...]
    wanted: tuple[tuple[str, int], ...]
    gpus: int = 8


CASES = (
    Case(
        "8 x L40S vendor-VFIO, 32 VFs, 16 of 32 vGPUs per GPU swapped",
        "L40S",
        "vendor-vfio",
        existing=(("L40S-1Q", 16), ("L40S-1B", 16)),
        wanted=(("L40S-1Q", 16), ("L40S-1A", 16)),
    ),
    Case(
        "8 x A40 mdev, 32 VFs, 4 of 12 vGPUs per GPU swapped",
        "A40",
        "mdev",
        existing=(("A40-4Q", 8), ("A40-4C", 4)),
        wanted=(("A40-4Q", 4), ("A40-4C", 8)),
    ),
)
SMALL = Case(
    "2 x L40S vendor-VFIO, 2 of 4 vGPUs per GPU swapped",
    "L40S",
    "vendor-vfio",
    existing=(("L40S-4Q", 2), ("L40S-4C", 2)),
    wanted=(("L40S-4Q", 4),),
    gpus=2,
)


def spec_text(case: Case) -> str:
    lines = ["node: bench", "driver: {flavour: all}", "extra-pci-devices: 64", "gpus:"]
    for i in range(case.gpus):
        lines += [
            f'  - address: "0000:{0x21 + i * 0x10:02x}:00.0"',
            f"    model: {case.model}",
            f"    layout: {case.layout}",
            "    vgpus:",
        ]
        vf = 0
        for name, count in case.existing:
            for _ in range(count):
                lines.append(f"      - {{type: {name}, vf: {vf}}}")
                vf += 1
    return "\n".join(lines) + "\n"


def config_text(case: Case) -> str:
    body = "".join(f"        {name}: {count}\n" for name, count in case.wanted)
    return (
        "version: v1\npolicy: {prune: true}\nvgpu-configs:\n  change:\n"
        f"    - devices: all\n      vgpu-devices:\n{body}"
    )


def inputs(case: Case) -> tuple[DesiredState, NodeSnapshot]:
    """The plan's inputs, gathered as a reconcile gathers them."""
    document = load_text(config_text(case), "bench.yaml", catalog=CATALOG)
    with SimHost(parse_spec(spec_text(case), catalog=CATALOG), in_memory=True) as host:
        ports = Ports(host, MemoryCluster("bench"), StaticConfigSource(document))
        gathered = gather(ports, Settings(catalog=default_catalog()), "change")
    return gathered.desired, gathered.snapshot


def measure_plan(case: Case) -> tuple[float, int, int]:
    desired, snapshot = inputs(case)
    times = []
    p = None
    for _ in range(PLAN_RUNS):
        started = time.perf_counter()
        p = plan(desired, snapshot, catalog=CATALOG)
        times.append(time.perf_counter() - started)
    assert p is not None and not p.blocked
    assert {a.gpu for a in p.actions} == {g.address for g in snapshot.gpus}
    return statistics.median(times) * 1000, p.summary.destroy, p.summary.create


def command() -> list[str]:
    script = Path(sys.executable).with_name("vgpu-state")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "vgpu_state.cli.main"]


def compile_bytecode() -> None:
    """Compile the package to bytecode once, as ``pip install`` does for an installed tool.

    An editable install has no bytecode, and with ``PYTHONDONTWRITEBYTECODE`` set
    (as on this machine) every run would compile every module again.
    """
    import compileall

    import vgpu_state

    compileall.compile_dir(Path(vgpu_state.__file__).parent, quiet=1)


def measure_cli(case: Case) -> float:
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-") as tmp:
        spec = Path(tmp, "node.yaml")
        config = Path(tmp, "config.yaml")
        spec.write_text(spec_text(case), encoding="utf-8")
        config.write_text(config_text(case), encoding="utf-8")
        argv = [*command(), "plan", "-f", str(config), "-c", "change", "--sim", str(spec)]
        subprocess.run(argv, check=True, capture_output=True)  # warm the caches
        times = []
        for _ in range(CLI_RUNS):
            started = time.perf_counter()
            done = subprocess.run(argv, check=True, capture_output=True)
            times.append(time.perf_counter() - started)
        assert b"to create" in done.stdout
        return statistics.median(times)


def main() -> int:
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores")
    ok = True
    for case in CASES:
        ms, destroyed, created = measure_plan(case)
        good = ms <= PLAN_TARGET_MS
        ok = ok and good
        print(
            f"plan() {case.name}: median {ms:.1f} ms of {PLAN_RUNS} "
            f"({destroyed} destroy, {created} create); target {PLAN_TARGET_MS:.0f} ms, "
            f"ratio {ms / PLAN_TARGET_MS:.2f} {'OK' if good else 'SLOW'}"
        )
    for case in (CASES[0], SMALL):
        s = measure_cli(case)
        good = s <= CLI_TARGET_S
        ok = ok and good
        print(
            f"vgpu-state plan --sim, {case.name}: median {s:.3f} s of {CLI_RUNS}; "
            f"target {CLI_TARGET_S} s, ratio {s / CLI_TARGET_S:.2f} {'OK' if good else 'SLOW'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
