"""``SimHost``: a :class:`~vgpu_state.ports.HostPort` backed by the simulator.

Driver operations take the same paths and values as on a real host (the
functions of :mod:`vgpu_state.host.driver`), but the write lands in the
simulated driver, which then re-renders the changed parts of the directory
tree; :meth:`SimHost.scan` is the real :func:`vgpu_state.host.scan` of that tree.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from vgpu_state.catalog import Catalog, default_catalog
from vgpu_state.host import driver
from vgpu_state.host.nvidia_smi import ModeOperations, NvidiaSmi, modes_or_problem
from vgpu_state.host.paths import SysfsPaths
from vgpu_state.host.reader import Filesystem, OsFilesystem
from vgpu_state.host.scan import ModesReader, scan, scan_gpu
from vgpu_state.model.errors import InterfaceMissingError
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.sim.dirtree import materialize
from vgpu_state.sim.memfs import MemoryFilesystem
from vgpu_state.sim.spec import NodeSpec, save_spec
from vgpu_state.sim.sysfs import SimSysfs
from vgpu_state.sim.tree import NVIDIA_SMI_CONTROL, SRIOV_MANAGE_CONTROL, Entry
from vgpu_state.sim.writelog import WriteLog, load_node
from vgpu_state.statefiles.drivertypes import DriverTypeMemory


def _temp_root() -> str:
    """A fresh directory, in memory (``/dev/shm``) when possible, like sysfs itself."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="vgpu-sim-", dir=base)


