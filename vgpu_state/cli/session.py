"""One CLI invocation's node: its ports and settings, built from flags and environment.

Also the pieces ``plan``, ``apply`` and ``assert`` share: opening the node named
by the selection options, one reconcile of it, and the journal's warnings.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from vgpu_state.catalog import default_catalog
from vgpu_state.cli.common import SessionArgs, parse_in_use, parse_labels
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.config.loader import MAX_CONFIG_BYTES
from vgpu_state.config.source import FileConfigSource
from vgpu_state.inputfiles import decode_utf8, read_stream
from vgpu_state.model.errors import SelectionError
from vgpu_state.ports import ConfigSource
from vgpu_state.reconcile import Mode, Ports, QuietReporter, Report, Settings, reconcile_once
from vgpu_state.statefiles import DEFAULT_STATE_DIR, Journal, StateDir

if TYPE_CHECKING:
    from vgpu_state.compose import OpenNode

ENV_JOURNAL = "VGPU_STATE_JOURNAL"
ENV_LOCK = "VGPU_STATE_LOCK_FILE"


def state_dir(
    sim_spec: str | None,
    journal_file: str | None = None,
    lock_file: str | None = None,
    directory: str | None = None,
) -> StateDir:
    """Journal, lock and driver types: ``--state-dir`` (or its env), else beside the sim
    spec, else the node's state directory (the agent's,
    :data:`~vgpu_state.statefiles.DEFAULT_STATE_DIR`); the old ``--journal`` and
    ``--lock-file`` (and their env) move one file. The driver types go beside a journal
    that they name."""
    if directory:
        base = StateDir.at(directory)
    else:
        base = StateDir.beside(sim_spec) if sim_spec else DEFAULT_STATE_DIR
    return base.moved(
        journal=journal_file or os.environ.get(ENV_JOURNAL),
        lock=lock_file or os.environ.get(ENV_LOCK),
    )


def journal_for(
    explicit: str | None, sim_spec: str | None, directory: str | None = None
) -> Journal:
    return Journal(state_dir(sim_spec, explicit, directory=directory).journal)


def warn(message: str) -> None:
    """A warning on stderr."""
    click.echo(f"warning: {message}", err=True)


def open_host(
    sysfs_root: str | None,
    sim_spec: str | None,
    node: str | None,
    settings: Settings,
    *,
    record: bool = False,
    proc_root: str | None = None,
) -> OpenNode:
    """The node: a simulated one, or sysfs at ``sysfs_root`` (default ``/sys``).

    A real host takes the catalog and the sriov-manage command from ``settings``.
    ``node`` overrides the node's name. ``record``: keep what the driver lists
    in the driver-types file (``settings.driver_types_path``). Processes
    holding vGPUs are read from ``proc_root`` (default ``/proc``; a simulated
    node's own ``/proc`` unless given).
    """
    from vgpu_state.compose import NodeSettings, open_node

    return open_node(
        NodeSettings(
            settings.catalog,
            sim_spec=sim_spec,
            sysfs_root=sysfs_root,
            name=node or None,
            driver_types=settings.driver_types_path,
            record=record,
            sriov_manage=settings.sriov_manage,
            nvidia_smi=settings.nvidia_smi,
            proc_root=proc_root,
            autosave=True,
        ),
        warn,
    )


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


def nvidia_smi_command(flag: str | None) -> tuple[str, ...] | None:
    """``--nvidia-smi``: a command line split as a shell would; ``None`` when not given
    (the installed ``/usr/bin/nvidia-smi`` if any), ``()`` for ``""`` (none)."""
    return None if flag is None else tuple(shlex.split(flag))


def settings(
    label_key: str,
    sim_spec: str | None,
    journal_file: str | None = None,
    lock_file: str | None = None,
    lock_timeout: float = 30.0,
    sriov_manage: str | None = None,
    directory: str | None = None,
    *,
    default_config: str | None = None,
    strict: bool = False,
    nvidia_smi: str | None = None,
) -> Settings:
    """The settings of one command, from its flags and the environment (``directory``:
    ``--state-dir``)."""
    state = state_dir(sim_spec, journal_file, lock_file, directory)
    return Settings(
        catalog=default_catalog(),
        journal_path=state.journal,
        driver_types_path=state.driver_types,
        lock_path=state.lock,
        lock_timeout=lock_timeout,
        label_key=label_key,
        default_config=default_config or None,
        strict=strict,
        sriov_manage=sriov_manage_command(sriov_manage),
        nvidia_smi=nvidia_smi_command(nvidia_smi),
        command=" ".join(sys.argv),
    )


def ports(
    target: OpenNode,
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


def open_target(args: SessionArgs, settings: Settings, *, record: bool = False) -> OpenNode:
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
        warn(message)


def reconcile(
    args: SessionArgs,
    target: OpenNode,
    settings: Settings,
    mode: Mode = Mode.PLAN,
    **kwargs: Any,
) -> Report:
    """One reconcile of the node named by the selection options."""
    assert args.config_file is not None
    flagged = parse_in_use(args.in_use, args.in_use_file)  # standard input is read once
    node_ports = ports(target, args.config_file, parse_labels(args.labels), flagged, settings)
    reporter = kwargs.pop("reporter", None) or Warnings()
    if args.kubeconfig or args.context or args.in_cluster:
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
