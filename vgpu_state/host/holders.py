"""Which processes hold a vGPU's VFIO device open, read from ``/proc``.

A VM's QEMU opens its vGPU through VFIO: the group node ``/dev/vfio/<iommu
group>`` (the mdev's or the VF's ``iommu_group``) or, with iommufd, the device's
cdev ``/dev/vfio/devices/vfioN``. Every open file of a process is a symlink
under ``/proc/<pid>/fd``, so the open VFIO nodes tell which vGPUs are in use
even when the kubelet knows nothing of them (a VM started by hand, a kubelet
that is down). QEMU names its guest with ``-name guest=<name>,...``; the holder
says so.

An open file counts when its path is ``/dev/vfio/<group>`` or
``/dev/vfio/devices/vfioN`` (``/proc`` shows a file as its process sees it, so
a QEMU in a container shows these paths too), or the same below the node's own
sysfs root in :data:`SIM_VFIO_DIR`, where the FUSE-mounted simulator serves a
simulated node's VFIO nodes. Another simulated node's nodes (another mount,
with the same group numbers) never count.

Only reads (``listdir``, ``readlink``, ``read``) through a
:class:`~vgpu_state.host.reader.Filesystem`, so the same code reads the real
``/proc`` (``proc_root``, e.g. ``/host/proc`` in a container) and the
simulator's.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from vgpu_state.host.reader import Filesystem, OsFilesystem
from vgpu_state.model.errors import Reason, UserError
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


VFIO_DIR = "/dev/vfio/"
SIM_VFIO_DIR = ".vgpu-sim/dev/vfio"
"""Where a simulated node serves its VFIO nodes, below its sysfs root."""


def vfio_tail(path: str, sysfs_root: str | None = None) -> str | None:
    """The part of an open file's path after ``/dev/vfio/`` (``12``, ``devices/vfio7``),
    or after ``<sysfs_root>/.vgpu-sim/dev/vfio/``; ``None`` when it is no VFIO node."""
    prefixes = [VFIO_DIR]
    if sysfs_root:
        prefixes.append(os.path.join(sysfs_root, SIM_VFIO_DIR, ""))
    for prefix in prefixes:
        if path.startswith(prefix):
            return path[len(prefix) :] or None
    return None


def vfio_nodes(
    snapshot: NodeSnapshot, sysfs_root: str = "/sys", fs: Filesystem | None = None
) -> dict[str, str]:
    """VFIO device node path (``/dev/vfio/…``) -> vGPU key, for every vGPU of the snapshot."""
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


@dataclass
class ProcScan:
    """What one read of ``/proc`` found."""

    held: dict[str, ProcessHolder] = field(default_factory=dict)
    """vGPU key -> the process holding its VFIO device open (the lowest pid if several)."""
    unreadable: int = 0
    """Processes whose open files could not be listed (not permitted)."""


def scan_holders(
    snapshot: NodeSnapshot,
    proc_root: str = "/proc",
    *,
    sysfs_root: str | None = None,
    proc_fs: Filesystem | None = None,
    sysfs_fs: Filesystem | None = None,
) -> ProcScan:
    """Every process under ``proc_root`` with a VFIO node of a vGPU of ``snapshot`` open.

    ``/proc`` is read first; sysfs (the vGPUs' IOMMU groups) only when some
    process has a VFIO node open at all.
    """
    fs = proc_fs or OsFilesystem()
    found = ProcScan()
    root = os.path.realpath(sysfs_root or snapshot.sysfs_root)
    opened: dict[int, set[str]] = {}
    pids = sorted(int(p) for p in _listdir(fs, proc_root) if p.isdigit())
    for pid in pids:
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = fs.listdir(fd_dir)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                found.unreadable += 1
            continue  # gone meanwhile (a kernel thread has no fd to show)
        for fd in fds:
            try:
                target = fs.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue  # closed meanwhile, or not ours to read
            tail = vfio_tail(target, root)
            if tail is not None and tail != "vfio":  # /dev/vfio/vfio is the container
                opened.setdefault(pid, set()).add(tail)
    if not opened:
        return found
    nodes = {
        node[len(VFIO_DIR) :]: key for node, key in vfio_nodes(snapshot, root, sysfs_fs).items()
    }
    for pid, tails in opened.items():
        keys = {nodes[t] for t in tails if t in nodes}
        if not keys:
            continue
        holder = _describe(fs, os.path.join(proc_root, str(pid)), pid)
        for key in keys:
            found.held.setdefault(key, holder)
    return found


class NotProcError(UserError):
    """A directory given as the host's ``/proc`` does not look like one: reading holders
    there would find none, and every held vGPU would look free."""

    default_reason = Reason.INPUT_INVALID


PROC_ENTRIES_CHECKED = 64
"""How many numeric entries :func:`check_proc_root` looks at for a ``cmdline``."""


def check_proc_root(proc_root: str) -> None:
    """Raise :class:`NotProcError` naming ``proc_root`` unless it looks like a ``/proc``:
    a directory with a process directory (a number) holding a ``cmdline``.

    A mistyped path (``/host/prc``) or an empty directory would otherwise turn holder
    detection off without a word: no process found, every vGPU free.
    """
    what = "it must be the host's /proc (processes holding vGPUs are read there)"
    try:
        names = os.listdir(proc_root)
    except FileNotFoundError:
        raise NotProcError(f"{proc_root}: no such directory; {what}") from None
    except NotADirectoryError:
        raise NotProcError(f"{proc_root}: not a directory; {what}") from None
    except OSError as e:
        raise NotProcError(f"{proc_root}: cannot be read: {e.strerror or e}; {what}") from None
    pids = [name for name in names if name.isdigit()][:PROC_ENTRIES_CHECKED]
    if not any(os.path.isfile(os.path.join(proc_root, pid, "cmdline")) for pid in pids):
        raise NotProcError(
            f"{proc_root}: not a /proc: no process directory (a number with a cmdline) "
            f"in it; {what}"
        )


class ProcHolders:
    """The ``processes`` port of a reconcile: holders read from a ``/proc`` now.

    ``proc_root`` is the host's ``/proc`` (``/host/proc`` in a container);
    ``proc_fs``/``sysfs_fs`` read another tree (a simulated node's).
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        sysfs_root: str | None = None,
        proc_fs: Filesystem | None = None,
        sysfs_fs: Filesystem | None = None,
    ) -> None:
        self.proc_root = proc_root
        self.sysfs_root = sysfs_root
        self.proc_fs = proc_fs
        self.sysfs_fs = sysfs_fs

    def holders(self, snapshot: NodeSnapshot) -> tuple[Mapping[str, str], tuple[str, ...]]:
        """vGPU key -> who holds it (pid, command, VM name), and what could not be read."""
        found = scan_holders(
            snapshot,
            self.proc_root,
            sysfs_root=self.sysfs_root,
            proc_fs=self.proc_fs,
            sysfs_fs=self.sysfs_fs,
        )
        warnings: tuple[str, ...] = ()
        if found.unreadable:
            warnings = (
                f"the open files of {found.unreadable} process(es) under {self.proc_root} "
                "cannot be read (run as root): a VM among them holding a vGPU is not seen",
            )
        return {key: str(holder) for key, holder in found.held.items()}, warnings


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
