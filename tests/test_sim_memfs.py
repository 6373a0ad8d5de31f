"""The simulator's in-memory file system gives the scan exactly what the directory tree does."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.sim.host import SimHost

REPO = Path(__file__).resolve().parent.parent
SPECS = sorted((REPO / "configs" / "sim").glob("*.yaml"))


def same(a: NodeSnapshot, b: NodeSnapshot) -> None:
    assert a.model_copy(update={"sysfs_root": ""}) == b.model_copy(update={"sysfs_root": ""})


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_in_memory_scan_equals_directory_scan(
    spec: Path, sim_host_factory: Callable[..., SimHost]
) -> None:
    on_disk = sim_host_factory(spec)
    in_memory = SimHost(spec, in_memory=True)
    same(on_disk.scan(), in_memory.scan())


def test_writes_and_errors_match(sim_host_factory: Callable[..., SimHost]) -> None:
    spec = REPO / "configs" / "sim" / "a2-host.yaml"
    disk, mem = sim_host_factory(spec), SimHost(spec, in_memory=True)
    for host in (disk, mem):
        host.remove_mdev("c728e022-f16f-434b-ad2c-9665ee634d3d")
        host.create_mdev("0000:08:00.5", 746, "11111111-2222-4333-8444-555555555555")
    same(disk.scan(), mem.scan())
    for host in (disk, mem):
        with pytest.raises(OSError) as err:
            host.write("bus/mdev/devices/f715f63c-0d00-4007-9c5a-b07b0c6c05de/remove", "1")
        assert err.value.errno == errno.EBUSY


def test_memory_filesystem_calls_behave_like_the_os() -> None:
    host = SimHost(REPO / "configs" / "sim" / "l40s-pair.yaml", in_memory=True)
    fs = host._fs
    assert fs is not None
    root = host.root
    vf = f"{root}/bus/pci/devices/0000:26:00.4"
    assert fs.readlink(f"{vf}/physfn") == "../0000:26:00.0"
    assert fs.lexists(f"{vf}/physfn") and fs.exists(f"{vf}/nvidia/current_vgpu_type")
    assert "creatable_vgpu_types" in fs.listdir(f"{vf}/nvidia")
    free = f"{root}/bus/pci/devices/0000:26:04.3"  # the last VF holds no vGPU
    assert fs.read(f"{free}/nvidia/current_vgpu_type") == b"0\n"
    with pytest.raises(OSError) as err:
        fs.read(f"{free}/nvidia/gpu_instance_id")
    assert err.value.errno == errno.ENXIO
    with pytest.raises(FileNotFoundError):
        fs.read(f"{root}/bus/pci/devices/0000:99:00.0/vendor")


def test_incremental_render_equals_a_full_render() -> None:
    from vgpu_state.sim.tree import render

    host = SimHost(REPO / "configs" / "sim" / "mixed.yaml", in_memory=True)
    host.remove_mdev("9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80")
    host.create_mdev("0000:3b:00.0", 232, "11111111-2222-4333-8444-555555555555")
    host.set_vf_type("0000:81:00.4", 1153)
    incremental, full = host.sysfs.tree, render(host.sysfs.driver)
    assert incremental.entries == full.entries
    assert {d: sorted(c) for d, c in incremental.children.items()} == {
        d: sorted(c) for d, c in full.children.items()
    }
