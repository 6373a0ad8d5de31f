"""One CLI invocation's view of the world: config, selection, host, in-use, desired state."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vgpu_state.config import load_file, load_text, resolve, select
from vgpu_state.config.document import ConfigDocument
from vgpu_state.executor import HostPort, Journal, journal_path, lock_path
from vgpu_state.host import SysfsHost
from vgpu_state.model.desired import DesiredState
from vgpu_state.model.errors import SelectionError
from vgpu_state.model.snapshot import NodeSnapshot


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

    def lock_file(self, explicit: str | None) -> Path:
        return default_state_path(explicit, "VGPU_STATE_LOCK_FILE", self.sim_spec, "lock")

    def save_sim(self) -> None:
        from vgpu_state.sim.host import SimHost

        if isinstance(self.host, SimHost):
            self.host.save()

    def close(self) -> None:
        from vgpu_state.sim.host import SimHost

        if isinstance(self.host, SimHost):
            self.host.close()


def default_state_path(explicit: str | None, env: str, sim_spec: str | None, kind: str) -> Path:
    """Journal and lock: flag, then env, then beside the sim spec, then the host default."""
    if explicit:
        return Path(explicit)
    if os.environ.get(env):
        return Path(os.environ[env])
    if sim_spec:
        spec = Path(sim_spec)
        suffix = ".journal.jsonl" if kind == "journal" else ".lock"
        return spec.with_name(spec.name + suffix)
    return journal_path() if kind == "journal" else lock_path()


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
    from vgpu_state.sim.host import SimHost

    if isinstance(host, SimHost):
        return node or host.node, host.labels
    return node or os.uname().nodename, {}


def sim_in_use(host: HostPort) -> dict[str, str]:
    from vgpu_state.sim.host import SimHost

    return host.in_use() if isinstance(host, SimHost) else {}


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
