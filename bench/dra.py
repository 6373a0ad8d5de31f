#!/usr/bin/env python3
"""Benchmark: Dynamic Resource Allocation on a simulated node and the test API server.

1. From apply to the node's ResourceSlices being current, for 16 vGPUs (one
   L40S, 16 x L40S-3Q) and for 512 vGPUs (16 L40S x 32 L40S-1Q, vendor-specific
   VFIO): the reconcile's plan, apply and verification on the in-process
   simulator, a fresh scan, the pool built, and the slices written to kmock's
   emulator over HTTP through the official client. A second publish of the
   unchanged pool is timed too.
2. Prepare latency: ``NodePrepareResources`` for one claim with one vGPU, from
   a fake kubelet over the plugin's unix socket (claim read from memory, and
   from the API server), CDI specs and metadata written to /dev/shm; and the
   matching unprepare.

Numbers only; the targets are in bench/RESULTS.md.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from tests.dra_apiserver import NODES, RunningDraApiServer, claims
from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.dra.claims import AllocatedDevice, Claim
from vgpu_state.dra.plugin import DraPlugin
from vgpu_state.dra.prepare import Preparer
from vgpu_state.dra.slices import DRIVER, PoolSpec, build_pool
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.dra import KubeClaims, SlicePublisher
from vgpu_state.kube.transport import Endpoint, Transport
from vgpu_state.reconcile import Mode, Ports, Settings, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import parse_spec
from vgpu_state.testing import FakeCluster, MemoryClaims, dra_paths
from vgpu_state.testing.dra_kubelet import DraKubelet

CATALOG = default_catalog()

NODE = "bench"
TARGET_PUBLISH_S = {16: 0.5, 512: 2.0}
TARGET_PREPARE_MS = 20.0


def spec(gpus: int) -> str:
    return (
        f"node: {NODE}\ndriver: {{flavour: graphics}}\ngpus:\n"
        + "\n".join(
            f'  - {{address: "0000:{0x21 + i * 0x8:02x}:00.0", model: L40S, layout: vendor-vfio}}'
            for i in range(gpus)
        )
        + "\n"
    )


def layout(type_name: str, count: int) -> str:
    return (
        "version: v1\nvgpu-configs:\n  bench:\n    - devices: all\n"
        f"      vgpu-devices: {{{type_name}: {count}}}\n"
    )


def apply_layout(host: SimHost, type_name: str, count: int) -> None:
    """Apply the layout through the one path the CLI and the agent take."""
    ports = Ports(
        host,
        FakeCluster(NODE),
        StaticConfigSource(load_text(layout(type_name, count), "bench.yaml", catalog=CATALOG)),
    )
    report = reconcile_once(
        ports, Settings(catalog=default_catalog()), mode=Mode.APPLY, config_name="bench"
    )
    assert report.converged, report.differences


def client(url: str) -> KubeApi:
    return KubeApi(Transport(Endpoint(server=url)), url, (5.0, 10.0))


def apply_to_slices(vgpus: int) -> tuple[float, float, float, PoolSpec, SimHost]:
    gpus, type_name, per_gpu = (1, "L40S-3Q", 16) if vgpus == 16 else (16, "L40S-1Q", 32)
    host = SimHost(parse_spec(spec(gpus), catalog=CATALOG), in_memory=True)
    api = RunningDraApiServer().start()
    try:
        api.put_object(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        publisher = SlicePublisher(client(api.url), NODE)
        publisher.current()  # warm up: the client's first request and the Node lookup,
        publisher._node_owner()  # which a running agent does once at start
        started = time.perf_counter()
        apply_layout(host, type_name, per_gpu)  # ends with a fresh scan compared with the layout
        applied = time.perf_counter()
        pool = build_pool(host.scan(), catalog=CATALOG)
        publisher.publish(pool)
        current = time.perf_counter()
        assert len(pool.devices) == vgpus, len(pool.devices)
        again = time.perf_counter()
        publisher.publish(pool)
        unchanged = time.perf_counter() - again
        return current - started, current - applied, unchanged, pool, host
    finally:
        api.stop()


def prepare_latency(rounds: int = 20) -> tuple[list[float], list[float], list[float]]:
    base = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/dev/shm"))
    # a sysfs tree: prepare reads IOMMU groups from it
    host = SimHost(parse_spec(spec(1), catalog=CATALOG))
    api = RunningDraApiServer().start()
    kubelet: DraKubelet | None = None
    plugin: DraPlugin | None = None
    try:
        apply_layout(host, "L40S-1Q", 32)
        pool = build_pool(host.scan(), catalog=CATALOG)
        names = sorted(pool.devices)[:rounds]
        paths = dra_paths(base, host.root)
        memory = MemoryClaims()
        kube = KubeClaims(client(api.url))
        results: dict[str, list[float]] = {"memory": [], "api": [], "unprepare": []}
        for source_name, source in (("memory", memory), ("api", kube)):
            preparer = Preparer(
                node=NODE, claims=source, inventory=lambda: pool.devices, paths=paths
            )
            plugin = DraPlugin(preparer, paths)
            plugin.start()
            kubelet = DraKubelet(paths.registry_dir)
            kubelet.register_all()
            for i, name in enumerate(names):
                claim_name = f"c{i}"
                result = AllocatedDevice(request="vgpu", driver=DRIVER, pool=NODE, device=name)
                if source_name == "memory":
                    uid = f"00000000-0000-4000-8000-{i:012d}"
                    memory.put(
                        Claim(
                            namespace="vms",
                            name=claim_name,
                            uid=uid,
                            allocated=True,
                            results=(result,),
                        )
                    )
                else:
                    uid = api.put_object(
                        claims("v1"),
                        {
                            "apiVersion": "resource.k8s.io/v1",
                            "kind": "ResourceClaim",
                            "metadata": {"name": claim_name, "namespace": "vms"},
                            "status": {
                                "allocation": {
                                    "devices": {
                                        "results": [
                                            {
                                                "request": "vgpu",
                                                "driver": DRIVER,
                                                "pool": NODE,
                                                "device": name,
                                            }
                                        ]
                                    }
                                }
                            },
                        },
                    )["metadata"]["uid"]
                started = time.perf_counter()
                reply = kubelet.prepare(DRIVER, [("vms", claim_name, uid)])
                results[source_name].append(time.perf_counter() - started)
                assert reply.claims[uid].error == "", reply.claims[uid].error
                started = time.perf_counter()
                kubelet.unprepare(DRIVER, [("vms", claim_name, uid)])
                results["unprepare"].append(time.perf_counter() - started)
            kubelet.close()
            plugin.stop()
        return results["memory"], results["api"], results["unprepare"]
    finally:
        if kubelet is not None:
            kubelet.close()
        if plugin is not None:
            plugin.stop()
        api.stop()
        host.close()
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    for vgpus in (16, 512):
        total, publish, unchanged, pool, host = apply_to_slices(vgpus)
        host.close()
        target = TARGET_PUBLISH_S[vgpus]
        print(
            f"{vgpus:4d} vGPUs: apply -> slices current {total:.3f} s "
            f"(scan + build + publish {publish:.3f} s, ratio to target {publish / target:.2f}; "
            f"{len(pool.slices)} slices); unchanged pool re-published in {unchanged * 1000:.1f} ms"
        )
    memory, api, unprepare = prepare_latency()
    for label, values in (
        ("prepare, claim from memory", memory),
        ("prepare, claim from the API server", api),
        ("unprepare", unprepare),
    ):
        ms = [v * 1000 for v in values]
        print(
            f"{label}: median {statistics.median(ms):.2f} ms, max {max(ms):.2f} ms "
            f"over {len(ms)} claims (ratio to {TARGET_PREPARE_MS:.0f} ms target "
            f"{statistics.median(ms) / TARGET_PREPARE_MS:.2f})"
        )


if __name__ == "__main__":
    main()
