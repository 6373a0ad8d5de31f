"""Opening a node: the one place the commands, the agent and the device plugin get one.

A node is simulated (a spec file: its host, its cluster side and its ``/proc``
come from the spec) or real (sysfs at a root, ``/proc``, the machine's name).
Either way it scans through the memory of the vGPU types its driver listed,
read from the node's state directory and, for whoever changes the host,
written back there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vgpu_state.catalog import Catalog
from vgpu_state.host import SysfsHost
from vgpu_state.host.holders import ProcHolders, check_proc_root
from vgpu_state.model.errors import SelectionError
from vgpu_state.model.inuse import InUse
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.ports import HostPort, MemoryCluster, ProcessHolders
from vgpu_state.statefiles import DriverTypeMemory, DriverTypesFile
from vgpu_state.wellknown import PROC_ROOT, SYSFS_ROOT

if TYPE_CHECKING:
    from vgpu_state.sim.host import SimHost
    from vgpu_state.sim.node import SimNode


@dataclass(frozen=True)
class NodeSettings:
    """What names a node and how to open it; each entry point builds it from its flags."""

    catalog: Catalog
    """The GPU models and vGPU types the scan names things with."""
    sim_spec: str | None = None
    """A simulated node's spec file, instead of sysfs."""
    sysfs_root: str | None = None
    """Where sysfs is mounted (``None``: ``/sys``)."""
    name: str | None = None
    """The node's name (``None``: a simulated node's own, or the machine's host name)."""
    driver_types: Path | None = None
    """The state directory's driver-types file (:attr:`StateDir.driver_types
    <vgpu_state.statefiles.StateDir.driver_types>`); ``None``: remembered only while
    the node is open."""
    record: bool = False
    """Write what a scan newly learns back to :attr:`driver_types` (for whoever
    changes the host); otherwise the file is only read."""
    sriov_manage: tuple[str, ...] | None = None
    """A real host's sriov-manage command (see ``reconcile.Settings.sriov_manage``)."""
    nvidia_smi: tuple[str, ...] | None = None
    """A real host's nvidia-smi command (``None``: ``/usr/bin/nvidia-smi`` when
    installed; empty: none). A simulated node has its own when its spec says so."""
    proc_root: str | None = None
    """Where processes holding vGPUs are read (``None``: ``/proc``, or a simulated
    node's own); one given must look like a ``/proc``
    (:func:`~vgpu_state.host.holders.check_proc_root`)."""
    autosave: bool = False
    """A simulated node keeps every write in its spec's write log as it is made
    (see :func:`~vgpu_state.sim.node.open_sim`)."""
    in_memory: bool = True
    """A simulated node's sysfs is served in memory; ``False`` renders it as a
    directory tree, for a reader of its device paths (the device plugin)."""
    spec_follows: bool = False
    """A simulated node's spec file follows every change, for other processes that
    read it: it is saved at the next full scan after a write (an apply ends with
    one), so once per apply rather than once per write."""


@dataclass
class OpenNode:
    """An open node: its host and cluster ports, its processes, and how to keep and
    release it."""

    host: HostPort
    cluster: MemoryCluster
    """The node as flags or a simulated spec give it: name, labels, held vGPUs."""
    processes: ProcessHolders
    """The node's processes holding vGPUs (its ``/proc``)."""
    driver_types: DriverTypeMemory
    sim: SimNode | None = None
    """The simulated node, when it is one."""

    def held(self) -> InUse:
        """The vGPUs the simulated spec marks as held now (none on a real node)."""
        if self.sim is None:
            return InUse({})
        from vgpu_state.sim.node import held_vgpus

        return held_vgpus(self.sim.host)

    def save(self) -> None:
        """Write a simulated node's new state back to its spec (nothing on a real host)."""
        if self.sim is not None:
            self.sim.save()

    def close(self) -> None:
        """Release what the host holds."""
        if self.sim is not None:
            self.sim.close()


