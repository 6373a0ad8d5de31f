"""The CLI's one vocabulary: the options every command spells the same, and the old
spellings that keep working for one release with a deprecation warning.

Shared meanings (docs/cli.md):

* ``-f/--config FILE``: the layouts file (``-`` reads standard input);
* ``-c/--config-name NAME``: the named layout, instead of selecting one by labels;
* ``--sysfs-root DIR``: the host's sysfs (default ``/sys``; ``--sim`` instead);
* ``-o/--output text|json``: how a command reports;
* ``--log-level`` and ``--no-color``: on ``vgpu-state`` itself, for every command.

Old spellings are rewritten before click parses a command's arguments
(``vgpu-state``'s group calls :func:`modernise`), so a command sees only the new
ones: ``--file`` and ``--config-file`` become ``--config``;
``--config NAME`` in its old meaning (the named layout) becomes
``--config-name NAME`` when the same command line also gives the file with
``-f``/``--file``/``--config-file``, or when ``NAME`` is no file and
``$VGPU_STATE_CONFIG_FILE`` names the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from vgpu_state.wellknown import METRICS_LISTEN, SYSFS_ROOT

F = TypeVar("F", bound=Callable[..., Any])

ENV_CONFIG_FILE = "VGPU_STATE_CONFIG_FILE"
ENV_LOG_LEVEL = "VGPU_STATE_LOG_LEVEL"
ENV_CONFIG_NAME = "VGPU_STATE_SELECTED_CONFIG"
DEFAULT_SYSFS_ROOT = SYSFS_ROOT

RENAMED_FILE_FLAGS = ("--file", "--config-file")
"""Old spellings of ``--config`` (the layouts file)."""

OUTPUT_FORMATS = ("text", "json")


def _warn_deprecated(old: str, new: str) -> None:
    click.echo(
        f"warning: {old} is deprecated and will be removed in the next release: use {new}",
        err=True,
    )


def _split(token: str) -> tuple[str, str | None]:
    """``--flag=value`` -> (``--flag``, ``value``); ``--flag`` -> (``--flag``, None)."""
    if token.startswith("--") and "=" in token:
        flag, _, value = token.partition("=")
        return flag, value
    return token, None


def modernise(args: Sequence[str], *, has_config_name: bool) -> list[str]:
    """The command line with the old spellings rewritten to the new ones (warning once
    per spelling on stderr). ``has_config_name``: the command takes a named layout,
    so ``--config`` may mean it in the old vocabulary."""
    args = list(args)
    end = args.index("--") if "--" in args else len(args)
    head, tail = args[:end], args[end:]
    flags = [_split(t)[0] for t in head]
    file_given = "-f" in flags or any(f in RENAMED_FILE_FLAGS for f in flags)
    out: list[str] = []
    warned: set[str] = set()
    i = 0
    while i < len(head):
        token = head[i]
        flag, inline = _split(token)
        if flag in RENAMED_FILE_FLAGS:
            if flag not in warned:
                _warn_deprecated(flag, "-f/--config")
                warned.add(flag)
            out.append("--config" if inline is None else f"--config={inline}")
        elif flag == "--config" and has_config_name:
            value = inline if inline is not None else (head[i + 1] if i + 1 < len(head) else None)
            old_meaning = file_given or (
                value is not None
                and value != "-"
                and bool(os.environ.get(ENV_CONFIG_FILE))
                and not os.path.exists(value)
            )
            if old_meaning:
                if "--config NAME" not in warned:
                    _warn_deprecated("--config NAME (the named layout)", "-c/--config-name NAME")
                    warned.add("--config NAME")
                out.append("--config-name" if inline is None else f"--config-name={inline}")
            else:
                out.append(token)
        else:
            out.append(token)
        i += 1
    return out + tail


def config_file_option(
    *, required: bool = False, help: str | None = None, default: str | None = None
) -> Callable[[F], F]:
    """``-f/--config FILE`` (``$VGPU_STATE_CONFIG_FILE``), the layouts file."""
    return click.option(
        "-f",
        "--config",
        "config_file",
        metavar="FILE",
        required=required,
        default=default,
        show_default=default is not None,
        envvar=ENV_CONFIG_FILE,
        help=help or f"The layouts file (- reads standard input). Env: {ENV_CONFIG_FILE}.",
    )


def config_name_option(
    help: str | None = None, envvar: str | None = ENV_CONFIG_NAME
) -> Callable[[F], F]:
    """``-c/--config-name NAME``, a named layout of the file."""
    text = help or "Use this named layout instead of selecting one by node labels."
    if envvar:
        text += f" Env: {envvar}."
    return click.option(
        "-c", "--config-name", "config_name", metavar="NAME", envvar=envvar, help=text
    )


def sysfs_root_option(help: str | None = None) -> Callable[[F], F]:
    """``--sysfs-root DIR``; ``None`` when not given, which means ``/sys`` (or the
    simulated node of ``--sim``)."""
    text = help or "Read the host from this sysfs root (--sim: a simulated node instead)."
    return click.option(
        "--sysfs-root",
        type=click.Path(file_okay=False),
        help=f"{text}  [default: {DEFAULT_SYSFS_ROOT}]",
    )


LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level_option() -> Callable[[F], F]:
    """A long-running command's own ``--log-level`` (default info); ``vgpu-state
    --log-level`` before the command sets it too."""
    return click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS),
        default="info",
        show_default=True,
        envvar=ENV_LOG_LEVEL,
        help="Log messages from this level up (also vgpu-state --log-level). "
        f"Env: {ENV_LOG_LEVEL}.",
    )


def kubeconfig_options() -> Callable[[F], F]:
    """``--kubeconfig FILE`` and ``--context NAME``: the cluster a command reads."""
    kubeconfig = click.option(
        "--kubeconfig",
        type=click.Path(dir_okay=False),
        help="The cluster (default: in-cluster, then $KUBECONFIG or ~/.kube/config).",
    )
    context = click.option(
        "--context", help="The kubeconfig context (default: its current context)."
    )

    def both(fn: F) -> F:
        return kubeconfig(context(fn))

    return both


def chunk_size_option(default: int) -> Callable[[F], F]:
    """``--chunk-size N``: objects per list request of a command that lists the fleet."""
    return click.option(
        "--chunk-size",
        type=click.IntRange(min=0),
        default=default,
        show_default=True,
        help="Objects per list request (0: each list in one request).",
    )


def output_option(
    choices: Sequence[str] = OUTPUT_FORMATS, default: str = "text", help: str | None = None
) -> Callable[[F], F]:
    """``-o/--output text|json``."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(list(choices)),
        default=default,
        show_default=True,
        help=help or "How to report: text for people, json for programs.",
    )


