"""A hand-built tree of the A2 capture (reference §2.2, §3.1) scans to the expected snapshot."""

from __future__ import annotations

import os
from pathlib import Path

from vgpu_state.catalog import default_catalog
from vgpu_state.host import scan
from vgpu_state.model.pci import vf_address
from vgpu_state.model.snapshot import SysfsInterface

CATALOG = default_catalog()

PF = "0000:08:00.0"
BRIDGE = "devices/pci0000:00/0000:00:03.0"
TYPES = [
    (742, "A2-1B", 1024, "B"), (743, "A2-2B", 2048, "B"), (744, "A2-1Q", 1024, "Q"),
    (745, "A2-2Q", 2048, "Q"), (746, "A2-4Q", 4096, "Q"), (747, "A2-8Q", 8192, "Q"),
    (748, "A2-16Q", 16384, "Q"), (749, "A2-1A", 1024, "A"), (750, "A2-2A", 2048, "A"),
    (751, "A2-4A", 4096, "A"), (752, "A2-8A", 8192, "A"), (753, "A2-16A", 16384, "A"),
    (754, "A2-4C", 4096, "C"), (755, "A2-8C", 8192, "C"), (756, "A2-16C", 16384, "C"),
]  # fmt: skip
MDEVS = {
    "0000:08:00.4": ("f715f63c-0d00-4007-9c5a-b07b0c6c05de", 754, 106),
    "0000:08:02.0": ("c728e022-f16f-434b-ad2c-9665ee634d3d", 746, 107),
    "0000:08:00.6": ("3deab9a4-200a-4c54-99b1-5eb0722d1d81", 751, 108),
}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def build_a2_capture(root: Path) -> None:
    (root / "bus/pci/drivers/nvidia").mkdir(parents=True)
    (root / "bus/mdev/drivers/nvidia-vgpu-vfio").mkdir(parents=True)
    pf = root / BRIDGE / PF
    for name, value in [
        ("class", "0x030200\n"), ("device", "0x25b6\n"), ("vendor", "0x10de\n"),
        ("subsystem_vendor", "0x10de\n"), ("subsystem_device", "0x157e\n"), ("numa_node", "0\n"),
        ("reset_method", "flr bus\n"), ("sriov_drivers_autoprobe", "1\n"),
        ("sriov_numvfs", "16\n"), ("sriov_offset", "4\n"), ("sriov_stride", "1\n"),
        ("sriov_totalvfs", "16\n"), ("sriov_vf_device", "25b6\n"), ("sriov_vf_total_msix", "0\n"),
    ]:  # fmt: skip
        _write(pf / name, value)
    _link(pf / "driver", "../../../../bus/pci/drivers/nvidia")
    (root / "kernel/iommu_groups/38").mkdir(parents=True)
    _link(pf / "iommu_group", "../../../../kernel/iommu_groups/38")
    _link(root / "bus/pci/devices" / PF, f"../../../{BRIDGE}/{PF}")
    for i in range(16):
        addr = vf_address(PF, 4, 1, i)
        vf = root / BRIDGE / addr
        _link(pf / f"virtfn{i}", f"../{addr}")
        for name, value in [
            ("class", "0x030200\n"), ("device", "0x25b6\n"), ("vendor", "0x10de\n"),
            ("subsystem_vendor", "0x10de\n"), ("subsystem_device", "0x0000\n"),
            ("irq", "0\n"), ("reset_method", "flr\n"), ("numa_node", "0\n"),
        ]:  # fmt: skip
            _write(vf / name, value)
        _link(vf / "driver", "../../../../bus/pci/drivers/nvidia")
        (root / f"kernel/iommu_groups/{90 + i}").mkdir(parents=True)
        _link(vf / "iommu_group", f"../../../../kernel/iommu_groups/{90 + i}")
        _link(vf / "physfn", f"../{PF}")
        _link(root / "bus/pci/devices" / addr, f"../../../{BRIDGE}/{addr}")
        _link(root / "class/mdev_bus" / addr, f"../../{BRIDGE}/{addr}")
        busy = addr in MDEVS
        for type_id, name, fb, _series in TYPES:
            d = vf / "mdev_supported_types" / f"nvidia-{type_id}"
            available = 1 if (fb == 4096 and not busy) else 0
            _write(d / "name", f"NVIDIA {name}\n")
            _write(d / "available_instances", f"{available}\n")
            _write(d / "device_api", "vfio-pci\n")
            _write(d / "description", f"framebuffer={fb}M, max_instance={16384 // fb}\n")
            (d / "devices").mkdir()
        if busy:
            uuid, type_id, group = MDEVS[addr]
            m = vf / uuid
            m.mkdir()
            _link(m / "driver", "../../../../../bus/mdev/drivers/nvidia-vgpu-vfio")
            (root / f"kernel/iommu_groups/{group}").mkdir(parents=True)
            _link(m / "iommu_group", f"../../../../../kernel/iommu_groups/{group}")
            _link(m / "mdev_type", f"../mdev_supported_types/nvidia-{type_id}")
            _write(m / "nvidia/vgpu_params", "\n")
            _write(m / "nvidia/vm_name", "\n")
            _link(root / "bus/mdev/devices" / uuid, f"../../../{BRIDGE}/{addr}/{uuid}")


