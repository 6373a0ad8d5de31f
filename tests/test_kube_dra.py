"""ResourceSlices and ResourceClaims through the official client against kmock's emulator."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from tests.dra_apiserver import NODES, RunningDraApiServer, claims, slices
from vgpu_state.catalog import default_catalog
from vgpu_state.dra.slices import DRIVER, MDEV_UUID, PCI_BUS_ID, build_pool
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.dra import (
    DraUnsupportedError,
    KubeClaims,
    SlicePublisher,
    SliceResync,
    claims_in_use,
    resource_api_version,
)
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.sim.host import SimHost

CATALOG = default_catalog()

MIXED = Path(__file__).resolve().parent.parent / "configs" / "sim" / "mixed.yaml"
NODE = "gpu-node-1"


def _client(url: str) -> KubeApi:
    cfg = Configuration()
    cfg.host = url
    return KubeApi(ApiClient(cfg), url, (5.0, 10.0))


@pytest.fixture
def serve() -> Iterator[Any]:
    running: list[RunningDraApiServer] = []

    def start(versions: tuple[str, ...] = ("v1",)) -> tuple[RunningDraApiServer, KubeApi]:
        server = RunningDraApiServer(versions).start()
        running.append(server)
        server.put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        return server, _client(server.url)

    yield start
    for s in reversed(running):  # kmock's resolver hooks unwind in reverse order
        s.stop()


@pytest.fixture
def mixed() -> NodeSnapshot:
    with SimHost(MIXED, in_memory=True) as host:
        return host.scan()


def _devices(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for o in objs for d in o["spec"]["devices"]}


def test_the_newest_served_resource_version_is_used(serve: Any) -> None:
    _, client = serve(("v1beta2", "v1"))
    assert resource_api_version(client) == "v1"
    _, client = serve(("v1beta2",))
    assert resource_api_version(client) == "v1beta2"
    _, client = serve(("v1beta1",))
    with pytest.raises(DraUnsupportedError, match=r"Kubernetes 1\.33 or later"):
        resource_api_version(client)


def test_published_slices_list_exactly_the_live_vgpus(serve: Any, mixed: NodeSnapshot) -> None:
    server, client = serve()
    publisher = SlicePublisher(client, NODE)
    result = publisher.publish(build_pool(mixed, catalog=CATALOG))
    assert result.generation == 1 and len(result.created) == 3

    objs = server.list(slices("v1"))
    assert server.server.rejected == []
    devices = _devices(objs)
    live = {v.key for g in mixed.gpus for v in g.vgpus}
    assert {
        d["attributes"].get(MDEV_UUID, d["attributes"].get(PCI_BUS_ID))["string"]
        for d in devices.values()
    } == live
    node_uid = server.list(NODES)[0]["metadata"]["uid"]
    for o in objs:
        assert o["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 3}
        assert o["spec"]["driver"] == DRIVER and o["spec"]["nodeName"] == NODE
        (owner,) = o["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", NODE, node_uid)

    # Publishing the same pool writes nothing and keeps the generation.
    writes = len(server.server.writes)
    assert publisher.publish(build_pool(mixed, catalog=CATALOG)).generation == 1
    assert len(server.server.writes) == writes


def test_a_change_bumps_the_generation_of_every_slice_and_drops_obsolete_ones(
    serve: Any, mixed: NodeSnapshot
) -> None:
    server, client = serve()
    publisher = SlicePublisher(client, NODE)
    publisher.publish(build_pool(mixed, catalog=CATALOG))
    # The T4's only vGPU is destroyed: its slice goes, the others move to generation 2.
    fewer = build_pool(mixed, selected=lambda g, v: g.model != "Tesla T4", catalog=CATALOG)
    result = publisher.publish(fewer)
    assert result.generation == 2
    assert result.deleted == ("gpu-node-1-vgpu-0000-3b-00-0",)
    objs = server.list(slices("v1"))
    assert len(objs) == 2
    assert {o["spec"]["pool"]["generation"] for o in objs} == {2}
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {2}
    assert "mdev-9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80" not in _devices(objs)
    assert server.server.rejected == []


def test_slices_the_kubelet_deletes_come_back(serve: Any, mixed: NodeSnapshot) -> None:
    server, client = serve()
    publisher = SlicePublisher(client, NODE)
    publisher.publish(build_pool(mixed, catalog=CATALOG))
    for o in server.list(slices("v1")):  # the kubelet wipes the node's slices at its start
        server.delete(slices("v1"), o["metadata"]["name"])
    assert server.list(slices("v1")) == []

    resync = SliceResync(publisher, interval=3600).start()
    try:
        done = threading.Event()
        original = publisher.sync

        def sync() -> Any:
            out = original()
            done.set()
            return out

        publisher.sync = sync  # type: ignore[method-assign]
        resync.poke()  # what a (re-)registration by the kubelet does
        assert done.wait(10)
    finally:
        resync.stop()
    objs = server.list(slices("v1"))
    assert len(objs) == 3 and {o["spec"]["pool"]["generation"] for o in objs} == {2}


def test_shutdown_removes_only_this_nodes_slices(serve: Any, mixed: NodeSnapshot) -> None:
    server, client = serve()
    other = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "other-node-gpu"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "other-node",
            "pool": {"name": "other-node", "generation": 4, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    server.put(slices("v1"), other)
    publisher = SlicePublisher(client, NODE)
    publisher.publish(build_pool(mixed, catalog=CATALOG))
    assert len(publisher.current()) == 3
    assert len(publisher.remove_all()) == 3
    assert [o["metadata"]["name"] for o in server.list(slices("v1"))] == ["other-node-gpu"]
    assert publisher.sync() is None  # nothing to republish after shutdown


def test_a_v1beta2_cluster_gets_v1beta2_slices(serve: Any, mixed: NodeSnapshot) -> None:
    server, client = serve(("v1beta2",))
    publisher = SlicePublisher(client, NODE)
    assert publisher.version == "v1beta2"
    publisher.publish(build_pool(mixed, catalog=CATALOG))
    objs = server.list(slices("v1beta2"))
    assert len(objs) == 3 and {o["apiVersion"] for o in objs} == {"resource.k8s.io/v1beta2"}
    assert server.server.rejected == []


def _claim(
    name: str,
    device: str,
    *,
    node: str = NODE,
    driver: str = DRIVER,
    allocated: bool = True,
    pod: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {
                "results": [{"request": "gpu", "driver": driver, "pool": node, "device": device}]
            }
        }
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": "pod-uid-" + pod}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "vms"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
        "status": status,
    }


def test_claims_allocated_in_this_pool_hold_their_vgpus(serve: Any) -> None:
    server, client = serve()
    t4 = "mdev-9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"
    server.put(claims("v1"), _claim("win-gpu", t4, pod="virt-launcher-win-abcde"))
    server.put(claims("v1"), _claim("render", "vf-0000-81-00-6"))
    server.put(claims("v1"), _claim("elsewhere", t4, node="other-node"))
    server.put(claims("v1"), _claim("nvidia", "gpu-0", driver="gpu.nvidia.com"))
    server.put(claims("v1"), _claim("pending", "vf-0000-08-00-5", allocated=False))
    source = KubeClaims(client)
    assert claims_in_use(source, NODE) == {
        "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80": (
            "ResourceClaim vms/win-gpu (pod vms/virt-launcher-win-abcde)"
        ),
        "0000:81:00.6": "ResourceClaim vms/render",
    }
    claim = source.get_claim("vms", "win-gpu")
    assert claim is not None and claim.allocated and claim.uid
    assert [r.device for r in claim.ours(DRIVER, NODE)] == [t4]
    assert source.get_claim("vms", "gone") is None


def test_512_vgpus_fit_the_api_limits(serve: Any) -> None:
    import uuid as uuidlib

    from vgpu_state.model.snapshot import Gpu, SysfsInterface, Vgpu

    gpus = tuple(
        Gpu(
            index=i,
            address=f"0000:{0x10 + i:02x}:00.0",
            vendor_id=0x10DE,
            device_id=0x26B9,
            model="L40S",
            layout=SysfsInterface.MDEV,
            numa_node=i % 2,
            vgpus=tuple(
                Vgpu(
                    kind="mdev",
                    parent=f"0000:{0x10 + i:02x}:00.0",
                    uuid=str(uuidlib.UUID(int=i * 1000 + j + 1)),
                    type_id=1,
                    type_name="L40S-1Q",
                )
                for j in range(256)
            ),
        )
        for i in range(2)
    )
    server, client = serve()
    pool = build_pool(NodeSnapshot(node=NODE, gpus=gpus), catalog=CATALOG)
    SlicePublisher(client, NODE).publish(pool)
    objs = server.list(slices("v1"))
    assert server.server.rejected == []
    assert sorted(len(o["spec"]["devices"]) for o in objs) == [128] * 4
    assert len(_devices(objs)) == 512


def test_dra_requests_fail_like_every_other_cluster_request(mixed: NodeSnapshot) -> None:
    """An API server that does not answer is a transient cluster error naming the request,
    the same error the rest of the agent retries on (no DRA-only error type)."""
    from vgpu_state.kube.errors import ClusterUnreachableError
    from vgpu_state.model.errors import TransientError

    api = _client("http://127.0.0.1:9")  # the discard port: nothing listens
    api.timeout = (0.5, 0.5)
    publisher = SlicePublisher(api, NODE, version="v1")
    request = r"GET /apis/resource\.k8s\.io/v1/resourceslices"
    with pytest.raises(ClusterUnreachableError, match=request) as e:
        publisher.publish(build_pool(mixed, catalog=CATALOG))
    assert isinstance(e.value, TransientError)
    with pytest.raises(ClusterUnreachableError, match="resourceclaims"):
        KubeClaims(api, version="v1").list_claims()
