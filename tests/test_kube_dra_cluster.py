"""ResourceSlices and ResourceClaims on the real API server, as the agent.

The agent's DRA side writes through its ServiceAccount's token (bound to a Pod
on its Node) under the shipped RBAC of ``deploy/`` plus its DRA component; the
server's own ResourceSlice validation (device names, attributes, at most 128
devices a slice, the pool) checks every slice. ``tests/test_kube_dra.py`` keeps
the emulator for what this server cannot be: one that serves only
``resource.k8s.io/v1beta2`` (Kubernetes 1.33), or an unreachable one.
"""

from __future__ import annotations

import threading
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import ControlPlane
from vgpu_state.catalog import default_catalog
from vgpu_state.dra.slices import DRIVER, MDEV_UUID, PCI_BUS_ID, build_pool
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.dra import (
    KubeClaims,
    SlicePublisher,
    SliceResync,
    claims_in_use,
    resource_api_version,
)
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SysfsInterface, Vgpu
from vgpu_state.sim.host import SimHost

CATALOG = default_catalog()
MIXED = Path(__file__).resolve().parent.parent / "configs" / "sim" / "mixed.yaml"
NODE = "gpu-node-1"
SLICES = "resource.k8s.io/v1/resourceslices"
CLAIMS = "resource.k8s.io/v1/resourceclaims"


@pytest.fixture
def agent(cluster: ControlPlane, tmp_path: Path) -> KubeApi:
    """The API as the agent on NODE sees it."""
    cluster.ensure_node(NODE)
    token = cluster.agent_token(NODE)
    return KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "agent", token=token)))


@pytest.fixture
def mixed() -> NodeSnapshot:
    with SimHost(MIXED, in_memory=True) as host:
        return host.scan()


def _devices(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for o in objs for d in o["spec"]["devices"]}


def _ours(cluster: ControlPlane) -> list[dict[str, Any]]:
    return [o for o in cluster.list(SLICES) if o["spec"].get("nodeName") == NODE]


def test_the_agent_publishes_valid_slices_of_exactly_the_live_vgpus(
    cluster: ControlPlane, agent: KubeApi, mixed: NodeSnapshot
) -> None:
    assert resource_api_version(agent) == "v1"
    publisher = SlicePublisher(agent, NODE)
    result = publisher.publish(build_pool(mixed, catalog=CATALOG))
    assert result.generation == 1 and len(result.created) == 3
    objs = _ours(cluster)
    live = {v.key for g in mixed.gpus for v in g.vgpus}
    assert {
        d["attributes"].get(MDEV_UUID, d["attributes"].get(PCI_BUS_ID))["string"]
        for d in _devices(objs).values()
    } == live
    node = cluster.get("v1/nodes", NODE)
    assert node is not None
    for o in objs:
        assert o["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 3}
        assert o["spec"]["driver"] == DRIVER
        (owner,) = o["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "Node",
            NODE,
            node["metadata"]["uid"],
        )
    # Publishing the same pool writes nothing: the server's resource versions stay.
    versions = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in objs}
    assert publisher.publish(build_pool(mixed, catalog=CATALOG)).generation == 1
    assert {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in _ours(cluster)} == (
        versions
    )


def test_a_change_bumps_every_slice_and_drops_obsolete_ones(
    cluster: ControlPlane, agent: KubeApi, mixed: NodeSnapshot
) -> None:
    publisher = SlicePublisher(agent, NODE)
    publisher.publish(build_pool(mixed, catalog=CATALOG))
    fewer = build_pool(mixed, selected=lambda g, v: g.model != "Tesla T4", catalog=CATALOG)
    result = publisher.publish(fewer)
    assert result.generation == 2
    assert result.deleted == ("gpu-node-1-vgpu-0000-3b-00-0",)
    objs = _ours(cluster)
    assert len(objs) == 2
    assert {o["spec"]["pool"]["generation"] for o in objs} == {2}
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {2}


def test_slices_the_kubelet_deletes_come_back(
    cluster: ControlPlane, agent: KubeApi, mixed: NodeSnapshot
) -> None:
    publisher = SlicePublisher(agent, NODE)
    publisher.publish(build_pool(mixed, catalog=CATALOG))
    for o in _ours(cluster):  # the kubelet wipes the node's slices at its start
        cluster.delete(SLICES, o["metadata"]["name"])
    assert _ours(cluster) == []
    resync = SliceResync(publisher, interval=3600).start()
    try:
        done = threading.Event()
        original = publisher.sync

        def sync() -> Any:
            out = original()
            done.set()
            return out

        publisher.sync = sync  # type: ignore[method-assign]
        resync.wake()  # what a (re-)registration by the kubelet does
        assert done.wait(30)
    finally:
        resync.stop()
    objs = _ours(cluster)
    assert len(objs) == 3 and {o["spec"]["pool"]["generation"] for o in objs} == {2}


def test_shutdown_removes_only_this_nodes_slices(
    cluster: ControlPlane, agent: KubeApi, mixed: NodeSnapshot
) -> None:
    cluster.ensure_node("other-node")
    cluster.write(
        SLICES,
        "other-node-gpu",
        {
            "spec": {
                "driver": DRIVER,
                "nodeName": "other-node",
                "pool": {"name": "other-node", "generation": 4, "resourceSliceCount": 1},
                "devices": [],
            }
        },
    )
    publisher = SlicePublisher(agent, NODE)
    publisher.publish(build_pool(mixed, catalog=CATALOG))
    assert len(publisher.current()) == 3
    assert len(publisher.remove_all()) == 3
    assert [o["metadata"]["name"] for o in cluster.list(SLICES)] == ["other-node-gpu"]


def test_512_vgpus_fit_the_servers_limits(cluster: ControlPlane, agent: KubeApi) -> None:
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
    pool = build_pool(NodeSnapshot(node=NODE, gpus=gpus), catalog=CATALOG)
    SlicePublisher(agent, NODE).publish(pool)
    objs = _ours(cluster)
    assert sorted(len(o["spec"]["devices"]) for o in objs) == [128] * 4
    assert len(_devices(objs)) == 512


def _claim(
    cluster: ControlPlane,
    name: str,
    device: str,
    *,
    pool: str = NODE,
    driver: str = DRIVER,
    allocated: bool = True,
    pod: str | None = None,
) -> None:
    """A claim in namespace ``vms`` as the scheduler leaves it (allocation, reservedFor)."""
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {
                "results": [{"request": "gpu", "driver": driver, "pool": pool, "device": device}]
            }
        }
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": str(uuidlib.uuid4())}]
    body: dict[str, Any] = {
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    }
    if status:
        body["status"] = status
    cluster.write(CLAIMS, name, body, namespace="vms")


def test_claims_allocated_in_this_pool_hold_their_vgpus(
    cluster: ControlPlane, agent: KubeApi
) -> None:
    t4 = "mdev-9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"
    _claim(cluster, "win-gpu", t4, pod="virt-launcher-win-abcde")
    _claim(cluster, "render", "vf-0000-81-00-6")
    _claim(cluster, "elsewhere", t4, pool="other-node")
    _claim(cluster, "nvidia", "gpu-0", driver="gpu.nvidia.com")
    _claim(cluster, "pending", "vf-0000-08-00-5", allocated=False)
    source = KubeClaims(agent)
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
