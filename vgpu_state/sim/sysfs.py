"""The simulated sysfs: the driver model plus its rendered tree, read and written by path."""

from __future__ import annotations

import contextlib
import errno
import threading
import time

from vgpu_state.catalog import Catalog
from vgpu_state.sim.driver_model import SimDriver
from vgpu_state.sim.spec import NodeSpec
from vgpu_state.sim.tree import Dir, Entry, File, Link, Renderer, Tree, WriteTarget


def _op_kind(target: WriteTarget, data: bytes) -> str:
    if target.kind == "create":
        return "create"
    if target.kind == "remove":
        return "remove"
    if target.kind == "current_vgpu_type":
        return "clear-type" if data.strip() in (b"0", b"") else "set-type"
    if target.kind == "nvidia-smi":
        return "nvidia-smi"
    return "sriov"


class SimSysfs:
    """Thread-safe access to a simulated node by sysfs path (relative to the root).

    ``write`` applies the driver's reaction and re-renders the tree before it
    returns, so every later read sees the new state (the driver updates
    ``available_instances`` synchronously). Only the GPUs the write changed are
    rendered again: a write costs the same on a node of any size.
    """

    def __init__(self, spec: NodeSpec, catalog: Catalog) -> None:
        self.initial = spec
        self.catalog = catalog
        self.driver = SimDriver(spec, catalog)
        self.lock = threading.RLock()
        self._changes: set[str] | None = None
        self._all_changed = False
        self.renderer = Renderer()
        self.tree: Tree = self.renderer.render(self.driver)
        self.driver.take_changed()
        self.generation = 0
        self._opened: dict[int, tuple[str, int]] = {}
        self._next_handle = 1

    def open_vfio(self, path: str, pid: int) -> int | None:
        """A process opens the file at ``path``: when it is a vGPU's VFIO node, that
        vGPU is held by ``pid`` until :meth:`close_vfio` of the handle returned."""
        with self.lock:
            e = self.entry(path)
            if not isinstance(e, File) or e.write is None or e.write.kind != "vfio":
                return None
            handle = self._next_handle
            self._next_handle += 1
            self._opened[handle] = (e.write.device, pid)
            self.driver.vfio_open.setdefault(e.write.device, []).append(pid)
            return handle

    def close_vfio(self, handle: int) -> None:
        with self.lock:
            opened = self._opened.pop(handle, None)
            if opened is None:
                return
            key, pid = opened
            pids = self.driver.vfio_open.get(key, [])
            if pid in pids:
                pids.remove(pid)
            if not pids:
                self.driver.vfio_open.pop(key, None)

    def entry(self, path: str) -> Entry | None:
        real = self.tree.resolve(path)
        return None if real is None else self.tree.entries.get(real)

    def read(self, path: str) -> bytes:
        with self.lock:
            e = self.entry(path)
            if e is None:
                raise OSError(errno.ENOENT, "No such file or directory")
            if isinstance(e, Dir):
                raise OSError(errno.EISDIR, "Is a directory")
            if isinstance(e, Link):
                raise OSError(errno.EINVAL, "is a symlink")
            if e.content is None:
                raise OSError(errno.EACCES, "write-only attribute")
            if e.read_errno is not None:
                raise OSError(e.read_errno, "no vGPU on this device")
            return e.content

    def replay(self, writes: list[tuple[str, bytes]]) -> None:
        """Make ``writes`` again, in order, as they were made (refused ones refused
        again), without the delays of injected faults."""
        for path, data in writes:
            with contextlib.suppress(OSError):
                self.write(path, data, delay=False)

    def write(self, path: str, data: bytes, *, delay: bool = True) -> None:
        """One ``write(2)`` of ``data`` to the attribute at ``path``."""
        rel = path.strip("/")
        with self.lock:
            e = self.entry(rel)
            if e is None:
                raise OSError(errno.ENOENT, "No such file or directory")
            if not isinstance(e, File) or e.write is None:
                raise OSError(errno.EACCES, "read-only attribute")
            target = e.write
            if target.kind == "vfio":
                raise OSError(errno.EINVAL, "a VFIO group is used through ioctls")
            if target.kind == "reset":
                self.reset()
                return
            effect = self.driver.fault_for(_op_kind(target, data), self.tree.resolve(rel) or rel)
        if effect.delay_seconds and delay:
            time.sleep(effect.delay_seconds)
        with self.lock:
            if effect.errno is not None:
                raise OSError(effect.errno, "injected fault")
            try:
                self._dispatch(target, data)
            finally:
                changed = self.driver.take_changed()
                node = target.kind in ("sriov-manage", "nvidia-smi")  # output: node-wide files
                self.tree = self.renderer.render(self.driver, changed, node=node)
                self.generation += 1

    def reset(self) -> None:
        """Back to the spec this node was loaded from: vGPUs, SR-IOV and fault counters."""
        with self.lock:
            opened = self.driver.vfio_open
            self.driver = SimDriver(self.initial, self.catalog)
            self.driver.vfio_open = opened  # a reset closes no process's files
            self.renderer = Renderer(self._changes)
            self.tree = self.renderer.render(self.driver)
            self.driver.take_changed()
            self._all_changed = True
            self.generation += 1

    def track_changes(self) -> None:
        """Remember, from now on, which paths each write adds, replaces or removes
        (for a copy of the tree kept elsewhere; see :meth:`take_changes`)."""
        with self.lock:
            if self._changes is None:
                self._changes = set()
                self.renderer.changes = self._changes

    def take_changes(self) -> set[str] | None:
        """The paths changed since the last call (after :meth:`track_changes`), or
        ``None`` when any path may have changed (a reset, or no tracking)."""
        with self.lock:
            if self._changes is None or self._all_changed:
                self._all_changed = False
                if self._changes is not None:
                    self._changes.clear()
                return None
            changed = set(self._changes)
            self._changes.clear()
            return changed

    def _dispatch(self, target: WriteTarget, data: bytes) -> None:
        d = self.driver
        if target.kind == "create":
            d.mdev_create(target.device, target.type_id, data)
        elif target.kind == "remove":
            d.mdev_remove(target.device, data)
        elif target.kind == "current_vgpu_type":
            d.vf_type_write(target.device, data)
        elif target.kind == "sriov_numvfs":
            d.sriov_numvfs_write(target.device, data)
        elif target.kind == "sriov-manage":
            status, output = d.sriov_manage(data.decode("ascii", "replace"))
            d.sriov_manage_output = output
            if status != 0:
                raise OSError(errno.EBUSY if "unbindLock" in output else errno.ENODEV, output)
        elif target.kind == "nvidia-smi":
            # The exit status goes to a file of its own, as a process's would: the
            # write itself succeeds whatever the command answers.
            words = data.decode("utf-8", "replace").split()
            d.nvidia_smi_status, d.nvidia_smi_output = d.nvidia_smi(words)
        else:
            raise OSError(errno.EACCES, "read-only attribute")

    def to_spec(self) -> NodeSpec:
        with self.lock:
            return self.driver.to_spec()
