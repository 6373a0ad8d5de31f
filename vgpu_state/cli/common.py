"""Shared CLI plumbing: option sets, input loading, error reporting."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, ParamSpec, TypeVar

import click

from vgpu_state.cli.options import config_file_option, config_name_option, sysfs_root_option
from vgpu_state.inputfiles import (
    MAX_IN_USE_BYTES,
    InputFileError,
    decode_utf8,
    parse_in_use_list,
    read_input,
    read_stream,
)
from vgpu_state.model.errors import ConfigError, Reason, VgpuStateError
from vgpu_state.wellknown import KUBELET_POD_RESOURCES_SOCKET

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit 1."""
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


# What a flag of this command can do about an error (lower layers never name flags).
FLAG_HINTS: dict[Reason, str] = {
    Reason.NO_CONFIG_SELECTED: "or pass -c NAME",
    Reason.LOCKED: "or raise --lock-timeout",
    Reason.BLOCKED: "or pass --skip-blocked to apply the rest",
}


def _json_output() -> bool:
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.params.get("output") == "json"


def _json_error(reason: str, message: str, issues: list[str] | None = None) -> None:
    """With ``-o json`` a failure also prints one JSON object on stdout."""
    if _json_output():
        error: dict[str, object] = {"reason": reason, "message": message}
        if issues is not None:
            error["issues"] = issues
        click.echo(json.dumps({"error": error}, indent=2))


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn vgpu-state errors into ``file:line:col`` lines or ``error: …`` and exit 1.

    With ``-o json`` the error is also printed on stdout as ``{"error": {…}}``.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            lines = [str(issue) for issue in e.issues]
            _json_error(e.reason.value, lines[0] if lines else str(e), lines)
            for line in lines:
                click.echo(line, err=True)
            sys.exit(1)
        except VgpuStateError as e:
            hint = FLAG_HINTS.get(e.reason)
            message = f"{e} ({hint})" if hint else str(e)
            _json_error(e.reason.value, message)
            fail(message)
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            message = f"{where}{e.strerror or e}"
            _json_error("OSError", message)
            fail(message)

    return wrapper


def parse_labels(values: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--label")
        labels[key] = value
    return labels


def _stdin() -> object:
    return getattr(sys.stdin, "buffer", sys.stdin)


def parse_in_use(values: tuple[str, ...], file: str | None) -> dict[str, str]:
    """``--in-use KEY[=HOLDER]`` and ``--in-use-file`` (JSON object, or lines ``KEY [HOLDER]``)."""
    held: dict[str, str] = {}
    if file:
        if file == "-":
            data = read_stream(_stdin(), MAX_IN_USE_BYTES, "in-use list")
        else:
            data = read_input(file, MAX_IN_USE_BYTES, "in-use list")
        text = decode_utf8(data, "<stdin>" if file == "-" else file, "in-use list")
        try:
            held.update(parse_in_use_list(text, file))
        except InputFileError as e:
            raise click.BadParameter(str(e), param_hint="--in-use-file") from None
    for item in values:
        key, _, holder = item.partition("=")
        held[key.strip()] = holder.strip() or "an unnamed holder"
    return held


@dataclass(frozen=True)
class SessionArgs:
    """The selection and host options shared by plan, apply and assert."""

    config_file: str | None
    config_name: str | None
    node: str | None
    labels: tuple[str, ...]
    label_key: str
    sysfs_root: str | None
    sim_spec: str | None
    in_use: tuple[str, ...]
    in_use_file: str | None
    kubeconfig: str | None = None
    in_cluster: bool = False
    kubevirt: str | None = None
    pod_resources: str | None = None
    proc_root: str | None = None


SESSION_FIELDS = tuple(SessionArgs.__dataclass_fields__)


def selection_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``-f/--config``, ``-c/--config-name``, ``--node/--label/--label-key``, the host
    and in-use options.

    The command receives them as one :class:`SessionArgs` keyword, ``session``.
    """

    @functools.wraps(fn)
    def collect(*args: Any, **kwargs: Any) -> Any:
        session = SessionArgs(**{name: kwargs.pop(name) for name in SESSION_FIELDS})
        return fn(*args, session=session, **kwargs)

    wrapped: Callable[..., Any] = collect
    for decorator in reversed(
        [
            config_file_option(),
            config_name_option(),
            click.option("--node", "node", help="Node name (default: the simulated node's)."),
            click.option(
                "--label",
                "labels",
                multiple=True,
                metavar="KEY=VALUE",
                help="A node label used for selection (repeatable).",
            ),
            click.option(
                "--label-key",
                default="nvidia.com/vgpu.config",
                show_default=True,
                help="The node label that names a config.",
            ),
            sysfs_root_option(),
            click.option(
                "--sim",
                "sim_spec",
                type=click.Path(dir_okay=False),
                help="Use a simulated node described by this spec file.",
            ),
            click.option(
                "--in-use",
                "in_use",
                multiple=True,
                metavar="KEY[=HOLDER]",
                help="A vGPU (mdev UUID or VF address) held by a pod or VM (repeatable).",
            ),
            click.option(
                "--in-use-file",
                type=click.Path(dir_okay=False, allow_dash=True),
                help="In-use vGPUs: a JSON object {key: holder} or lines 'KEY HOLDER'.",
            ),
            click.option(
                "--kubeconfig",
                type=click.Path(dir_okay=False),
                help="Work on the Node --node of this cluster: its labels, held vGPUs, "
                "KubeVirt CR and status (see docs/cluster.md).",
            ),
            click.option(
                "--in-cluster",
                is_flag=True,
                help="Like --kubeconfig, with the pod's service account.",
            ),
            click.option(
                "--kubevirt",
                metavar="NAMESPACE/NAME",
                help="The KubeVirt CR (default: the only one in the cluster).",
            ),
            click.option(
                "--pod-resources",
                type=click.Path(dir_okay=False),
                help="The kubelet's pod-resources socket (default "
                f"{KUBELET_POD_RESOURCES_SOCKET}; with --sim: none).",
            ),
            click.option(
                "--proc-root",
                type=click.Path(file_okay=False),
                help="Find processes holding vGPUs under this /proc (default /proc; "
                "with --sim: the simulated one).",
            ),
        ]
    ):
        wrapped = decorator(wrapped)
    return wrapped
