"""The scan never raises on a strange tree; it records problems instead."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.host import scan, scan_with_stats
from vgpu_state.model.snapshot import SysfsInterface
from vgpu_state.sim.dirtree import materialize
from vgpu_state.sim.driver_model import SimDriver
from vgpu_state.sim.spec import parse_spec
from vgpu_state.sim.tree import render

CATALOG = default_catalog()

SPEC = """
node: n
gpus:
  - {address: "0000:08:00.0", model: A2, vgpus: [{type: A2-2Q, vf: 1}]}
  - {address: "0000:3b:00.0", model: T4}
  - {address: "0000:26:00.0", model: L40S, layout: vendor-vfio, vgpus: [{type: L40S-8Q, vf: 0}]}
"""


def _tree(fast_tmp_path: Path, text: str = SPEC) -> Path:
    root = fast_tmp_path / "sys"
    materialize(render(SimDriver(parse_spec(text, catalog=CATALOG), catalog=CATALOG)), str(root))
    return root


def test_missing_root_is_a_node_problem(fast_tmp_path: Path) -> None:
    snap = scan(str(fast_tmp_path / "nothing"), catalog=CATALOG)
    assert snap.gpus == () and "not found" in snap.problems[0]


def test_missing_optional_files(fast_tmp_path: Path) -> None:
    root = _tree(fast_tmp_path)
    pf = root / "bus/pci/devices/0000:08:00.0"
    for name in ("numa_node", "subsystem_vendor", "subsystem_device", "iommu_group", "driver"):
        os.unlink(pf / name)
    gpu = scan(str(root), catalog=CATALOG).gpus[0]
    assert gpu.numa_node is None and gpu.iommu_group is None and gpu.driver is None
    assert gpu.layout is SysfsInterface.UNAVAILABLE and "not bound" in gpu.layout_reason
    assert gpu.model is None and any("catalog" in p for p in gpu.problems)


def test_broken_symlinks_are_problems(fast_tmp_path: Path) -> None:
    root = _tree(fast_tmp_path)
    vf = root / "bus/pci/devices/0000:08:00.4"
    os.unlink(vf / "iommu_group")
    os.symlink("../../../../kernel/iommu_groups/9999", vf / "iommu_group")
    os.symlink("../0000:ff:00.0", root / "bus/pci/devices/0000:08:00.0/virtfn99")
    os.symlink("../../../devices/gone", root / "bus/pci/devices/0000:ff:1f.7")
    snap = scan(str(root), catalog=CATALOG)
    gpu = snap.gpu("0000:08:00.0")
    assert gpu is not None
    assert gpu.vfs[0].iommu_group is None
    assert any("broken symlink" in p for p in gpu.problems)
    assert len(gpu.vfs) == 16


def test_unreadable_files_and_enxio(fast_tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(fast_tmp_path)
    real_read = os.read
    bad: dict[int, int] = {}
    real_open = os.open

    def fake_open(path: str, flags: int, *a: int) -> int:
        fd = real_open(path, flags, *a)
        if path.endswith(("numa_node", "creatable_vgpu_types")):
            bad[fd] = errno.EIO if path.endswith("numa_node") else errno.ENXIO
        return fd

    def fake_read(fd: int, n: int) -> bytes:
        if fd in bad:
            code = bad.pop(fd)
            raise OSError(code, os.strerror(code))
        return real_read(fd, n)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "read", fake_read)
    snap = scan(str(root), catalog=CATALOG)
    l40s = snap.gpu("0000:26:00.0")
    assert l40s is not None and l40s.layout is SysfsInterface.VENDOR_VFIO
    assert l40s.numa_node is None
    assert any("Input/output error" in p for p in l40s.problems)
    assert any("No such device or address" in p for p in l40s.problems)
    # The vGPU type name still resolves through the catalog.
    assert l40s.vgpus[0].type_name == "L40S-8Q"


def test_garbage_values(fast_tmp_path: Path) -> None:
    root = _tree(fast_tmp_path)
    pf = root / "bus/pci/devices/0000:3b:00.0"
    os.chmod(pf / "numa_node", 0o644)
    (pf / "numa_node").write_text("banana\n")
    (root / "bus/pci/devices/0000:08:00.0/nvidia-junk").mkdir()
    gpu = scan(str(root), catalog=CATALOG).gpu("0000:3b:00.0")
    assert gpu is not None and gpu.numa_node is None
    assert any("not a number" in p for p in gpu.problems)


def test_many_unrelated_devices_are_skipped_cheaply(fast_tmp_path: Path) -> None:
    text = SPEC + "extra-pci-devices: 2000\n"
    root = _tree(fast_tmp_path, text)
    snap, stats = scan_with_stats(str(root), catalog=CATALOG)
    assert [g.address for g in snap.gpus] == ["0000:08:00.0", "0000:26:00.0", "0000:3b:00.0"]
    assert [g.index for g in snap.gpus] == [0, 1, 2]
    _, small_stats = scan_with_stats(str(_tree(fast_tmp_path / "b")), catalog=CATALOG)
    # Each unrelated device costs exactly one read (its vendor file).
    assert stats.files_read - small_stats.files_read == 2000


def test_nvidia_non_gpu_functions_and_vfs_are_not_gpus(fast_tmp_path: Path) -> None:
    root = _tree(fast_tmp_path)
    audio = root / "devices/pci0000:00/0000:3b:00.1"
    audio.mkdir(parents=True)
    (audio / "vendor").write_text("0x10de\n")
    (audio / "class").write_text("0x040300\n")
    os.symlink("../../../devices/pci0000:00/0000:3b:00.1", root / "bus/pci/devices/0000:3b:00.1")
    snap = scan(str(root), catalog=CATALOG)
    assert len(snap.gpus) == 3


def test_layout_detection(fast_tmp_path: Path) -> None:
    text = """
