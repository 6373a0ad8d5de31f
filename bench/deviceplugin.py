#!/usr/bin/env python3
"""Benchmark: the kubelet device plugin against a fake kubelet on unix sockets.

1. refresh → kubelet: time from ``DevicePluginManager.refresh(snapshot)`` until
   the fake kubelet holds the new full list, with 1 resource changing and with
   16 resources all changing in one refresh (target ≤ 100 ms).
2. kubelet restart: time from the new ``kubelet.sock`` until every resource is
   registered again and has streamed its list (default poll interval 0.1 s).
3. GetPreferredAllocation packing: 4 GPUs × 8 vGPUs of one type, 100 random
   allocate/free rounds per seed; GPUs left fully free, packed vs first-fit
   (sorted IDs) and vs random choice (what the kubelet does without a preference).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from vgpu_state.deviceplugin import DevicePluginManager
from vgpu_state.deviceplugin.allocation import preferred
from vgpu_state.deviceplugin.inventory import Device, ResourceInventory
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SysfsInterface, Vgpu
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet

TARGET_MS = 100.0
RESTART_TARGET_S = 2.0
DEVICES = 8
ROUNDS = 30


def first_fit(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """The baseline without packing: ``must_include``, then available IDs in sorted order."""
    chosen = list(dict.fromkeys(must_include))[: max(size, 0)]
    for i in sorted(available):
        if len(chosen) >= size:
            break
        if i not in chosen:
            chosen.append(i)
    return chosen


def snapshot(resources: int, generation: int) -> NodeSnapshot:
    """``resources`` types on one GPU each; ``generation`` shifts one UUID per type."""
    gpus = []
    for r in range(resources):
        vgpus = tuple(
            Vgpu(
                kind="mdev",
                parent=f"0000:{0x10 + r:02x}:00.0",
                uuid=f"{r:08x}-0000-4000-8000-{(generation if n == 0 else 0):06x}{n:06x}",
                type_name=f"B{r}-{n}Q",
                type_sysfs_name=f"NVIDIA BENCH{r}-4Q",
                iommu_group=100 + n,
            )
            for n in range(DEVICES)
        )
        gpus.append(
            Gpu(
                index=r,
                address=f"0000:{0x10 + r:02x}:00.0",
                vendor_id=0x10DE,
                device_id=0x1,
                numa_node=r % 2,
                layout=SysfsInterface.MDEV,
                vgpus=vgpus,
            )
        )
    return NodeSnapshot(node="bench", gpus=tuple(gpus))


def ids_of(s: NodeSnapshot) -> dict[str, set[str]]:
    return {f"nvidia.com/NVIDIA_BENCH{g.index}-4Q": {v.key for v in g.vgpus} for g in s.gpus}


def bench_refresh(resources: int, plugin_dir: str) -> list[float]:
    kubelet = DevicePluginKubelet(plugin_dir)
    kubelet.start()
    manager = DevicePluginManager(
        plugin_dir, iommufd=False, present=lambda d: True, health_interval=3600
    )
    times: list[float] = []
    try:
        first = snapshot(resources, 0)
        manager.refresh(first)
        for name, want in ids_of(first).items():
            kubelet.wait_for(name, lambda d, w=want: {x.id for x in d} == w, timeout=10)  # type: ignore[misc]
        for gen in range(1, ROUNDS + 1):
            s = snapshot(resources, gen)
            expected = ids_of(s)
            started = time.perf_counter()
            manager.refresh(s)
            for name, want in expected.items():
                kubelet.wait_for(name, lambda d, w=want: {x.id for x in d} == w, timeout=10)  # type: ignore[misc]
            times.append(1000 * (time.perf_counter() - started))
    finally:
        manager.stop()
        kubelet.stop()
    return times


def bench_restart(resources: int, plugin_dir: str, rounds: int = 5) -> list[float]:
    kubelet = DevicePluginKubelet(plugin_dir)
    kubelet.start()
    manager = DevicePluginManager(
        plugin_dir, iommufd=False, present=lambda d: True, health_interval=3600
    )
    times: list[float] = []
    try:
        s = snapshot(resources, 0)
        manager.refresh(s)
        expected = ids_of(s)
        for name in expected:
            kubelet.wait_registered(name, timeout=10)
        for n in range(rounds):
            kubelet.restart()
            started = time.perf_counter()
            for name, want in expected.items():
                kubelet.wait_registered(name, count=n + 2, timeout=30)
                kubelet.wait_for(name, lambda d, w=want: {x.id for x in d} == w, timeout=30)  # type: ignore[misc]
            times.append(time.perf_counter() - started)
    finally:
        manager.stop()
        kubelet.stop()
    return times


def bench_packing(ids: str, seeds: int = 20, rounds: int = 100) -> dict[str, tuple[float, float]]:
    """Strategy -> (mean fully free GPUs after the last round, mean over all rounds).

    ``ids``: ``uuid`` (mdev: random UUIDs, so sorted order mixes GPUs) or ``bdf``
    (vendor-VFIO: VF addresses, sorted GPU by GPU).
    """
    gpus, per_gpu = 4, 8
    names = random.Random(7)
    devices = []
    for g in range(gpus):
        for n in range(per_gpu):
            key = (
                f"{names.getrandbits(128):032x}"
                if ids == "uuid"
                else f"0000:{0x21 + g:02x}:{n // 8:02x}.{n % 8}"
            )
            devices.append(Device(key, "mdev", f"gpu{g}", 0, 10, None, 1, "/sys"))
    inv = ResourceInventory("nvidia.com/NVIDIA_A16-2Q", tuple(devices))
    gpu_of = {d.id: d.gpu for d in devices}
    all_ids = sorted(gpu_of)
    results: dict[str, tuple[float, float]] = {}
    for strategy in ("packed", "first-fit", "random"):
        finals: list[int] = []
        per_round: list[int] = []
        for seed in range(seeds):
            ops = random.Random(seed)
            choose = random.Random(1000 + seed)
            pods: list[list[str]] = []
            used: set[str] = set()
            for _ in range(rounds):
                free = [i for i in all_ids if i not in used]
                size = ops.choice((1, 1, 2))
                if pods and (ops.random() < 0.4 or len(free) < size):
                    used -= set(pods.pop(ops.randrange(len(pods))))
                else:
                    if strategy == "packed":
                        got = preferred(inv, free, [], size)
                    elif strategy == "first-fit":
                        got = first_fit(free, [], size)
                    else:
                        got = choose.sample(free, size)
                    pods.append(got)
                    used |= set(got)
                per_round.append(gpus - len({gpu_of[i] for i in used}))
            finals.append(per_round[-1])
        results[strategy] = (statistics.mean(finals), statistics.mean(per_round))
    return results


def main() -> int:
    ok = True
    for resources in (1, 16):
        plugin_dir = tempfile.mkdtemp(prefix="dpb-", dir="/tmp")
        try:
            times = sorted(bench_refresh(resources, plugin_dir))
        finally:
            shutil.rmtree(plugin_dir, ignore_errors=True)
        median, worst = statistics.median(times), times[-1]
        p95 = times[int(0.95 * (len(times) - 1))]
        ok &= worst <= TARGET_MS
        print(
            f"refresh -> kubelet list, {resources:2d} resource(s) x {DEVICES} devices: "
            f"median {median:.2f} ms, p95 {p95:.2f} ms, max {worst:.2f} ms over {len(times)} "
            f"(target {TARGET_MS:.0f} ms, ratio {worst / TARGET_MS:.3f})"
        )
    for resources in (1, 16):
        plugin_dir = tempfile.mkdtemp(prefix="dpr-", dir="/tmp")
        try:
            restarts = sorted(bench_restart(resources, plugin_dir))
        finally:
            shutil.rmtree(plugin_dir, ignore_errors=True)
        ok &= restarts[-1] <= RESTART_TARGET_S
        print(
            f"kubelet restart -> re-registered and listed, {resources:2d} resource(s): "
            f"median {statistics.median(restarts):.3f} s, max {restarts[-1]:.3f} s over "
            f"{len(restarts)} (target {RESTART_TARGET_S:.0f} s, "
            f"ratio {restarts[-1] / RESTART_TARGET_S:.2f})"
        )
    for ids in ("uuid", "bdf"):
        packing = bench_packing(ids)
        for strategy, (final, mean) in packing.items():
            print(
                f"packing ({ids}) {strategy:9s}: fully free GPUs of 4 after 100 rounds "
                f"{final:.2f}, mean over the rounds {mean:.2f} (20 seeds)"
            )
        ratio = packing["packed"][1] / max(packing["first-fit"][1], 1e-9)
        print(f"packing ({ids}) packed / first-fit, mean fully free GPUs: ratio {ratio:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
