"""The node's ResourceSlice pool, built from a scan of a simulated node."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.dra.slices import (
    DRIVER,
    MAX_DEVICES_PER_SLICE,
    MDEV_UUID,
    NUMA_NODE,
    PCI_BUS_ID,
    build_pool,
    device_key,
    device_name,
    is_dns_label,
)
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SysfsInterface, Vgpu
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import parse_spec

CATALOG = default_catalog()

MIXED = Path(__file__).resolve().parent.parent / "configs" / "sim" / "mixed.yaml"


@pytest.fixture
def mixed() -> NodeSnapshot:
    with SimHost(MIXED, in_memory=True) as host:
        return host.scan()


def test_one_device_per_live_vgpu_with_the_attributes_kubevirt_reads(mixed: NodeSnapshot) -> None:
    pool = build_pool(mixed, catalog=CATALOG)
    live = {v.key: (g, v) for g in mixed.gpus for v in g.vgpus}
    assert len(live) == 4
    assert {d.key for d in pool.devices.values()} == set(live)
    assert pool.problems == ()
    for d in pool.devices.values():
        g, v = live[d.key]
        assert is_dns_label(d.name) and device_key(d.name) == v.key
        assert d.attributes["vgpuType"] == v.type_name
        assert d.attributes["parentPciBusID"] == g.address
        assert d.attributes["productName"] == g.model
        assert d.attributes[NUMA_NODE] == g.numa_node
        if v.kind == "mdev":
            assert d.attributes[MDEV_UUID] == v.uuid and PCI_BUS_ID not in d.attributes
        else:
            assert d.attributes[PCI_BUS_ID] == v.parent and MDEV_UUID not in d.attributes
    vf = pool.devices["vf-0000-81-00-6"]
    assert vf.attributes["series"] == "Q" and vf.attributes["framebufferMiB"] == 12288
    assert vf.capacity == {"framebuffer": "12Gi"}
    t4 = pool.devices["mdev-9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"]
    assert t4.attributes["mdevUUID"] == "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"
    assert t4.attributes["vgpuType"] == "T4-8C" and t4.attributes["series"] == "C"


def test_manifests_are_valid_v1_slices_of_one_pool(mixed: NodeSnapshot) -> None:
    manifests = build_pool(mixed, catalog=CATALOG).manifests(generation=7, api_version="v1")
    assert len(manifests) == 3  # one per GPU that has vGPUs
    names = [m["metadata"]["name"] for m in manifests]
    assert len(set(names)) == 3 and all(n.startswith("gpu-node-1-vgpu-") for n in names)
    for m in manifests:
        assert m["apiVersion"] == "resource.k8s.io/v1" and m["kind"] == "ResourceSlice"
        spec = m["spec"]
        assert spec["driver"] == DRIVER and spec["nodeName"] == "gpu-node-1"
        assert spec["pool"] == {"name": "gpu-node-1", "generation": 7, "resourceSliceCount": 3}
        for dev in spec["devices"]:
            for value in dev["attributes"].values():
                assert len(value) == 1 and next(iter(value)) in ("string", "int", "bool")
    vf_slice = next(m for m in manifests if m["metadata"]["name"].endswith("81-00-0"))
    (dev,) = vf_slice["spec"]["devices"]
    assert dev["attributes"][PCI_BUS_ID] == {"string": "0000:81:00.6"}
    assert dev["capacity"] == {"framebuffer": {"value": "12Gi"}}


def test_only_the_vgpus_chosen_for_dra_are_published(mixed: NodeSnapshot) -> None:
    pool = build_pool(mixed, selected=lambda g, v: g.model == "L40S", catalog=CATALOG)
    assert list(pool.devices) == ["vf-0000-81-00-6"]
    assert [s.gpu for s in pool.slices] == ["0000:81:00.0"]


def _big_gpu(count: int, model: str | None = "A2") -> Gpu:
    return Gpu(
        index=0,
        address="0000:41:00.0",
        vendor_id=0x10DE,
        device_id=0x25B6,
        model=model,
        layout=SysfsInterface.MDEV,
        numa_node=-1,
        vgpus=tuple(
            Vgpu(
                kind="mdev",
                parent="0000:41:00.0",
                uuid=str(uuid.UUID(int=i + 1)),
                type_id=746,
                type_name="A2-4Q",
            )
            for i in range(count)
        ),
    )


def test_a_slice_never_holds_more_devices_than_the_api_allows() -> None:
    snapshot = NodeSnapshot(node="big", gpus=(_big_gpu(300),))
    pool = build_pool(snapshot, catalog=CATALOG)
    assert [len(s.devices) for s in pool.slices] == [128, 128, 44]
    assert max(len(s.devices) for s in pool.slices) <= MAX_DEVICES_PER_SLICE
    assert len({s.name for s in pool.slices}) == 3
    assert len(pool.devices) == 300
    manifests = pool.manifests(1, "v1beta2")
    assert {m["spec"]["pool"]["resourceSliceCount"] for m in manifests} == {3}
    assert manifests[0]["apiVersion"] == "resource.k8s.io/v1beta2"
    # NUMA node -1 means "unknown": the attribute is left out, not published as -1.
    assert all(NUMA_NODE not in d.attributes for d in pool.devices.values())


def test_values_over_the_api_limit_are_left_out_and_reported() -> None:
    long_model = "NVIDIA Hypothetical Accelerator With A Very Long Marketing Name 96GB"
    snapshot = NodeSnapshot(node="n", gpus=(_big_gpu(1, model=long_model),))
    pool = build_pool(snapshot, catalog=CATALOG)
    (dev,) = pool.devices.values()
    assert "productName" not in dev.attributes
    assert len(pool.problems) == 1 and "productName" in pool.problems[0]
    assert "longer than 64" in pool.problems[0]


def test_device_names_map_back_to_vgpu_keys() -> None:
    vf = Vgpu(kind="vf", parent="0000:c1:01.7", type_id=1)
    assert device_name(vf) == "vf-0000-c1-01-7" and device_key("vf-0000-c1-01-7") == "0000:c1:01.7"
    md = Vgpu(kind="mdev", parent="0000:41:00.0", uuid="F715F63C-0D00-4007-9C5A-B07B0C6C05DE")
    assert device_name(md) == "mdev-f715f63c-0d00-4007-9c5a-b07b0c6c05de"
    assert device_key("gpu-0") is None and device_key("mdev-nope") is None


def test_a_pool_needs_a_node_name() -> None:
    with pytest.raises(ValueError, match="node name"):
        build_pool(NodeSnapshot(node="", gpus=(_big_gpu(1),)), catalog=CATALOG)


def test_mig_backed_vgpus_are_published_with_their_gpu_instance() -> None:
    spec = Path(__file__).resolve().parent.parent / "configs" / "sim" / "rtx-pro-6000.yaml"
    text = spec.read_text().replace(
        "    vgpus:\n      - {type: DC-24Q, vf: 0}\n      - {type: DC-24Q, vf: 1}\n",
        "    mig-mode: true\n    gpu-instances: [1g.24gb, 1g.24gb]\n    vgpus:\n"
        "      - {type: DC-1-24Q, vf: 0}\n      - {type: DC-1-24Q, vf: 1}\n",
    )
    with SimHost(parse_spec(text, "node.yaml", catalog=CATALOG), in_memory=True) as host:
        snapshot = host.scan()
    pool = build_pool(snapshot, catalog=CATALOG)
    assert pool.problems == ()
    found = sorted(
        (d.attributes["vgpuType"], d.attributes["gpuInstanceID"], d.capacity["framebuffer"])
        for d in pool.devices.values()
    )
    assert found == [("DC-1-24Q", 1, "24Gi"), ("DC-1-24Q", 2, "24Gi")]
