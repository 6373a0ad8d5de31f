"""One CLI invocation's node: its ports and settings, built from flags and environment.

Also the pieces ``plan``, ``apply`` and ``assert`` share: opening the node named
by the selection options, one reconcile of it, and the journal's warnings.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import click

from vgpu_state.catalog import default_catalog
from vgpu_state.cli.common import SessionArgs, parse_in_use, parse_labels
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.config.loader import MAX_CONFIG_BYTES
from vgpu_state.config.source import FileConfigSource
from vgpu_state.host import SysfsHost
from vgpu_state.host.holders import ProcHolders
from vgpu_state.inputfiles import decode_utf8, read_stream
from vgpu_state.model.errors import SelectionError
from vgpu_state.ports import ConfigSource, HostPort, MemoryCluster, NoProcesses, ProcessHolders
from vgpu_state.reconcile import Mode, Ports, QuietReporter, Report, Settings, reconcile_once
from vgpu_state.statefiles import (
    DEFAULT_STATE_DIR,
    DriverTypeMemory,
    DriverTypesFile,
    Journal,
    StateDir,
)

ENV_JOURNAL = "VGPU_STATE_JOURNAL"
ENV_LOCK = "VGPU_STATE_LOCK_FILE"


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
    processes: ProcessHolders = dataclasses.field(default_factory=NoProcesses)
    """The node's processes holding vGPUs: its ``/proc`` (a simulated node's own)."""


def _nothing() -> None:
    return None


def state_dir(
    sim_spec: str | None, journal_file: str | None = None, lock_file: str | None = None
) -> StateDir:
    """Journal, lock and driver types: flag, then env, then beside the sim spec, then the
    node's state directory (the agent's, :data:`~vgpu_state.statefiles.DEFAULT_STATE_DIR`).
    The driver types go beside a journal that a flag or the env names."""
    base = StateDir.beside(sim_spec) if sim_spec else DEFAULT_STATE_DIR
    return base.moved(
        journal=journal_file or os.environ.get(ENV_JOURNAL),
        lock=lock_file or os.environ.get(ENV_LOCK),
    )


def journal_for(explicit: str | None, sim_spec: str | None) -> Journal:
    return Journal(state_dir(sim_spec, explicit).journal)


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def driver_type_memory(settings: Settings, record: bool) -> DriverTypeMemory:
    """The node's remembered driver types, read from ``settings.driver_types_path``.

    ``record``: write what a scan newly sees back to the file (commands that
    change the host); other commands only read it. A file that cannot be used
    is a warning, never an error.
    """
    if settings.driver_types_path is None:
        return DriverTypeMemory()
    return DriverTypesFile(settings.driver_types_path).memory(_warn, record=record)


def open_host(
    sysfs_root: str | None,
    sim_spec: str | None,
    node: str | None,
    settings: Settings,
    *,
    record: bool = False,
    proc_root: str | None = None,
) -> Target:
    """The node: a simulated one, or sysfs at ``sysfs_root`` (default ``/sys``).

    A real host takes the catalog and the sriov-manage command from ``settings``.
    ``node`` overrides the node's name. ``record``: keep what the driver lists
    in the driver-types file (see :func:`driver_type_memory`). Processes
    holding vGPUs are read from ``proc_root`` (default ``/proc``; a simulated
    node's own ``/proc`` unless given).
    """
    if sim_spec and sysfs_root:
        raise SelectionError("give either --sim or --sysfs-root, not both")
    if sim_spec and settings.sriov_manage is not None:
        raise SelectionError("--sriov-manage applies to a real sysfs, not to --sim")
    if sim_spec:
        from vgpu_state.sim.node import open_sim

        memory = driver_type_memory(settings, record)
        sim = open_sim(sim_spec, autosave=True, catalog=settings.catalog, driver_types=memory)
        cluster = sim.cluster.with_overrides(node=node)
        from vgpu_state.sim.proc import SimProcHolders

        processes: ProcessHolders = (
            ProcHolders(proc_root) if proc_root else SimProcHolders(sim.host)
        )
        return Target(sim.host, cluster, sim.save, sim.close, processes)
    name = node or os.uname().nodename
    host = SysfsHost(
        sysfs_root or "/sys",
        name,
        settings.sriov_manage,
        catalog=settings.catalog,
        driver_types=driver_type_memory(settings, record),
    )
    return Target(host, MemoryCluster(name), _nothing, _nothing, ProcHolders(proc_root or "/proc"))


def config_source(config_file: str, settings: Settings) -> ConfigSource:
    """The config file (``-``: standard input, read once)."""
    if config_file == "-":
        data = read_stream(getattr(sys.stdin, "buffer", sys.stdin), MAX_CONFIG_BYTES, "config")
        text = decode_utf8(data, "<stdin>", "config")
        return StaticConfigSource(load_text(text, "<stdin>", catalog=settings.catalog))
    return FileConfigSource(config_file, settings.catalog)


def sriov_manage_command(flag: str | None) -> tuple[str, ...] | None:
    """``--sriov-manage``: a command line split as a shell would; ``None`` when not given
    (the installed ``/usr/lib/nvidia/sriov-manage`` if any), ``()`` for ``""`` (always
    write ``sriov_numvfs``)."""
    return None if flag is None else tuple(shlex.split(flag))


def settings(
    label_key: str,
    sim_spec: str | None,
    journal_file: str | None = None,
    lock_file: str | None = None,
    lock_timeout: float = 30.0,
    sriov_manage: str | None = None,
) -> Settings:
    """The settings of one command, from its flags and the environment."""
    state = state_dir(sim_spec, journal_file, lock_file)
    return Settings(
        catalog=default_catalog(),
        journal_path=state.journal,
        driver_types_path=state.driver_types,
        lock_path=state.lock,
        lock_timeout=lock_timeout,
        label_key=label_key,
        sriov_manage=sriov_manage_command(sriov_manage),
        command=" ".join(sys.argv),
    )


def ports(
    target: Target,
    config_file: str,
    labels: Mapping[str, str],
    in_use: Mapping[str, str],
    settings: Settings,
) -> Ports:
    """The ports of one command: the node's, with the labels and holders given by flags."""
    cluster = target.cluster.with_overrides(labels=labels, in_use=in_use)
    return Ports(
        target.host,
        cluster,
        config_source(config_file, settings),
        processes=target.processes,
    )


def open_target(args: SessionArgs, settings: Settings, *, record: bool = False) -> Target:
    """The node of ``plan``, ``apply`` or ``assert``; they need a config file.

    ``record``: see :func:`open_host`.
    """
    if not args.config_file:
        raise SelectionError("missing the config file: pass -f FILE or set VGPU_STATE_CONFIG_FILE")
    if args.config_file == "-" and args.in_use_file == "-":
        raise click.UsageError("-f - and --in-use-file - cannot both read standard input")
    return open_host(
        args.sysfs_root,
        args.sim_spec,
        args.node,
        settings,
        record=record,
        proc_root=args.proc_root,
    )


class Warnings(QuietReporter):
    """Prints the reconcile's warnings on stderr."""

    def warning(self, message: str) -> None:
        click.echo(f"warning: {message}", err=True)


def reconcile(
    args: SessionArgs,
    target: Target,
    settings: Settings,
    mode: Mode = Mode.PLAN,
    **kwargs: Any,
) -> Report:
    """One reconcile of the node named by the selection options."""
    assert args.config_file is not None
    flagged = parse_in_use(args.in_use, args.in_use_file)  # standard input is read once
    node_ports = ports(target, args.config_file, parse_labels(args.labels), flagged, settings)
    reporter = kwargs.pop("reporter", None) or Warnings()
    if args.kubeconfig or args.in_cluster:
        from vgpu_state.cli.kube import kube_ports

        node_ports, cluster = kube_ports(node_ports, target, args, flagged, mode, reporter.warning)
        reporter = cluster.reporter(reporter)
    return reconcile_once(
        node_ports,
        settings,
        mode=mode,
        config_name=args.config_name,
        reporter=reporter,
        **kwargs,
    )


def warn_unfinished(journal: Journal) -> None:
    """The journal's unreadable lines and the applies that never finished, on stderr."""
    unfinished = journal.unfinished()
    for warning in journal.warnings:
        click.echo(f"warning: {warning}", err=True)
    for u in unfinished:
        click.echo(f"warning: {u.describe()}", err=True)
