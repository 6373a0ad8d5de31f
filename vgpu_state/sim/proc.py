"""The simulated node's ``/proc``: a QEMU process for every vGPU the spec marks in use.

Each held vGPU gets a process whose open files (``fd/N`` symlinks) include
``/dev/vfio/vfio`` and the vGPU's VFIO group node ``/dev/vfio/<iommu group>``
(and its iommufd cdev ``/dev/vfio/devices/vfioN`` where the simulated sysfs
has one), and whose ``cmdline`` names the guest as libvirt does
(``-name guest=<namespace>_<vm>,debug-threads=on``). Processes that hold no
vGPU (an init, a shell) are there too, so a reader must tell them apart.
``vgpu_state.host.holders`` reads this tree exactly as it reads a real ``/proc``.
"""

from __future__ import annotations

import errno
import posixpath
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vgpu_state.host.holders import ProcHolders
from vgpu_state.host.reader import Filesystem, OsFilesystem
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.sim.dirtree import materialize
from vgpu_state.sim.driver_model import SimDriver
from vgpu_state.sim.tree import Dir, File, Link, Tree

if TYPE_CHECKING:
    from vgpu_state.sim.host import SimHost

FIRST_PID = 4000


def guest_name(holder: str) -> str:
    """libvirt's domain name for a holder text: ``vm default/win-1`` -> ``default_win-1``."""
    text = holder.strip()
    for prefix in ("vm ", "VM ", "pod "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text.replace("/", "_").replace(" ", "_") or "guest"


def render_proc(drv: SimDriver) -> Tree:
    t = Tree()
    t.add("", Dir())
    _process(t, 1, ["/sbin/init"], "systemd", ["/dev/null", "/dev/console"])
    _process(t, 77, ["/bin/bash"], "bash", ["/dev/pts/0", "/dev/pts/0", "/dev/pts/0"])
    pid = FIRST_PID
    for g in drv.gpus:
        vfs = g.vf_addresses()
        for v in g.vgpus:
            if not v.in_use:
                continue
            files = ["/dev/null", "/dev/kvm", "/dev/vfio/vfio"]
            if v.uuid is not None:
                files.append(f"/dev/vfio/{v.iommu_group}")  # the mdev's own group
            elif v.vf is not None:
                # A vendor-VFIO vGPU is its VF: QEMU opens the VF's group, or with
                # iommufd the VF's cdev (odd VFs here, to cover both).
                group = g.vf_iommu_group_base + v.vf
                files.append(f"/dev/vfio/devices/vfio{group}" if v.vf % 2 else f"/dev/vfio/{group}")
            guest = guest_name(v.in_use)
            argv = [
                "/usr/libexec/qemu-kvm",
                "-name",
                f"guest={guest},debug-threads=on",
                "-machine",
                "pc-q35-rhel9.2.0,usb=off",
                "-device",
                f"vfio-pci,host={v.uuid or vfs[v.vf or 0]},id=ua-gpu-vgpu0",
            ]
            _process(t, pid, argv, "qemu-kvm", files)
            pid += 1
    return t


def _process(t: Tree, pid: int, argv: list[str], comm: str, files: list[str]) -> None:
    base = str(pid)
    t.add(base, Dir())
    t.add(f"{base}/cmdline", File(("\0".join(argv) + "\0").encode()))
    t.add(f"{base}/comm", File(f"{comm}\n".encode()))
    t.add(f"{base}/fd", Dir())
    for n, target in enumerate(files):
        t.add(f"{base}/fd/{n}", Link(target))


class ProcFilesystem:
    """A rendered proc :class:`Tree` as a read-only :class:`~vgpu_state.host.reader.Filesystem`.

    Paths are absolute under ``root``; fd links are returned as written (absolute
    targets outside the tree), as the kernel's ``readlink`` on ``/proc`` does.
    """

    def __init__(self, tree: Tree, root: str) -> None:
        self.tree = tree
        self.root = root.rstrip("/") or "/"

    def _rel(self, path: str) -> str:
        rel = posixpath.relpath(path, self.root)
        if rel == ".":
            return ""
        if rel.startswith(".."):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return rel

    def read(self, path: str) -> bytes:
        entry = self.tree.entries.get(self._rel(path))
        if entry is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if not isinstance(entry, File) or entry.content is None:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
        return entry.content

    def readlink(self, path: str) -> str:
        entry = self.tree.entries.get(self._rel(path))
        if entry is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if not isinstance(entry, Link):
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return entry.target

    def listdir(self, path: str) -> list[str]:
        rel = self._rel(path)
        if not isinstance(self.tree.entries.get(rel), Dir):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return list(self.tree.children.get(rel, ()))

    def exists(self, path: str) -> bool:
        try:
            return self._rel(path) in self.tree.entries
        except FileNotFoundError:
            return False

    def lexists(self, path: str) -> bool:
        return self.exists(path)


def open_proc(host: SimHost, root: str | None = None) -> tuple[str, Filesystem]:
    """The simulated node's ``/proc`` now: ``(proc root, how to read it)``.

    With ``root``, the tree is written there as real directories, files and
    symlinks (a new, empty directory); without, it is served from memory.
    """
    tree = render_proc(host.sysfs.driver)
    if root is None:
        return "/sim/proc", ProcFilesystem(tree, "/sim/proc")
    materialize(tree, root)
    return root, OsFilesystem()


class SimProcHolders:
    """The ``processes`` port of a simulated node: its ``/proc``, rendered at every read."""

    def __init__(self, host: SimHost) -> None:
        self.host = host

    def holders(self, snapshot: NodeSnapshot) -> tuple[Mapping[str, str], tuple[str, ...]]:
        root, fs = open_proc(self.host)
        reader = ProcHolders(
            root, sysfs_root=self.host.root, proc_fs=fs, sysfs_fs=self.host.filesystem
        )
        return reader.holders(snapshot)
