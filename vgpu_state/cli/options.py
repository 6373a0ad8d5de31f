"""The CLI's one vocabulary: the options every command spells the same, and the old
spellings that keep working for one release with a deprecation warning.

Shared meanings (docs/cli.md):

* ``-f/--config FILE``: the layouts file (``-`` reads standard input);
* ``-c/--config-name NAME``: the named layout, instead of selecting one by labels;
* ``--sysfs-root DIR``: the host's sysfs (default ``/sys``; ``--sim`` instead);
* ``-o/--output text|json``: how a command reports;
* ``--state-dir DIR``: the node's state files (journal, host lock, driver types);
* ``--device-plugin-dir DIR``: the kubelet's device-plugins directory;
* ``--kubeconfig FILE`` / ``--context NAME``: the cluster (one default rule);
* ``--log-level`` and ``--no-color``: on ``vgpu-state`` itself, for every command.

:data:`SHARED_OPTIONS` is the table: each shared concept's parameter name, its
spellings, its default and its environment variable. Every command takes these
options from the functions below, and ``tests/test_cli_vocabulary.py`` checks
every command of the click tree against the table.

Old spellings are rewritten before click parses a command's arguments
(``vgpu-state``'s group calls :func:`modernise`), so a command sees only the new
ones: ``--file`` and ``--config-file`` become ``--config``; ``--config-dir DIR``
becomes ``--config DIR/config.yaml``; ``--plugin-dir`` becomes
``--device-plugin-dir``; ``--journal FILE`` and ``--lock-file FILE`` stay
hidden options of their commands (no directory says the same) that warn;
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

from vgpu_state.wellknown import (
    KUBELET_DEVICE_PLUGIN_DIR,
    METRICS_LISTEN,
    STATE_DIR,
    SYSFS_ROOT,
)

F = TypeVar("F", bound=Callable[..., Any])

ENV_CONFIG_FILE = "VGPU_STATE_CONFIG_FILE"
ENV_LOG_LEVEL = "VGPU_STATE_LOG_LEVEL"
ENV_CONFIG_NAME = "VGPU_STATE_SELECTED_CONFIG"
ENV_STATE_DIR = "VGPU_STATE_STATE_DIR"
ENV_DEVICE_PLUGIN_DIR = "VGPU_STATE_DEVICE_PLUGIN_DIR"
ENV_DEFAULT_CONFIG = "DEFAULT_VGPU_CONFIG"
"""vgpu-device-manager's variable for its ``--default-vgpu-config`` (the GPU Operator sets it)."""
DEFAULT_SYSFS_ROOT = SYSFS_ROOT
DEFAULT_STATE_DIR = STATE_DIR
DEFAULT_DEVICE_PLUGIN_DIR = KUBELET_DEVICE_PLUGIN_DIR
AGENT_CONFIG_FILE = "config.yaml"
"""The file of the mounted layouts ConfigMap (``--config-dir DIR`` meant ``DIR/config.yaml``)."""

KUBECONFIG_HELP = "The cluster (default: in-cluster, then $KUBECONFIG or ~/.kube/config)."

RENAMED_FILE_FLAGS = ("--file", "--config-file")
"""Old spellings of ``--config`` (the layouts file)."""

RENAMED_FLAGS: dict[str, tuple[str, str]] = {
    # old -> (new flag, how the warning names the new spelling)
    "--plugin-dir": ("--device-plugin-dir", "--device-plugin-dir"),
    "--config-dir": ("--config", f"-f/--config DIR/{AGENT_CONFIG_FILE}"),
}
"""Old spellings rewritten to a new flag (``--config-dir``'s value gets the file name)."""

OUTPUT_FORMATS = ("text", "json")


class Shared:
    """One row of the flag table: a concept every command spells the same."""

    def __init__(
        self, name: str, opts: Sequence[str], default: object = None, envvar: str | None = None
    ) -> None:
        self.name = name
        self.opts = list(opts)
        self.default = default
        self.envvar = envvar


SHARED_OPTIONS: dict[str, Shared] = {
    s.name: s
    for s in (
        Shared("config_file", ["-f", "--config"], None, ENV_CONFIG_FILE),
        Shared("config_name", ["-c", "--config-name"], None, ENV_CONFIG_NAME),
        Shared("sysfs_root", ["--sysfs-root"], None),
        Shared("sim_spec", ["--sim"], None),
        Shared("node", ["--node"], None),
        Shared("label_key", ["--label-key"], "nvidia.com/vgpu.config"),
        Shared("default_config", ["--default-config"], None, ENV_DEFAULT_CONFIG),
        Shared("strict", ["--strict"], None),
        Shared("kubeconfig", ["--kubeconfig"], None),
        Shared("context", ["--context"], None),
        Shared("state_dir", ["--state-dir"], None, ENV_STATE_DIR),
        Shared(
            "device_plugin_dir",
            ["--device-plugin-dir"],
            DEFAULT_DEVICE_PLUGIN_DIR,
            ENV_DEVICE_PLUGIN_DIR,
        ),
        Shared("proc_root", ["--proc-root"], None),
        Shared("output", ["-o", "--output"], "text"),
        Shared("log_level", ["--log-level"], "info", ENV_LOG_LEVEL),
    )
}
"""The flag table (docs/cli.md, "One vocabulary"): parameter name -> spellings, default,
environment variable. ``export -o``'s default is ``yaml`` (it prints a layouts file)."""