def seconds_option(
    flag: str,
    default: float,
    help: str,
    *,
    minimum: float = 0,
    maximum: float | None = None,
    min_open: bool = False,
    metavar: str | None = None,
) -> Callable[[F], F]:
    """An option that takes a number of seconds (at least ``minimum``), its default shown."""
    return click.option(
        flag,
        type=click.FloatRange(min=minimum, max=maximum, min_open=min_open),
        default=default,
        show_default=True,
        metavar=metavar,
        help=help,
    )


def directory_option(flag: str, default: str, help: str) -> Callable[[F], F]:
    """An option that names a directory (a :class:`~pathlib.Path`), its default shown."""
    return click.option(
        flag,
        default=default,
        show_default=True,
        type=click.Path(file_okay=False, path_type=Path),
        help=help,
    )


def daemon_options(namespace_help: str) -> Callable[[F], F]:
    """The cluster of a long-running process (the agent, the controller):
    ``--kubeconfig FILE`` and ``--namespace`` (``$POD_NAMESPACE``)."""
    kubeconfig = click.option(
        "--kubeconfig", default=None, help="Kubeconfig (default: in-cluster, then ~/.kube/config)."
    )
    namespace = click.option(
        "--namespace",
        envvar="POD_NAMESPACE",
        default="vgpu-state",
        show_default=True,
        help=namespace_help,
    )

    def both(fn: F) -> F:
        return kubeconfig(namespace(fn))

    return both


def listen_option(help: str) -> Callable[[F], F]:
    """``--listen HOST:PORT`` of a long-running process's ``/metrics`` and probes."""
    return click.option("--listen", default=METRICS_LISTEN, show_default=True, help=help)
