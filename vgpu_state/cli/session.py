"""One CLI invocation's view of the world: config, selection, host, in-use, desired state."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vgpu_state.config import load_file, load_text, resolve, select
from vgpu_state.config.document import ConfigDocument
from vgpu_state.executor import Journal, journal_path, lock_path
from vgpu_state.host import SysfsHost
from vgpu_state.model.desired import DesiredState
from vgpu_state.model.errors import SelectionError
from vgpu_state.model.inuse import InUse
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.planner.inuse import normalise_in_use
from vgpu_state.ports import HostPort, MemoryCluster


@dataclass
class Session:
    document: ConfigDocument
    target: Target
    snapshot: NodeSnapshot
    desired: DesiredState
    in_use: InUse
    selection_detail: str
    sim_spec: str | None
    warnings: tuple[str, ...] = ()

    @property
    def host(self) -> HostPort:
        return self.target.host

    def journal(self, explicit: str | None) -> Journal:
        return Journal(default_state_path(explicit, "VGPU_STATE_JOURNAL", self.sim_spec, "journal"))

    def save_sim(self) -> None:
        self.target.save()

    def close(self) -> None:
        self.target.close()


@dataclass
class Target:
    """The node a command works on: its host and cluster ports, and how to keep and release it.

    ``save`` writes a simulated node's new state back to its spec (nothing for a
    real host); ``close`` releases what the host holds.
    """

    host: HostPort
    cluster: MemoryCluster
    save: Callable[[], None]
    close: Callable[[], None]


def _nothing() -> None:
    return None


def save_simulated(target: Target) -> None:
    target.save()


def close_host(target: Target) -> None:
    target.close()


def default_state_path(explicit: str | None, env: str, sim_spec: str | None, kind: str) -> Path:
    """Journal and lock: flag, then env, then beside the sim spec, then the host default."""
    if sim_spec and not explicit and not os.environ.get(env):
        spec = Path(sim_spec)
        suffix = ".journal.jsonl" if kind == "journal" else ".lock"
        return spec.with_name(spec.name + suffix)
    return journal_path(explicit) if kind == "journal" else lock_path(explicit)


def open_host(
    sysfs_root: str | None,
    sim_spec: str | None,
    node: str | None,
    sriov_manage: str | None = None,
) -> Target:
    """The node: a simulated one, or sysfs at ``sysfs_root`` (default ``/sys``).

    ``sriov_manage``: the sriov-manage command line (split like a shell would);
    ``None`` uses ``/usr/lib/nvidia/sriov-manage`` when installed, ``""`` always
    writes ``sriov_numvfs``. ``node`` overrides the node's name.
    """
    if sim_spec and sysfs_root:
        raise SelectionError("give either --sim or --sysfs-root, not both")
    if sim_spec and sriov_manage is not None:
        raise SelectionError("--sriov-manage applies to a real sysfs, not to --sim")
    if sim_spec:
        from vgpu_state.sim.node import open_sim

        sim = open_sim(sim_spec)
        cluster = sim.cluster.with_overrides(node=node)
        return Target(sim.host, cluster, sim.save, sim.close)
    command = None if sriov_manage is None else shlex.split(sriov_manage)
    name = node or os.uname().nodename
    host = SysfsHost(sysfs_root or "/sys", name, command)
    return Target(host, MemoryCluster(name), _nothing, _nothing)


def open_session(
    config_file: str,
    config_name: str | None,
    node: str | None,
    labels: Mapping[str, str],
    label_key: str,
    sysfs_root: str | None,
    sim_spec: str | None,
    in_use: Mapping[str, str],
    sriov_manage: str | None = None,
) -> Session:
    if config_file == "-":
        document = load_text(sys.stdin.read(), "<stdin>")
    else:
        document = load_file(config_file)
    target = open_host(sysfs_root, sim_spec, node, sriov_manage)
    cluster = target.cluster.with_overrides(labels=labels, in_use=in_use)
    node_name, all_labels = cluster.node_name(), cluster.labels()
    if config_name:
        chosen, source, detail = config_name, "flag", f"-c {config_name}"
    else:
        sel = select(document, node_name, all_labels, label_key)
        if sel.config is None:
            raise SelectionError(
                f"no config selected for node {node_name}: {sel.detail}. Label the node "
                f"({label_key}=NAME), add a node-selector or a default, or pass -c NAME"
            )
        chosen, source, detail = sel.config, sel.source, sel.detail
    snapshot = target.host.scan()
    desired = resolve(document, chosen, snapshot.gpus, node_name, source)
    held, warnings = normalise_in_use(cluster.in_use(), snapshot)
    return Session(
        document, target, snapshot, desired, InUse(held), detail, sim_spec, tuple(warnings)
    )
