"""What the plugin advertises and answers, as values: inventory, Allocate, packing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu_state.deviceplugin.allocation import (
    AllocationError,
    UnknownDevicesError,
    allocate,
    preferred,
)
from vgpu_state.deviceplugin.inventory import Device, ResourceInventory, inventory
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SysfsInterface, Vgpu

R = "nvidia.com/NVIDIA_A16-4Q"


def dev(i: str, gpu: str, group: int | None = 10, cdev: str | None = None) -> Device:
    return Device(i, "mdev", gpu, 0, group, cdev, 1, "/sys")


def board(per_gpu: int, gpus: int) -> ResourceInventory:
    return ResourceInventory(
        R, tuple(dev(f"g{g}-{n}", f"gpu{g}") for g in range(gpus) for n in range(per_gpu))
    )


def test_inventory_groups_vgpus_by_resource_and_skips_illegal_names() -> None:
    full, pf = "NVIDIA A16-4Q", "0000:41:00.0"
    vgpus = (
        Vgpu(kind="mdev", parent=pf, uuid="u2", type_name="A16-4Q", type_sysfs_name=full),
        Vgpu(kind="mdev", parent=pf, uuid="u1", type_name="A16-4Q", type_sysfs_name=full),
        Vgpu(kind="vf", parent="0000:41:00.4", type_name="A16-2Q"),
        Vgpu(kind="mdev", parent=pf, uuid="u3", type_name="bad name-"),
        Vgpu(kind="mdev", parent=pf, uuid="u4"),
    )  # fmt: skip
    gpu = Gpu(index=0, address=pf, vendor_id=0x10DE, device_id=1, numa_node=1,
              layout=SysfsInterface.MDEV, vgpus=vgpus)  # fmt: skip
    inv = inventory(NodeSnapshot(gpus=(gpu,)))
    assert list(inv.resources) == ["nvidia.com/A16-2Q", R]
    assert [d.id for d in inv.resources[R].devices] == ["u1", "u2"]
    assert inv.resources["nvidia.com/A16-2Q"].devices[0].kind == "vf"
    assert {d.numa_node for r in inv.resources.values() for d in r.devices} == {1}
    assert len(inv.problems) == 2
    assert "'bad name-'" in inv.problems[0] and "u4 has no type name" in inv.problems[1]


def test_allocate_env_and_nodes_deduplicated() -> None:
    inv = ResourceInventory(R, (dev("u1", "a", 5), dev("u2", "a", 5, "vfio7")))
    got = allocate(inv, ["u2", "u1"], iommufd=False)
    assert got.envs == {"MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A16-4Q": "u2,u1"}
    assert got.device_nodes == ("/dev/vfio/vfio", "/dev/vfio/5")
    with_fd = allocate(inv, ["u2"], iommufd=True)
    assert with_fd.device_nodes[-2:] == ("/dev/iommu", "/dev/vfio/devices/vfio7")


def test_allocate_refuses_unknown_ids_and_missing_groups() -> None:
    inv = ResourceInventory(R, (dev("u1", "a"), dev("u2", "a", None)))
    with pytest.raises(UnknownDevicesError, match="x9, x8") as info:
        allocate(inv, ["u1", "x9", "x8"], iommufd=False)
    assert info.value.ids == ("x9", "x8")
    with pytest.raises(AllocationError, match="no IOMMU group known for u2"):
        allocate(inv, ["u2"], iommufd=False)


def test_preferred_packs_onto_the_fullest_gpu() -> None:
    inv = board(per_gpu=4, gpus=3)
    # gpu0 holds 1, gpu1 holds 3, gpu2 is empty.
    allocated = {"g0-0", "g1-0", "g1-1", "g1-2"}
    available = [d.id for d in inv.devices if d.id not in allocated]
    assert preferred(inv, available, [], 1) == ["g1-3"]
    assert preferred(inv, available, [], 3) == ["g1-3", "g0-1", "g0-2"]


def test_preferred_prefers_the_tighter_gpu_on_a_tie_and_keeps_must_include() -> None:
    inv = ResourceInventory(R, (*board(2, 1).devices, *board(4, 2).devices[4:]))
    available = ["g0-0", "g0-1", "g1-0", "g1-1", "g1-2", "g1-3"]
    assert preferred(inv, available, [], 1) == ["g0-0"]
    assert preferred(inv, available, ["g1-2"], 2) == ["g1-2", "g1-0"]
    assert preferred(inv, ["zz", "g0-0"], [], 2) == ["g0-0", "zz"]


@given(
    st.sets(st.integers(0, 23)),
    st.integers(0, 30),
    st.sets(st.integers(0, 23), max_size=3),
)
def test_preferred_answers_a_valid_choice(free: set[int], size: int, must: set[int]) -> None:
    inv = board(per_gpu=8, gpus=3)
    ids = [d.id for d in inv.devices]
    available = [ids[i] for i in sorted(free | must)]
    must_ids = [ids[i] for i in sorted(must)]
    got = preferred(inv, available, must_ids, size)
    assert len(got) == len(set(got)) == min(size, len(available))
    assert set(got) <= set(available)
    if size >= len(must_ids):
        assert set(must_ids) <= set(got)