def test_a2_capture_scans_to_the_expected_snapshot(fast_tmp_path: Path) -> None:
    build_a2_capture(fast_tmp_path)
    snap = scan(str(fast_tmp_path), "a2-node", catalog=CATALOG)
    assert snap.problems == ()
    assert len(snap.gpus) == 1
    gpu = snap.gpus[0]
    assert (gpu.index, gpu.address, gpu.model, gpu.driver) == (0, PF, "A2", "nvidia")
    assert (gpu.device_id, gpu.subsystem_device_id, gpu.vendor_id) == (0x25B6, 0x157E, 0x10DE)
    assert (gpu.numa_node, gpu.iommu_group) == (0, 38)
    assert (gpu.sriov_totalvfs, gpu.sriov_numvfs) == (16, 16)
    assert gpu.layout is SysfsInterface.MDEV
    assert gpu.problems == ()
    assert [vf.address for vf in gpu.vfs][:5] == [
        "0000:08:00.4", "0000:08:00.5", "0000:08:00.6", "0000:08:00.7", "0000:08:01.0",
    ]  # fmt: skip
    assert gpu.vfs[11].address == "0000:08:01.7" and gpu.vfs[15].address == "0000:08:02.3"
    assert [vf.iommu_group for vf in gpu.vfs] == list(range(90, 106))
    vgpus = {(v.uuid, v.parent, v.type_id, v.type_name, v.kind) for v in gpu.vgpus}
    assert vgpus == {
        ("f715f63c-0d00-4007-9c5a-b07b0c6c05de", "0000:08:00.4", 754, "A2-4C", "mdev"),
        ("c728e022-f16f-434b-ad2c-9665ee634d3d", "0000:08:02.0", 746, "A2-4Q", "mdev"),
        ("3deab9a4-200a-4c54-99b1-5eb0722d1d81", "0000:08:00.6", 751, "A2-4A", "mdev"),
    }
    free = gpu.vf("0000:08:01.7")
    assert free is not None
    assert [(t.type_id, t.name, t.available) for t in free.creatable] == [
        (746, "A2-4Q", 1), (751, "A2-4A", 1), (754, "A2-4C", 1),
    ]  # fmt: skip
    busy = gpu.vf("0000:08:00.4")
    assert busy is not None and busy.creatable == ()
    assert gpu.pf_creatable == ()


def test_mdev_type_name_falls_back_to_catalog_when_type_dir_unreadable(fast_tmp_path: Path) -> None:
    build_a2_capture(fast_tmp_path)
    (fast_tmp_path / BRIDGE / "0000:08:00.4/mdev_supported_types/nvidia-754/name").unlink()
    gpu = scan(str(fast_tmp_path), catalog=CATALOG).gpus[0]
    found = [v for v in gpu.vgpus if v.parent == "0000:08:00.4"]
    assert found[0].type_id == 754 and found[0].type_name == "A2-4C"