gpus:
  - {address: "0000:08:00.0", model: A2, sriov: false}
  - {address: "0000:09:00.0", model: A2, driver: vfio-pci}
  - {address: "0000:3b:00.0", model: T4}
"""
    root = _tree(fast_tmp_path, text)
    snap = scan(str(root), catalog=CATALOG)
    layouts = [(g.address, g.layout) for g in snap.gpus]
    assert layouts == [
        ("0000:08:00.0", SysfsInterface.SRIOV_DISABLED),
        ("0000:09:00.0", SysfsInterface.UNAVAILABLE),
        ("0000:3b:00.0", SysfsInterface.MDEV),
    ]
    assert "vfio-pci" in snap.gpus[1].layout_reason
    # VFs enabled but the driver offers no vGPU interface (data-centre driver).
    vfio = root / "bus/pci/devices/0000:3b:00.0/mdev_supported_types"
    import shutil

    shutil.rmtree(vfio)
    gpu = scan(str(root), catalog=CATALOG).gpus[2]
    assert gpu.layout is SysfsInterface.UNAVAILABLE and "vGPU Manager" in gpu.layout_reason


def test_a_gpu_or_vf_not_named_by_a_pci_address_is_skipped(fast_tmp_path: Path) -> None:
    root = _tree(fast_tmp_path)
    devices = root / "bus/pci/devices"
    os.rename(devices / "0000:3b:00.0", devices / "0000:3B:00.0")
    (Path(os.path.realpath(devices / "0000:08:00.0")).parent / "not-a-vf").mkdir()
    os.symlink("../not-a-vf", devices / "0000:08:00.0/virtfn98")
    snap = scan(str(root), catalog=CATALOG)
    assert [g.address for g in snap.gpus] == ["0000:08:00.0", "0000:26:00.0"]
    assert any("0000:3B:00.0: not a PCI address; this GPU is skipped" in p for p in snap.problems)
    a2 = snap.gpus[0]
    assert len(a2.vfs) == 16
    assert any("virtfn98 -> not-a-vf: not a PCI address; VF skipped" in p for p in a2.problems)
