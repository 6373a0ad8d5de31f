"""SimHost: the directory-tree frontend read by the real scan, and driver operations through it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.model.errors import DeviceBusyError, TypeNotCreatableError
from vgpu_state.model.snapshot import Gpu, SysfsInterface
from vgpu_state.ports import HostPort
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import load_spec, parse_spec

CATALOG = default_catalog()

U_BUSY = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"
U_FREE = "c728e022-f16f-434b-ad2c-9665ee634d3d"
Factory = Callable[..., SimHost]


def test_every_example_spec_scans_cleanly(
    sim_spec_paths: list[Path], sim_host_factory: Factory
) -> None:
    assert {p.name for p in sim_spec_paths} >= {
        "a2-host.yaml", "t4-pair.yaml", "a16-board.yaml", "l40s-pair.yaml", "mixed.yaml",
    }  # fmt: skip
    for path in sim_spec_paths:
        host = sim_host_factory(path)
        assert isinstance(host, HostPort)
        snap = host.scan()
        spec = load_spec(path, catalog=CATALOG)
        assert snap.node == spec.node
        assert [g.address for g in snap.gpus] == sorted(g.address for g in spec.gpus)
        for gpu, g in zip(snap.gpus, sorted(spec.gpus, key=lambda g: g.address), strict=True):
            assert gpu.problems == (), (path, gpu.problems)
            assert gpu.model is not None
            assert len(gpu.vgpus) == len(g.vgpus)
            assert all(v.type_name for v in gpu.vgpus)


def test_a2_host_matches_the_capture(sim_host_factory: Factory, sim_spec_paths: list[Path]) -> None:
    path = next(p for p in sim_spec_paths if p.name == "a2-host.yaml")
    host = sim_host_factory(path)
    gpu = host.scan().gpus[0]
    assert (gpu.model, gpu.layout, gpu.sriov_numvfs, gpu.iommu_group) == (
        "A2", SysfsInterface.MDEV, 16, 38,
    )
    assert {(v.parent, v.type_name) for v in gpu.vgpus} == {
        ("0000:08:00.4", "A2-4C"), ("0000:08:02.0", "A2-4Q"), ("0000:08:00.6", "A2-4A"),
    }  # fmt: skip
    free = gpu.vf("0000:08:01.7")
    assert free is not None and [t.name for t in free.creatable] == ["A2-4Q", "A2-4A", "A2-4C"]
    root = Path(host.root)
    types = root / "bus/pci/devices/0000:08:01.7/mdev_supported_types"
    assert (types / "nvidia-746/name").read_text() == "NVIDIA A2-4Q\n"
    assert (types / "nvidia-746/description").read_text() == (
        "num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4\n"
    )
    assert (types / "nvidia-742/description").read_text().startswith("num_heads=4, frl_config=45,")
    assert (types / "nvidia-754/available_instances").read_text() == "1\n"
    assert (types / "nvidia-747/available_instances").read_text() == "0\n"
    assert os.stat(types / "nvidia-746/create").st_mode & 0o777 == 0o200
    assert os.readlink(root / "bus/pci/devices/0000:08:00.0/virtfn11") == "../0000:08:01.7"
    assert os.readlink(root / "bus/pci/devices/0000:08:00.4/physfn") == "../0000:08:00.0"
    mdev = root / f"bus/mdev/devices/{U_BUSY}"
    assert os.path.realpath(mdev / "mdev_type").endswith(
        "0000:08:00.4/mdev_supported_types/nvidia-754"
    )
    assert os.path.realpath(root / "class/mdev_bus/0000:08:00.4") == os.path.realpath(
        root / "bus/pci/devices/0000:08:00.4"
    )
    assert (root / "bus/pci/devices/0000:08:00.0/sriov_vf_device").read_text() == "25b6\n"
    assert (root / "bus/pci/devices/0000:08:00.0/class").read_text() == "0x030200\n"


def test_mdev_operations(sim_host_factory: Factory, sim_spec_paths: list[Path]) -> None:
    host = sim_host_factory(next(p for p in sim_spec_paths if p.name == "a2-host.yaml"))
    with pytest.raises(DeviceBusyError):
        host.remove_mdev(U_BUSY)
    host.remove_mdev(U_FREE)
    assert U_FREE not in {v.uuid for v in host.scan().gpus[0].vgpus}
    assert not os.path.lexists(Path(host.root) / "bus/mdev/devices" / U_FREE)
    with pytest.raises(TypeNotCreatableError):
        host.create_mdev("0000:08:02.0", 747, U_FREE)  # A2-8Q next to 4 GB vGPUs
    host.create_mdev("0000:08:02.0", 746, U_FREE)
    host.create_mdev("0000:08:01.7", 754, "0f0e0d0c-0b0a-4908-8706-050403020100")
    gpu = host.scan().gpus[0]
    assert all(vf.creatable == () for vf in gpu.vfs)  # 4 × 4 GB: the GPU is full


def test_vfio_operations_and_sriov(sim_host_factory: Factory) -> None:
    spec = parse_spec(
        "node: n\ndriver: {flavour: graphics}\n"
        'gpus: [{address: "0000:26:00.0", model: L40S, layout: vendor-vfio, sriov: false}]',
        catalog=CATALOG,
    )
    host = sim_host_factory(spec)
    assert host.scan().gpus[0].layout is SysfsInterface.SRIOV_DISABLED
    host.enable_sriov("0000:26:00.0")
    host.enable_sriov("0000:26:00.0")  # idempotent
    gpu = host.scan().gpus[0]
    assert gpu.layout is SysfsInterface.VENDOR_VFIO and len(gpu.vfs) == 32
    assert len(gpu.vfs[0].creatable) == 23
    host.set_vf_type(gpu.vfs[0].address, 1154)  # L40S-16Q, max 3
    gpu = host.scan().gpus[0]
    assert gpu.vgpus[0].type_name == "L40S-16Q" and gpu.vfs[0].current_type_id == 1154
    assert [t.name for t in gpu.vfs[1].creatable] == ["L40S-16Q", "L40S-16A"]
    with pytest.raises(TypeNotCreatableError):
        host.set_vf_type(gpu.vfs[1].address, 1150)
    host.clear_vf_type(gpu.vfs[0].address)
    host.disable_sriov("0000:26:00.0")
    assert host.scan().gpus[0].sriov_numvfs == 0


def test_sriov_numvfs_path_without_sriov_manage(sim_host_factory: Factory) -> None:
    spec = parse_spec(
        'sriov-manage: false\ngpus: [{address: "0000:08:00.0", model: A2, sriov: false}]',
        catalog=CATALOG,
    )
    host = sim_host_factory(spec)
    from vgpu_state.model.errors import InterfaceMissingError

    with pytest.raises(InterfaceMissingError):
        host.enable_sriov("0000:08:00.0")


def test_state_persists_through_the_spec(tmp_path: Path, sim_spec_paths: list[Path]) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(next(p for p in sim_spec_paths if p.name == "mixed.yaml").read_text())
    with SimHost(path) as host:
        host.remove_mdev("9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80")
        host.create_mdev("0000:3b:00.0", 232, U_FREE)
        host.set_vf_type("0000:81:00.5", 1153)
        before = host.scan()
        host.save()
    with SimHost(path) as again:
        after = again.scan()
    assert after.fingerprint() == before.fingerprint()
    # The kernel numbers an mdev's IOMMU group when the mdev is created, so a
    # reloaded node (like a rebooted one) may number them anew; all else persists.
    assert _without_mdev_groups(after.gpus) == _without_mdev_groups(before.gpus)
    assert {v.uuid for g in after.gpus for v in g.vgpus if v.kind == "mdev"} == {
        v.uuid for g in before.gpus for v in g.vgpus if v.kind == "mdev"
    }
    assert all(v.iommu_group is not None for g in after.gpus for v in g.vgpus)


def _without_mdev_groups(gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    return tuple(
        g.model_copy(
            update={
                "vgpus": tuple(
                    v.model_copy(update={"iommu_group": None}) if v.kind == "mdev" else v
                    for v in g.vgpus
                )
            }
        )
        for g in gpus
    )
