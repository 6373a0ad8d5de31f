"""In-use from the host: processes holding a vGPU's VFIO device open, read from /proc.

The simulator serves a /proc with a QEMU process per vGPU its spec marks in
use; the real reader finds them, in memory and as files on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.host.holders import ProcessHolder, qemu_guest_name, scan_holders, vfio_nodes
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.proc import open_proc
from vgpu_state.sim.spec import parse_spec

CATALOG = default_catalog()

SPEC = """
node: n1
gpus:
  - address: "0000:08:00.0"
    model: A2
    layout: mdev
    vgpus:
      - {type: A2-4C, uuid: f715f63c-0d00-4007-9c5a-b07b0c6c05de, vf: 0, in-use: "vm default/win-1"}
      - {type: A2-4C, vf: 1}
  - address: "0000:3b:00.0"
    model: T4
    vgpus:
      - {type: T4-8C, uuid: 9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80, in-use: "vm lab/cad"}
  - address: "0000:81:00.0"
    model: L40S
    layout: vendor-vfio
    vgpus:
      - {type: L40S-12Q, vf: 0, in-use: "vm ml/a"}
      - {type: L40S-12Q, vf: 1, in-use: "vm ml/b"}
      - {type: L40S-12Q, vf: 2}
"""

EXPECTED = {
    "f715f63c-0d00-4007-9c5a-b07b0c6c05de": "default_win-1",
    "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80": "lab_cad",
    "0000:81:00.4": "ml_a",  # through the VF's group node
    "0000:81:00.5": "ml_b",  # through the VF's iommufd cdev
}


def find_holders(snapshot: NodeSnapshot, proc_root: str, **kw: Any) -> dict[str, ProcessHolder]:
    """vGPU key -> the process holding its VFIO device open (the lowest pid if several)."""
    return scan_holders(snapshot, proc_root, **kw).held


@pytest.mark.parametrize("on_disk", [False, True], ids=["in-memory", "directory"])
def test_reader_finds_the_processes_the_spec_marks(on_disk: bool, tmp_path: Path) -> None:
    spec = parse_spec(SPEC, catalog=CATALOG)
    if on_disk:
        host = SimHost(spec, tmp_path / "sys")
        proc_root, proc_fs = open_proc(host, str(tmp_path / "proc"))
        assert (tmp_path / "proc" / "4000" / "fd").is_dir()
    else:
        host = SimHost(spec, in_memory=True)
        proc_root, proc_fs = open_proc(host)
    snapshot = host.scan()
    held = find_holders(
        snapshot, proc_root, sysfs_root=host.root, proc_fs=proc_fs, sysfs_fs=host.filesystem
    )
    assert {k: h.guest for k, h in held.items()} == EXPECTED
    assert all(h.command == "qemu-kvm" for h in held.values())
    assert str(held["0000:81:00.4"]).startswith("VM ml_a (process 40")
    host.close()


def test_vfio_nodes_cover_group_and_cdev(tmp_path: Path) -> None:
    host = SimHost(parse_spec(SPEC, catalog=CATALOG), in_memory=True)
    nodes = vfio_nodes(host.scan(), host.root, host.filesystem)
    # The L40S is the third GPU: its VFs are in groups 228 + index (the spec default).
    assert nodes["/dev/vfio/devices/vfio229"] == "0000:81:00.5"
    assert nodes["/dev/vfio/229"] == "0000:81:00.5"
    assert nodes["/dev/vfio/260"] == "f715f63c-0d00-4007-9c5a-b07b0c6c05de"  # the mdev's own
    assert "/dev/vfio/vfio" not in nodes  # the container node is shared by every VFIO user


def test_a_vgpu_nobody_holds_is_free(tmp_path: Path) -> None:
    host = SimHost(
        parse_spec(SPEC.replace(', in-use: "vm lab/cad"', ""), catalog=CATALOG), in_memory=True
    )
    proc_root, proc_fs = open_proc(host)
    held = find_holders(
        host.scan(), proc_root, sysfs_root=host.root, proc_fs=proc_fs, sysfs_fs=host.filesystem
    )
    assert "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80" not in held
    assert len(held) == 3


def test_unreadable_processes_are_skipped(tmp_path: Path) -> None:
    """A process that exits between listdir and readlink, or an fd dir we may not read."""
    host = SimHost(parse_spec(SPEC, catalog=CATALOG), in_memory=True)
    proc_root, proc_fs = open_proc(host)

    class Flaky:
        def __init__(self) -> None:
            self.inner = proc_fs

        def read(self, path: str) -> bytes:
            return self.inner.read(path)

        def readlink(self, path: str) -> str:
            if "/4000/" in path:
                raise FileNotFoundError(path)
            return self.inner.readlink(path)

        def listdir(self, path: str) -> list[str]:
            if path.endswith("/4001/fd"):
                raise PermissionError(path)
            return (
                [*self.inner.listdir(path), "self"]
                if path == proc_root
                else self.inner.listdir(path)
            )

        def exists(self, path: str) -> bool:
            return self.inner.exists(path)

        def lexists(self, path: str) -> bool:
            return self.inner.lexists(path)

    held = find_holders(
        host.scan(), proc_root, sysfs_root=host.root, proc_fs=Flaky(), sysfs_fs=host.filesystem
    )
    assert len(held) == 2


@pytest.mark.parametrize(
    ("argv", "guest"),
    [
        (["qemu-kvm", "-name", "guest=default_win-1,debug-threads=on"], "default_win-1"),
        (["qemu-system-x86_64", "-name", "plain-vm"], "plain-vm"),
        (["qemu-system-x86_64", "-name", "guest=a,,b,debug-threads=on"], "a,b"),
        (["qemu-system-x86_64", "-m", "4096"], None),
        (["qemu-system-x86_64", "-name"], None),
    ],
)
def test_qemu_guest_names(argv: list[str], guest: str | None) -> None:
    assert qemu_guest_name(argv) == guest


def test_holder_text() -> None:
    assert str(ProcessHolder(42, "qemu-kvm", "default_win-1")) == (
        "VM default_win-1 (process 42, qemu-kvm)"
    )
    assert str(ProcessHolder(7, "python3")) == "process 7 (python3)"
