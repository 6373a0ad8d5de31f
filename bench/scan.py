#!/usr/bin/env python3
"""Benchmark: scan a simulated node of 8 GPUs x 32 VFs through the directory-tree frontend.

Every VF offers the ~20 graphics types of an empty L40S. Prints the median scan
time and the number of files read, for the vendor-VFIO layout (the target) and
for the mdev layout (one directory per type per VF) for comparison.
"""

from __future__ import annotations

import statistics
import sys
import time

from vgpu_state.catalog import default_catalog
from vgpu_state.host import scan_with_stats
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import parse_spec

CATALOG = default_catalog()

TARGET_MS = 50.0
RUNS = 15


def node_spec(layout: str) -> str:
    gpus = "\n".join(
        f'  - {{address: "0000:{0x21 + i * 0x10:02x}:00.0", model: L40S, layout: {layout}}}'
        for i in range(8)
    )
    return f"node: bench\ndriver: {{flavour: graphics}}\nextra-pci-devices: 64\ngpus:\n{gpus}\n"


def measure(layout: str) -> tuple[float, int, int, int]:
    with SimHost(parse_spec(node_spec(layout), catalog=CATALOG)) as host:
        times = []
        files = 0
        snap = None
        for _ in range(RUNS):
            started = time.perf_counter()
            snap, stats = scan_with_stats(host.root, host.node, catalog=CATALOG)
            times.append(time.perf_counter() - started)
            files = stats.files_read
        assert snap is not None
        vfs = sum(len(g.vfs) for g in snap.gpus)
        types = max(len(vf.creatable) for g in snap.gpus for vf in g.vfs)
        return statistics.median(times) * 1000, files, vfs, types


def main() -> int:
    print(f"Python {sys.version.split()[0]}, {RUNS} runs each")
    ok = True
    for layout in ("vendor-vfio", "mdev"):
        median_ms, files, vfs, types = measure(layout)
        mark = "" if layout != "vendor-vfio" else (" OK" if median_ms <= TARGET_MS else " SLOW")
        print(
            f"{layout:12s} 8 GPUs, {vfs} VFs, {types} creatable types per VF: "
            f"median {median_ms:.1f} ms, {files} files read{mark}"
        )
        if layout == "vendor-vfio":
            ok = median_ms <= TARGET_MS
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