class SimHost(ModeOperations):
    """A simulated node rendered as a directory tree under ``root``.

    ``spec``: a :class:`NodeSpec` or the path of a spec file (then :meth:`save`
    without an argument writes back to it). ``root``: where to write the tree;
    a new, empty directory; a temporary one under ``/dev/shm`` (removed by
    :meth:`close`) when omitted.

    ``in_memory``: write no tree at all; :meth:`scan` walks the simulated sysfs
    in memory through the same file system calls, and writes go straight to the
    simulated driver. The CLI's ``--sim`` uses this; the directory tree is for
    tools that read the files themselves.

    ``catalog``: the GPU models the simulated driver knows (the packaged
    catalog when omitted: a simulated node is an entry point of its own).

    ``driver_types``: what the simulated driver listed, remembered from scan to
    scan as on a real host (see :class:`~vgpu_state.host.SysfsHost`).

    A spec file is read with the writes its write log holds (a process killed
    before it saved; see :mod:`vgpu_state.sim.writelog`). ``autosave`` (with a
    spec file): append every write to that log as it is made, so the file and
    its log always hold every change; :meth:`save` writes the spec once and
    ends the log. A log found at start is continued (nothing is written before
    the first write), and :meth:`save` folds it into the spec with the rest.
    """

    def __init__(
        self,
        spec: NodeSpec | str | Path,
        root: str | Path | None = None,
        *,
        in_memory: bool = False,
        autosave: bool = False,
        catalog: Catalog | None = None,
        driver_types: DriverTypeMemory | None = None,
    ) -> None:
        self.catalog = catalog if catalog is not None else default_catalog()
        self.driver_types = driver_types if driver_types is not None else DriverTypeMemory()
        self._log: WriteLog | None = None
        if isinstance(spec, NodeSpec):
            self.spec_path: Path | None = None
            loaded = spec
        else:
            self.spec_path = Path(spec)
            loaded, data, log = load_node(self.spec_path, self.catalog)
            if autosave:
                # Writes a killed process logged are part of the node now: this
                # host's writes follow them in the same log until it saves.
                self._log = WriteLog(self.spec_path, data, log)
        self.sysfs = SimSysfs(loaded, self.catalog)
        self.in_memory = in_memory
        self.autosave = self._log is not None
        self._own_root = root is None and not in_memory
        self._rendered: dict[str, Entry] = {}
        """What the directory tree under ``root`` holds (entries by path)."""
        self._rendered_generation = self.sysfs.generation
        if in_memory:
            self.root = str(root) if root is not None else "/sim/sys"
            self._fs: MemoryFilesystem | None = MemoryFilesystem(self.sysfs, self.root)
            return
        self._fs = None
        self.root = str(root) if root is not None else _temp_root()
        if not self._own_root and os.path.exists(self.root) and os.listdir(self.root):
            raise ValueError(f"{self.root} is not empty; SimHost writes a whole sysfs tree there")
        self.sysfs.track_changes()
        materialize(self.sysfs.tree, self.root)
        self._rendered = dict(self.sysfs.tree.entries)
        self.sysfs.take_changes()

    @property
    def filesystem(self) -> Filesystem:
        """How the tree at :attr:`root` is read: in memory, or the real file system."""
        return self._fs if self._fs is not None else OsFilesystem()

    @property
    def node(self) -> str:
        return self.sysfs.driver.node

    # nvidia-smi ----------------------------------------------------------------
    @property
    def nvidia_smi(self) -> NvidiaSmi | None:
        """The node's nvidia-smi (the stand-in, in-process) when its spec says it has one."""
        if not self.sysfs.driver.nvidia_smi_installed:
            return None
        return NvidiaSmi(self._run_nvidia_smi, "nvidia-smi (simulated)")

    def _run_nvidia_smi(self, args: Sequence[str]) -> tuple[int, str]:
        """The stand-in's answer to ``nvidia-smi ARGS``. A read (``-q``, ``-lgi``) is
        answered directly; anything else is a write to the control file, so it lands
        in the write log (``autosave``) in order with the sysfs writes."""
        words = [str(a) for a in args]
        if "-q" in words or "-lgi" in words:
            with self.sysfs.lock:
                return self.sysfs.driver.nvidia_smi(words)
        if any(not w or any(c.isspace() for c in w) for w in words):
            return 2, "nvidia-smi (simulated): arguments may not be empty or hold spaces"
        self.write(NVIDIA_SMI_CONTROL, " ".join(words))
        with self.sysfs.lock:
            d = self.sysfs.driver
            return d.nvidia_smi_status, d.nvidia_smi_output

    def _modes(self) -> ModesReader | None:
        tool = self.nvidia_smi
        if tool is None:
            return None
        return lambda pf: modes_or_problem(tool, pf)

    def _tool(self, operation: str, pf: str) -> NvidiaSmi:
        SysfsPaths(self.root).device(operation, pf)
        tool = self.nvidia_smi
        if tool is None:
            raise InterfaceMissingError(
                operation, "nvidia-smi", pf, errno.ENOENT, "the simulated node has no nvidia-smi"
            )
        return tool

    # HostPort ------------------------------------------------------------------
    def scan(self) -> NodeSnapshot:
        return self.driver_types.observe(
            scan(self.root, self.node, self._fs, catalog=self.catalog, modes=self._modes())
        )

    def scan_gpu(self, address: str) -> NodeSnapshot:
        part = scan_gpu(
            self.root, self.node, address, self._fs, catalog=self.catalog, modes=self._modes()
        )
        return self.driver_types.observe(part)

    def enable_sriov(self, pf: str) -> None:
        self._sriov("-e", pf)

    def disable_sriov(self, pf: str) -> None:
        self._sriov("-d", pf)

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None:
        driver.create_mdev(self.root, parent, type_id, uuid, self._writer)

    def remove_mdev(self, uuid: str) -> None:
        driver.remove_mdev(self.root, uuid, self._writer)

    def set_vf_type(self, vf: str, type_id: int) -> None:
        driver.set_vf_type(self.root, vf, type_id, self._writer)

    def clear_vf_type(self, vf: str) -> None:
        driver.clear_vf_type(self.root, vf, self._writer)

    # raw access ----------------------------------------------------------------
    def write(self, path: str, value: str | bytes) -> None:
        """One write to ``path`` (absolute under ``root`` or relative to it); raises ``OSError``."""
        rel = os.path.relpath(path, self.root) if os.path.isabs(path) else path
        data = value.encode() if isinstance(value, str) else value
        try:
            self.sysfs.write(rel, data)
        except OSError:
            self._logged(rel, data)
            raise
        else:
            self._logged(rel, data)
        finally:
            self._refresh()

    def _logged(self, rel: str, data: bytes) -> None:
        """With ``autosave``, keep the write in the spec's write log (see :meth:`save`)."""
        if self._log is not None:
            self._log.append(rel, data)

    @property
    def unsaved_writes(self) -> int:
        """Writes kept only in the spec's write log (``autosave``), not yet in the spec."""
        return self._log.count if self._log is not None else 0

    def _writer(self, path: str, value: str) -> None:
        self.write(path, value)

    def _sriov(self, flag: str, pf: str) -> None:
        if self.sysfs.driver.sriov_manage_installed:
            control = os.path.join(self.root, SRIOV_MANAGE_CONTROL)
            op = "sriov-enable" if flag == "-e" else "sriov-disable"
            SysfsPaths(self.root).device(op, pf)
            driver.write_attribute(op, control, f"{flag} {pf}", self._writer)
        elif flag == "-e":
            driver.enable_sriov(self.root, pf, None, self._writer)
        else:
            driver.disable_sriov(self.root, pf, None, self._writer)

    def _refresh(self) -> None:
        if self.in_memory:
            return
        if self.sysfs.generation != self._rendered_generation:
            with self.sysfs.lock:
                tree = self.sysfs.tree
                changed = self.sysfs.take_changes()
                materialize(tree, self.root, self._rendered, changed)
                if changed is None:
                    self._rendered = dict(tree.entries)
                else:
                    for p in changed:
                        e = tree.entries.get(p)
                        if e is None:
                            self._rendered.pop(p, None)
                        else:
                            self._rendered[p] = e
                self._rendered_generation = self.sysfs.generation

    # state ---------------------------------------------------------------------
    def to_spec(self) -> NodeSpec:
        """The current host state as a spec (loads back into an equal host)."""
        return self.sysfs.to_spec()

    def save(self, path: str | Path | None = None) -> Path:
        """Write :meth:`to_spec` to ``path`` (default: the spec file it was loaded from).

        Saving to the spec file it was loaded from also ends that file's write
        log: the spec now holds every write.
        """
        target = Path(path) if path is not None else self.spec_path
        if target is None:
            raise ValueError("SimHost was built from a NodeSpec: pass the path to save to")
        data = save_spec(self.to_spec(), target)
        if self._log is not None and target == self.spec_path:
            self._log.saved(data)
        return target

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SimHost:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
