#!/usr/bin/env python3
"""Benchmark: what one hostile node's status costs the controller.

A node's ``VGPUNodeState`` claims N made-up types of NVIDIA's naming grammar, one
live mdev of each (``tests/hostile_reports.py``). Printed per N: the status's size,
the time ``read_report`` takes to decode and check it against the layouts document
(a second call: the first warms the caches), the size of the report the controller
keeps per node (pickled: its entries and the bounded summary of what it left out),
the peak memory of the call (tracemalloc), and the size of the KubeVirt CR patch a
pass with an honest node plans.

    python bench/controller_report_bounds.py [N ...]
"""

from __future__ import annotations

import datetime
import json
import pickle
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.hostile_reports import layouts, made_up_types, scan  # noqa: E402
from vgpu_state.catalog import default_catalog  # noqa: E402
from vgpu_state.controller.bounds import LayoutBounds  # noqa: E402
from vgpu_state.controller.desired import Missing, decide  # noqa: E402
from vgpu_state.controller.reports import read_report  # noqa: E402
from vgpu_state.kube.nodestate import VGPUNodeStateStatus, encode_snapshot  # noqa: E402

NOW = datetime.datetime(2026, 11, 28, tzinfo=datetime.UTC)


def state(node: str, count: int | None) -> dict[str, object]:
    snap = made_up_types(node, count) if count is not None else scan("a2-host.yaml", node)
    status = VGPUNodeStateStatus(snapshot=encode_snapshot(snap, NOW)).to_json()
    return {"metadata": {"name": node}, "spec": {"nodeName": node}, "status": status}


def main(counts: list[int]) -> None:
    bounds = LayoutBounds.of(layouts().document(), default_catalog())
    honest = read_report(state("gpu-1", None), bounds)
    head = ("types", "status KiB", "read s", "report B", "peak MiB", "patch B")
    print(" ".join(f"{h:>10}" for h in head))
    for count in counts:
        obj = state("evil", count)
        size = len(json.dumps(obj["status"])) / 1024
        read_report(obj, bounds)
        start = time.perf_counter()
        read_report(obj, bounds)
        took = time.perf_counter() - start
        tracemalloc.start()
        report = read_report(obj, bounds)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        kept = len(pickle.dumps(report))
        cr = {"metadata": {"name": "kubevirt", "resourceVersion": "1"}, "spec": {}}
        patch = len(json.dumps(decide(cr, [report, honest], Missing(), 0.0, 300.0).plan.patch))
        mib = peak / 1024 / 1024
        print(f"{count:>10} {size:>10.0f} {took:>10.2f} {kept:>10} {mib:>10.1f} {patch:>10}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1_000, 3_000, 10_000])
