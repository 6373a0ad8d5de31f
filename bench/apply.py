#!/usr/bin/env python3
"""Benchmark: apply a 256-action plan (8 L40S x 32 VFs, vendor-specific VFIO, one
L40S-1Q per VF) on the in-process simulator and through FUSE.

Prints the total time, the time spent inside host operations and scans, and the
engine's overhead per action (total minus host time, over the actions), once
with the journal on /dev/shm and once on disk, so that fsync is reported
separately instead of hidden in the engine figure.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import vgpu_state.reconcile.once
from vgpu_state.catalog import default_catalog
from vgpu_state.config import FileConfigSource
from vgpu_state.executor import ApplyResult
from vgpu_state.host import SysfsHost
from vgpu_state.model.plan import Plan
from vgpu_state.ports import HostPort, MemoryCluster
from vgpu_state.reconcile import Mode, Ports, QuietReporter, Settings, reconcile_once
from vgpu_state.sim.fuse import fuse_unavailable_reason, mounted
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import parse_spec
from vgpu_state.statefiles import Journal

CATALOG = default_catalog()

TARGET_MS = 1.0
GPUS = 8

SPEC = "node: bench\ndriver: {flavour: graphics}\nextra-pci-devices: 64\ngpus:\n" + "\n".join(
    f'  - {{address: "0000:{0x21 + i * 0x10:02x}:00.0", model: L40S, layout: vendor-vfio}}'
    for i in range(GPUS)
)
LAYOUT = (
    "version: v1\nvgpu-configs:\n  bench:\n    - devices: all\n      vgpu-devices: {L40S-1Q: 32}\n"
)


class TimedHost:
    """A HostPort wrapper that adds up the time spent inside the host."""

    def __init__(self, host: HostPort) -> None:
        self.host = host
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self.host, name)

        def timed(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - started

        return timed


class TimedJournal(Journal):
    """A journal that adds up the time spent writing and syncing its records."""

    seconds = 0.0

    def append(self, record: dict[str, Any]) -> None:
        started = time.perf_counter()
        try:
            super().append(record)
        finally:
            TimedJournal.seconds += time.perf_counter() - started


class Stopwatch(QuietReporter):
    """Times the apply step of the reconcile: from its first action to its end."""

    def __init__(self, host: TimedHost) -> None:
        self.host = host
        self.host_seconds = 0.0
        self.journal_seconds = 0.0

    def applying(self, plan: Plan) -> None:
        self.host.seconds = 0.0
        TimedJournal.seconds = 0.0

    def applied(self, plan: Plan, result: ApplyResult) -> None:
        self.host_seconds = self.host.seconds
        self.journal_seconds = TimedJournal.seconds


def run(host: HostPort, journal_dir: str, workdir: Path) -> tuple[int, float, float, float]:
    config = workdir / "layout.yaml"
    config.write_text(LAYOUT)
    timed = TimedHost(host)
    watch = Stopwatch(timed)
    # The reconcile opens its journal itself; time that journal's writes.
    setattr(vgpu_state.reconcile.once, "Journal", TimedJournal)  # noqa: B010
    with tempfile.TemporaryDirectory(dir=journal_dir) as d:
        settings = Settings(catalog=default_catalog(), journal_path=Path(d) / "journal.jsonl")
        ports = Ports(timed, MemoryCluster("bench"), FileConfigSource(config, catalog=CATALOG))
        report = reconcile_once(
            ports, settings, mode=Mode.APPLY, config_name="bench", reporter=watch
        )
    assert report.applied is not None and report.converged
    total = report.applied.seconds
    return len(report.plan.actions), total, watch.host_seconds, watch.journal_seconds


def report(label: str, actions: int, total: float, host: float, journal: float) -> bool:
    """Print the figures; the target applies to the engine including its journal."""
    per = (total - host) / actions * 1000
    sync = journal / actions * 1000
    mark = "OK" if per <= TARGET_MS else "SLOW"
    print(
        f"{label:34s} {actions} actions: total {total * 1000:7.1f} ms, host {host * 1000:7.1f} ms, "
        f"engine {per:.3f} ms/action {mark} (of which journal write+sync {sync:.3f} ms)"
    )
    return per <= TARGET_MS


def main() -> int:
    print(f"Python {sys.version.split()[0]}")
    spec = parse_spec(SPEC, catalog=CATALOG)
    disk = tempfile.gettempdir()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for jlabel, jdir in (("journal /dev/shm", "/dev/shm"), (f"journal {disk}", disk)):
            with SimHost(spec) as host:
                ok &= report(f"in-process, {jlabel}", *run(host, jdir, work))
        reason = fuse_unavailable_reason()
        if reason:
            print(f"FUSE skipped: {reason}")
            return 0 if ok else 1
        for jlabel, jdir in (("journal /dev/shm", "/dev/shm"), (f"journal {disk}", disk)):
            with mounted(spec, work / "mnt") as m:
                fuse_host = SysfsHost(
                    str(m.root), spec.node, m.sriov_manage_command(), catalog=CATALOG
                )
                report(f"FUSE, {jlabel}", *run(fuse_host, jdir, work))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