DEPRECATED_SPELLINGS: dict[str, str] = {
    "--file": "-f/--config FILE",
    "--config-file": "-f/--config FILE",
    "--config NAME": "-c/--config-name NAME",
    "--config-dir": f"-f/--config DIR/{AGENT_CONFIG_FILE}",
    "--plugin-dir": "--device-plugin-dir",
    "--journal": "--state-dir DIR",
    "--lock-file": "--state-dir DIR",
    "-o table": "-o text",
}
"""Every old spelling that still works, and the new one its warning names."""


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
        if flag in RENAMED_FLAGS:
            new, named = RENAMED_FLAGS[flag]
            if flag not in warned:
                _warn_deprecated(flag, named)
                warned.add(flag)
            value = inline if inline is not None else (head[i + 1] if i + 1 < len(head) else None)
            if flag == "--config-dir" and value is not None:
                value = os.path.join(value, AGENT_CONFIG_FILE)
            if value is None:
                out.append(new)
            elif inline is not None:
                out.append(f"{new}={value}")
            else:
                out.extend([new, value])
                i += 1
        elif flag in RENAMED_FILE_FLAGS:
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
    *, required: bool = False, note: str | None = None, stdin: bool = True
) -> Callable[[F], F]:
    """``-f/--config FILE`` (``$VGPU_STATE_CONFIG_FILE``), the layouts file; ``note``:
    what this command does with it, after the shared meaning; ``stdin``: ``-`` reads
    standard input (not for a long-running process, which reads the file again)."""
    text = "The layouts file (- reads standard input)." if stdin else "The layouts file."
    if note:
        text += f" {note}"
    return click.option(
        "-f",
        "--config",
        "config_file",
        metavar="FILE",
        required=required,
        envvar=ENV_CONFIG_FILE,
        help=f"{text} Env: {ENV_CONFIG_FILE}.",
    )


def config_name_option(note: str | None = None) -> Callable[[F], F]:
    """``-c/--config-name NAME`` (``$VGPU_STATE_SELECTED_CONFIG``), the named layout;
    ``note``: what this command does with it, after the shared meaning."""
    text = "The named layout, instead of selecting one by the node's labels."
    if note:
        text += f" {note}"
    return click.option(
        "-c",
        "--config-name",
        "config_name",
        metavar="NAME",
        envvar=ENV_CONFIG_NAME,
        help=f"{text} Env: {ENV_CONFIG_NAME}.",
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


def sim_option(
    help: str = "A simulated node (its spec file) instead of sysfs.",
) -> Callable[[F], F]:
    """``--sim FILE``: a simulated node (docs/simulator.md)."""
    return click.option(
        "--sim", "sim_spec", metavar="FILE", type=click.Path(dir_okay=False), help=help
    )


def node_option(
    help: str = "The node's name (default: the simulated node's).", **kw: Any
) -> Callable[[F], F]:
    """``--node NAME``."""
    return click.option("--node", "node", metavar="NAME", help=help, **kw)


def label_key_option() -> Callable[[F], F]:
    """``--label-key KEY``: the node label that names a layout."""
    return click.option(
        "--label-key",
        default=SHARED_OPTIONS["label_key"].default,
        show_default=True,
        help="The node label that names a config.",
    )


def default_config_option() -> Callable[[F], F]:
    """``--default-config NAME`` (``$DEFAULT_VGPU_CONFIG``): the config of a node without
    the label that no node-selector matches, when the file has no ``default:``."""
    return click.option(
        "--default-config",
        "default_config",
        metavar="NAME",
        envvar=ENV_DEFAULT_CONFIG,
        help="The config of a node without the label that no node-selector matches, when "
        "the file has no default: (as vgpu-device-manager's --default-vgpu-config). "
        f"Env: {ENV_DEFAULT_CONFIG}.",
    )


def strict_option(help: str) -> Callable[[F], F]:
    """``--strict``: what is otherwise skipped or a warning is an error."""
    return click.option("--strict", "strict", is_flag=True, help=help)


STRICT_ENTRIES_HELP = (
    "An entry that selects no GPU of the node (an index past its GPUs, a device-filter "
    "matching none) is an error instead of a skipped entry."
)


def proc_root_option(help: str | None = None) -> Callable[[F], F]:
    """``--proc-root DIR``: where processes holding vGPUs are found."""
    return click.option(
        "--proc-root",
        type=click.Path(file_okay=False),
        help=help
        or "Find processes holding vGPUs under this /proc (default /proc; with --sim: the "
        "simulated one).",
    )


def nvidia_smi_option() -> Callable[[F], F]:
    """``--nvidia-smi CMD`` (``$VGPU_STATE_NVIDIA_SMI``): the tool that reads (and for
    ``apply`` changes) a GPU's MIG and mixed-size mode."""
    return click.option(
        "--nvidia-smi",
        envvar="VGPU_STATE_NVIDIA_SMI",
        help="The nvidia-smi command that reads and changes MIG and mixed-size mode (default "
        "/usr/bin/nvidia-smi when installed; '' for none). Env: VGPU_STATE_NVIDIA_SMI.",
    )


def state_dir_option() -> Callable[[F], F]:
    """``--state-dir DIR`` (``$VGPU_STATE_STATE_DIR``): the node's state files; ``None``
    when not given: ``/var/lib/vgpu-state``, or with ``--sim`` beside the spec."""
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False),
        envvar=ENV_STATE_DIR,
        metavar="DIR",
        help="The node's state: the apply journal, the host lock and the vGPU types the "
        f"driver listed [default: {DEFAULT_STATE_DIR}; with --sim: beside the spec]. "
        f"Env: {ENV_STATE_DIR}.",
    )


