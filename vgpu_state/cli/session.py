"""One CLI invocation's view of the world: config, selection, host, in-use, desired state."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vgpu_state.config import load_file, load_text, resolve, select
from vgpu_state.config.document import ConfigDocument
from vgpu_state.executor import HostPort, Journal, journal_path, lock_path
from vgpu_state.host import SysfsHost
from vgpu_state.model.desired import DesiredState
from vgpu_state.model.errors import SelectionError
from vgpu_state.model.snapshot import NodeSnapshot

if TYPE_CHECKING:
    from vgpu_state.sim.host import SimHost


@dataclass
class Session:
    document: ConfigDocument
    host: HostPort
    snapshot: NodeSnapshot
    desired: DesiredState
    in_use: dict[str, str]
    selection_detail: str
    sim_spec: str | None

    def journal(self, explicit: str | None) -> Journal:
        return Journal(default_state_path(explicit, "VGPU_STATE_JOURNAL", self.sim_spec, "journal"))

    def save_sim(self) -> None:
        save_simulated(self.host)

    def close(self) -> None:
        close_host(self.host)


def simulated(host: HostPort) -> SimHost | None:
    """The simulated node behind ``host``, if it is one.

    The simulator is imported only by ``--sim`` commands, so a host that is not
    simulated never loads it here either.
    """
    if "vgpu_state.sim.host" not in sys.modules:
        return None
    from vgpu_state.sim.host import SimHost

    return host if isinstance(host, SimHost) else None


def save_simulated(host: HostPort) -> None:
    """Write a simulated node's new state back to its spec (nothing for a real host)."""
    sim = simulated(host)
    if sim is not None:
        sim.save()


def close_host(host: HostPort) -> None:
    sim = simulated(host)
    if sim is not None:
        sim.close()


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
) -> HostPort:
    """The host: a simulated node, or sysfs at ``sysfs_root`` (default ``/sys``).

    ``sriov_manage``: the sriov-manage command line (split like a shell would);
    ``None`` uses ``/usr/lib/nvidia/sriov-manage`` when installed, ``""`` always
    writes ``sriov_numvfs``.
    """
    if sim_spec and sysfs_root:
        raise SelectionError("give either --sim or --sysfs-root, not both")
    if sim_spec and sriov_manage is not None:
        raise SelectionError("--sriov-manage applies to a real sysfs, not to --sim")
    if sim_spec:
        from vgpu_state.sim.host import SimHost

        return SimHost(sim_spec, in_memory=True)
    command = None if sriov_manage is None else shlex.split(sriov_manage)
    return SysfsHost(sysfs_root or "/sys", node or os.uname().nodename, command)


def host_identity(host: HostPort, node: str | None) -> tuple[str, dict[str, str]]:
    sim = simulated(host)
    if sim is not None:
        return node or sim.node, sim.labels
    return node or os.uname().nodename, {}


def sim_in_use(host: HostPort) -> dict[str, str]:
    sim = simulated(host)
    return sim.in_use() if sim is not None else {}


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
    host = open_host(sysfs_root, sim_spec, node, sriov_manage)
    node_name, host_labels = host_identity(host, node)
    all_labels = {**host_labels, **labels}
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
    snapshot = host.scan()
    desired = resolve(document, chosen, snapshot.gpus, node_name, source)
    held = {**sim_in_use(host), **in_use}
    return Session(document, host, snapshot, desired, held, detail, sim_spec)
