#!/usr/bin/env python3
"""Benchmark: mixed-size placement (``catalog.placement.place``) of 32-vGPU mixes.

Places, on an L40S (48 slots) and on an RTX PRO 6000 Blackwell (96 slots), a mix
of 31–32 vGPUs (32 is the most one GPU holds: one per VF), and a mix beside
existing vGPUs, many times; prints the median time per call. Target: well under
1 ms per call (validate and the planner call it once per entry and GPU).

    python bench/placement.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from vgpu_state.catalog import default_catalog
from vgpu_state.catalog.placement import Placement, place

TARGET_MS = 1.0

CASES = [
    ("L40S", {"L40S-1Q": 26, "L40S-2Q": 4, "L40S-4Q": 1, "L40S-8Q": 1}, ()),
    ("RTX PRO 6000 Blackwell Server Edition", {"DC-3Q": 28, "DC-4Q": 3}, ()),
    ("L40S", {"L40S-1Q": 16, "L40S-4Q": 2}, (("L40S-12Q", 0), ("L40S-8Q", 24), ("L40S-2Q", 40))),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    catalog = default_catalog()
    for model_name, types, existing in CASES:
        model = catalog.model(model_name)
        assert model is not None
        result = place(model, types, existing)
        assert isinstance(result, Placement), result
        times = []
        for _ in range(args.calls):
            start = time.perf_counter()
            place(model, types, existing)
            times.append(time.perf_counter() - start)
        median_ms = statistics.median(times) * 1000
        vgpus = len(result.vgpus)
        print(
            f"{model_name}: {vgpus} vGPUs ({len(existing)} existing) on {result.slots} slots: "
            f"median {median_ms:.3f} ms per call (target < {TARGET_MS} ms)"
        )


if __name__ == "__main__":
    main()