def driver_type_memory(settings: NodeSettings, warn: Callable[[str], None]) -> DriverTypeMemory:
    """The node's remembered driver types (see :attr:`NodeSettings.driver_types`); a
    file that cannot be used is passed to ``warn``, never an error."""
    if settings.driver_types is None:
        return DriverTypeMemory()
    return DriverTypesFile(settings.driver_types).memory(warn, record=settings.record)


def open_node(
    settings: NodeSettings,
    warn: Callable[[str], None],
    *,
    driver_types: DriverTypeMemory | None = None,
) -> OpenNode:
    """The node ``settings`` name; ``warn`` hears what is wrong with its state files.

    ``driver_types``: keep this memory (a node opened again in one process)
    instead of reading the file.
    """
    if settings.sim_spec and settings.sysfs_root:
        raise SelectionError("give either --sim or --sysfs-root, not both")
    if settings.sim_spec and settings.sriov_manage is not None:
        raise SelectionError("--sriov-manage applies to a real sysfs, not to --sim")
    if settings.sim_spec and settings.nvidia_smi is not None:
        raise SelectionError(
            "--nvidia-smi applies to a real host, not to --sim (a simulated node has "
            "nvidia-smi when its spec says nvidia-smi: true)"
        )
    if settings.proc_root is not None:
        check_proc_root(settings.proc_root)
    memory = driver_types if driver_types is not None else driver_type_memory(settings, warn)
    catalog = settings.catalog
    if settings.sim_spec:
        from vgpu_state.sim.node import open_sim
        from vgpu_state.sim.proc import SimProcHolders

        sim = open_sim(
            settings.sim_spec,
            autosave=settings.autosave,
            catalog=catalog,
            driver_types=memory,
            in_memory=settings.in_memory,
        )
        processes: ProcessHolders = (
            ProcHolders(settings.proc_root) if settings.proc_root else SimProcHolders(sim.host)
        )
        cluster = sim.cluster.with_overrides(node=settings.name)
        host: HostPort = _SavingHost(sim.host) if settings.spec_follows else sim.host
        return OpenNode(host, cluster, processes, memory, sim)
    name = settings.name if settings.name is not None else os.uname().nodename
    real = SysfsHost(
        settings.sysfs_root or SYSFS_ROOT,
        name,
        settings.sriov_manage,
        catalog=catalog,
        driver_types=memory,
        nvidia_smi=settings.nvidia_smi,
    )
    processes = ProcHolders(settings.proc_root or PROC_ROOT)
    return OpenNode(real, MemoryCluster(name), processes, memory)


class _SavingHost:
    """A simulated host whose spec file follows every change (:attr:`NodeSettings.spec_follows`).

    Each write lands in the spec's write log as it is made; the spec itself is
    written at the next full scan after a change.
    """

    def __init__(self, inner: SimHost) -> None:
        self.inner = inner

    def scan(self) -> NodeSnapshot:
        snapshot = self.inner.scan()
        if self.inner.unsaved_writes:
            self.inner.save()
        return snapshot

    def scan_gpu(self, address: str) -> NodeSnapshot:
        return self.inner.scan_gpu(address)

    def enable_sriov(self, pf: str) -> None:
        self.inner.enable_sriov(pf)

    def disable_sriov(self, pf: str) -> None:
        self.inner.disable_sriov(pf)

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None:
        self.inner.create_mdev(parent, type_id, uuid)

    def remove_mdev(self, uuid: str) -> None:
        self.inner.remove_mdev(uuid)

    def set_vf_type(self, vf: str, type_id: int) -> None:
        self.inner.set_vf_type(vf, type_id)

    def clear_vf_type(self, vf: str) -> None:
        self.inner.clear_vf_type(vf)

    def set_mig_mode(self, pf: str, enabled: bool) -> None:
        self.inner.set_mig_mode(pf, enabled)

    def create_gpu_instance(self, pf: str, profile: str) -> int:
        return self.inner.create_gpu_instance(pf, profile)

    def destroy_gpu_instance(self, pf: str, gi_id: int) -> None:
        self.inner.destroy_gpu_instance(pf, gi_id)

    def set_heterogeneous_mode(self, pf: str, enabled: bool) -> None:
        self.inner.set_heterogeneous_mode(pf, enabled)