def device_plugin_dir_option(note: str = "") -> Callable[[F], F]:
    """``--device-plugin-dir DIR`` (``$VGPU_STATE_DEVICE_PLUGIN_DIR``)."""
    return click.option(
        "--device-plugin-dir",
        default=DEFAULT_DEVICE_PLUGIN_DIR,
        show_default=True,
        envvar=ENV_DEVICE_PLUGIN_DIR,
        metavar="DIR",
        help="The kubelet's device-plugins directory (its kubelet.sock registers each "
        f"plugin){note}. Env: {ENV_DEVICE_PLUGIN_DIR}.",
    )


def deprecated_option(flag: str, dest: str, help: str = "") -> Callable[[F], F]:
    """An old spelling kept for one release: hidden from ``--help``; when given, a
    warning names the new spelling (:data:`DEPRECATED_SPELLINGS`)."""

    def warn(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None and not ctx.resilient_parsing:
            source = ctx.get_parameter_source(param.name or dest)
            if source is click.core.ParameterSource.COMMANDLINE:
                _warn_deprecated(flag, DEPRECATED_SPELLINGS[flag])
        return value

    return click.option(flag, dest, hidden=True, callback=warn, expose_value=True, help=help)


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
    """``--kubeconfig FILE`` and ``--context NAME``: the cluster a command reads, on every
    command that takes one (one default rule: :data:`KUBECONFIG_HELP`)."""
    kubeconfig = click.option(
        "--kubeconfig", metavar="FILE", type=click.Path(dir_okay=False), help=KUBECONFIG_HELP
    )
    context = click.option(
        "--context", metavar="NAME", help="The kubeconfig context (default: its current context)."
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
    ``--kubeconfig FILE``, ``--context NAME`` and ``--namespace`` (``$POD_NAMESPACE``)."""
    kubeconfig = kubeconfig_options()
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


def closest(name: str, choices: Sequence[str]) -> str | None:
    """The choice ``name`` most likely misspells (difflib's similarity), or ``None``."""
    import difflib

    found = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


class SuggestingGroup(click.Group):
    """A group that answers a mistyped command with the command it most likely meant
    (``No such command 'plna'. Did you mean 'plan'?``), a usage error (exit 1)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if (
            args
            and not name.startswith("-")
            and not ctx.resilient_parsing
            and self.get_command(ctx, name) is None
        ):
            hint = closest(name, self.list_commands(ctx))
            tail = f" Did you mean {hint!r}?" if hint else ""
            raise click.UsageError(f"No such command {name!r}.{tail}", ctx)
        return super().resolve_command(ctx, args)


def json_requested(args: Sequence[str]) -> bool:
    """The command line asks for ``-o json`` (read before or without parsing it)."""
    args = list(args)
    end = args.index("--") if "--" in args else len(args)
    for i, token in enumerate(args[:end]):
        if token in ("-o", "--output") and i + 1 < end and args[i + 1] == "json":
            return True
        if token in ("-ojson", "--output=json"):
            return True
    return False
