"""Which processes hold a vGPU's VFIO device open, read from ``/proc``.

A VM's QEMU opens its vGPU through VFIO: the group node ``/dev/vfio/<iommu
group>`` (the mdev's or the VF's ``iommu_group``) or, with iommufd, the device's
cdev ``/dev/vfio/devices/vfioN``. Every open file of a process is a symlink
under ``/proc/<pid>/fd``, so the open VFIO nodes tell which vGPUs are in use
even when the kubelet knows nothing of them (a VM started by hand, a kubelet
that is down). QEMU names its guest with ``-name guest=<name>,...``; the holder
says so.

Only reads (``listdir``, ``readlink``, ``read``) through a
:class:`~vgpu_state.host.reader.Filesystem`, so the same code reads the real
``/proc`` (``proc_root``, e.g. ``/host/proc`` in a container) and the
simulator's.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from vgpu_state.host.reader import Filesystem, OsFilesystem
from vgpu_state.model.snapshot import NodeSnapshot


@dataclass(frozen=True, order=True)
class ProcessHolder:
    pid: int
    command: str
    guest: str | None = None

    def __str__(self) -> str:
        if self.guest:
            return f"VM {self.guest} (process {self.pid}, {self.command})"
        return f"process {self.pid} ({self.command})"


def vfio_nodes(
    snapshot: NodeSnapshot, sysfs_root: str = "/sys", fs: Filesystem | None = None
) -> dict[str, str]:
    """VFIO device node path -> vGPU key, for every vGPU of the snapshot."""
    fs = fs or OsFilesystem()
    nodes: dict[str, str] = {}
    for gpu in snapshot.gpus:
        for v in gpu.vgpus:
            if v.kind == "mdev" and v.uuid is not None:
                device = os.path.join(sysfs_root, "bus", "mdev", "devices", v.uuid)
                group = _group(fs, device)
            else:
                device = os.path.join(sysfs_root, "bus", "pci", "devices", v.parent)
                vf = gpu.vf(v.parent)
                group = vf.iommu_group if vf is not None and vf.iommu_group is not None else None
                if group is None:
                    group = _group(fs, device)
            if group is not None:
                nodes[f"/dev/vfio/{group}"] = v.key
            for cdev in _listdir(fs, os.path.join(device, "vfio-dev")):
                nodes[f"/dev/vfio/devices/{cdev}"] = v.key
    return nodes


def find_holders(
    snapshot: NodeSnapshot,
    proc_root: str = "/proc",
    *,
    sysfs_root: str | None = None,
    proc_fs: Filesystem | None = None,
    sysfs_fs: Filesystem | None = None,
) -> dict[str, ProcessHolder]:
    """vGPU key -> the process holding its VFIO device open (the lowest pid if several)."""
    nodes = vfio_nodes(snapshot, sysfs_root or snapshot.sysfs_root, sysfs_fs)
    if not nodes:
        return {}
    fs = proc_fs or OsFilesystem()
    held: dict[str, ProcessHolder] = {}
    pids = sorted(int(p) for p in _listdir(fs, proc_root) if p.isdigit())
    for pid in pids:
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        keys: set[str] = set()
        for fd in _listdir(fs, fd_dir):
            try:
                target = fs.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue  # closed meanwhile, or not ours to read
            key = nodes.get(target)
            if key is not None:
                keys.add(key)
        if not keys:
            continue
        holder = _describe(fs, os.path.join(proc_root, str(pid)), pid)
        for key in keys:
            held.setdefault(key, holder)
    return held


def _describe(fs: Filesystem, path: str, pid: int) -> ProcessHolder:
    argv: list[str] = []
    with contextlib.suppress(OSError):
        argv = [
            a.decode("utf-8", "replace")
            for a in fs.read(os.path.join(path, "cmdline")).split(b"\0")
        ]
    argv = [a for a in argv if a]
    command = os.path.basename(argv[0]) if argv else ""
    if not command:
        try:
            command = fs.read(os.path.join(path, "comm")).decode("utf-8", "replace").strip()
        except OSError:
            command = "?"
    return ProcessHolder(pid, command, qemu_guest_name(argv))


def qemu_guest_name(argv: list[str]) -> str | None:
    """The guest name of a QEMU command line (``-name guest=NAME,...`` or ``-name NAME``)."""
    for i, arg in enumerate(argv):
        if arg in ("-name", "--name") and i + 1 < len(argv):
            value = argv[i + 1]
            for part in _split_options(value):
                if part.startswith("guest="):
                    return part[len("guest=") :] or None
            first = _split_options(value)[0] if value else ""
            return first if first and "=" not in first else None
    return None


def _split_options(value: str) -> list[str]:
    """QEMU option syntax: comma-separated, ``,,`` is a literal comma."""
    parts: list[str] = []
    current = ""
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "," and i + 1 < len(value) and value[i + 1] == ",":
            current += ","
            i += 2
            continue
        if ch == ",":
            parts.append(current)
            current = ""
        else:
            current += ch
        i += 1
    parts.append(current)
    return parts


def _group(fs: Filesystem, device: str) -> int | None:
    try:
        name = os.path.basename(fs.readlink(os.path.join(device, "iommu_group")).rstrip("/"))
    except OSError:
        return None
    return int(name) if name.isdigit() else None


def _listdir(fs: Filesystem, path: str) -> list[str]:
    try:
        return fs.listdir(path)
    except OSError:
        return []
