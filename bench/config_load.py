#!/usr/bin/env python3
"""Benchmark: load and validate a large vgpu-device-manager-style config file.

Builds ~3,000 lines with 700 named configs (one per catalog type, as NVIDIA's
example config does, plus multi-model configs), then loads it a few times and
prints the median wall time. Target: ≤ 1.0 s.

    python bench/config_load.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from vgpu_state.catalog import default_catalog
from vgpu_state.config import load_text

TARGET_SECONDS = 1.0


def build(config_count: int = 700) -> str:
    cat = default_catalog()
    lines = ["version: v1", "vgpu-configs:"]
    pairs = [(m, t) for m in cat.models for t in m.types]
    for n in range(config_count):
        model, vtype = pairs[n % len(pairs)]
        lines += [
            f"  {vtype.name}-{n}:",
            f'    - device-filter: ["{model.device_filters[0]}"]',
            "      devices: all",
            "      vgpu-devices:",
            f'        "{vtype.name}": {vtype.max_instances}',
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    text = build()
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        document = load_text(text, "bench.yaml")
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(
        f"config_load: {text.count(chr(10))} lines, {len(document.configs)} configs, "
        f"median {median:.3f} s over {args.runs} runs (target ≤ {TARGET_SECONDS:.1f} s)"
    )
    return 0 if median <= TARGET_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
