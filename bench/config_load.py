#!/usr/bin/env python3
"""Benchmark: load and validate a large vgpu-device-manager-style config file.

Builds ~3,000 lines with 700 named configs (one per catalog type, as NVIDIA's
example config does, plus multi-model configs), then loads it a few times and
prints the median wall time. Target: ≤ 1.0 s.

Then loads one config of about 5 MB (44,000 configs) once and prints its time,
the CPU time per MB and the ratio of per-MB CPU times (5 MB / 700 configs): about 1
when loading is linear in the size of the file.

Then validates, as ``vgpu-state validate`` does, a document within the limits of
one (150,000 YAML nodes) that names 20,000 vGPU types: 2,000 layouts of 10 types
each, every catalog type many times, some entries mixing models (errors), and
prints the median time (``--many-types 0`` skips it).

    python bench/config_load.py [--runs 5] [--big-configs 44000] [--many-types 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from vgpu_state.catalog import default_catalog
from vgpu_state.config import load_text, yamlnodes
from vgpu_state.model.errors import ConfigError

CATALOG = default_catalog()

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


def build_many_types(type_count: int = 20000, per_layout: int = 10) -> str:
    """``type_count`` type names in layouts of ``per_layout`` types (catalog order)."""
    cat = default_catalog()
    names = [t.name for m in cat.models for t in m.types]
    lines = ["version: v1", "vgpu-configs:"]
    for n in range(type_count // per_layout):
        lines += [f"  layout-{n}:", "    - devices: all", "      vgpu-devices:"]
        for k in range(per_layout):
            lines.append(f'        "{names[(n * per_layout + k) % len(names)]}": 1')
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--big-configs", type=int, default=44000, help="0 skips the 5 MB load")
    parser.add_argument("--many-types", type=int, default=20000, help="0 skips the validation")
    args = parser.parse_args()
    text = build()
    times, cpu_times = [], []
    for _ in range(args.runs):
        start, cpu_start = time.perf_counter(), time.process_time()
        document = load_text(text, "bench.yaml", catalog=CATALOG)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    median = statistics.median(times)
    print(
        f"config_load: {text.count(chr(10))} lines, {len(document.configs)} configs, "
        f"median {median:.3f} s over {args.runs} runs (target ≤ {TARGET_SECONDS:.1f} s)"
    )
    if args.big_configs:
        big = build(args.big_configs)
        # 5 MB of layouts are past the node limit of one document (a ConfigMap holds 1 MiB
        # and files are read up to 4 MiB): lifted here to measure how loading scales.
        yamlnodes.MAX_NODES = 10 * 1000 * 1000
        start, cpu = time.perf_counter(), time.process_time()
        load_text(big, "big.yaml", catalog=CATALOG)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        small_rate = statistics.median(cpu_times) / (len(text) / 1e6)
        big_rate = cpu / (len(big) / 1e6)
        print(
            f"config_load: {len(big) / 1e6:.1f} MB, {args.big_configs} configs in {seconds:.2f} s "
            f"(CPU {cpu:.2f} s) "
            f"({big_rate:.2f} CPU s/MB; {big_rate / small_rate:.2f}x the CPU s/MB of the "
            "700-config file)"
        )
    if args.many_types:
        many = build_many_types(args.many_types)
        many_times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            try:
                load_text(many, "many.yaml", catalog=CATALOG)
            except ConfigError as e:  # entries that mix models: the errors validate prints
                problems = len(e.issues)
            else:
                problems = 0
            many_times.append(time.perf_counter() - start)
        print(
            f"config_load: validate {args.many_types} type names in "
            f"{args.many_types // 10} layouts ({problems} problems) median "
            f"{statistics.median(many_times):.3f} s over {args.runs} runs"
        )
    return 0 if median <= TARGET_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
