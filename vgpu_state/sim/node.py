"""A simulated node: its host (the simulated driver) and its cluster side.

The spec describes both halves of a node: the GPUs and vGPUs the driver has,
and what the cluster knows of the node (its name, its labels, and which vGPUs
a pod or VM holds). :func:`open_sim` is the one way to open a spec for the
engine: a :class:`~vgpu_state.sim.host.SimHost` for the host port and a
:class:`~vgpu_state.ports.MemoryCluster` for the cluster port.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vgpu_state.catalog import Catalog
from vgpu_state.model.inuse import InUse
from vgpu_state.ports.cluster import MemoryCluster
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import NodeSpec
from vgpu_state.statefiles.drivertypes import DriverTypeMemory


def held_vgpus(host: SimHost) -> InUse:
    """vGPUs the spec marks as held: key (mdev UUID or VF address) -> holder.

    On a real node this comes from the kubelet; the simulated node carries it
    in its spec so that plans against it protect the same vGPUs the simulated
    driver refuses to remove.
    """
    held: dict[str, str] = {}
    for g in host.sysfs.driver.gpus:
        vfs = g.vf_addresses()
        for v in g.vgpus:
            if not v.in_use:
                continue
            if v.uuid is not None:
                held[v.uuid] = v.in_use
            elif v.vf is not None and v.vf < len(vfs):
                held[vfs[v.vf]] = v.in_use
    return InUse(held)


def sim_cluster(host: SimHost) -> MemoryCluster:
    """The simulated node as the cluster sees it now: name, labels, held vGPUs."""
    driver = host.sysfs.driver
    return MemoryCluster(driver.node, dict(driver.labels), held_vgpus(host))


@dataclass
class SimNode:
    """Both ports of one simulated node."""

    host: SimHost
    cluster: MemoryCluster

    def save(self) -> None:
        """Write the host's new state back to the spec file it came from."""
        self.host.save()

    def close(self) -> None:
        self.host.close()


def open_sim(
    spec: NodeSpec | str | Path,
    *,
    autosave: bool = False,
    catalog: Catalog | None = None,
    driver_types: DriverTypeMemory | None = None,
    in_memory: bool = True,
) -> SimNode:
    """Open a simulated node from a spec (file or value), its sysfs served in memory
    (``in_memory=False``: rendered as a directory tree, for a reader of its paths).

    ``autosave``: keep every write the simulated driver receives in the spec's
    write log as it is made (one appended line, not a save of the whole spec),
    as a real host keeps each sysfs write; a later failure (journal,
    verification) or a killed process then never loses what was done, and a
    write the log cannot take fails. :meth:`SimNode.save` writes the spec once
    (at the end of an apply) and ends the log.
    """
    host = SimHost(
        spec, in_memory=in_memory, autosave=autosave, catalog=catalog, driver_types=driver_types
    )
    return SimNode(host, sim_cluster(host))
