"""Shared CLI plumbing: option sets, input loading, error reporting."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, ParamSpec, TypeVar

import click

from vgpu_state.cli.errors import report
from vgpu_state.cli.options import (
    KUBECONFIG_HELP,
    STRICT_ENTRIES_HELP,
    config_file_option,
    config_name_option,
    default_config_option,
    label_key_option,
    node_option,
    proc_root_option,
    sim_option,
    state_dir_option,
    strict_option,
    sysfs_root_option,
)
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


def fail(message: str, reason: str = "Failed", kind: str = "user") -> NoReturn:
    """Print ``error: message`` on stderr (with ``-o json`` also the error document on
    stdout, :mod:`vgpu_state.cli.errors`) and exit 1."""
    report(reason, kind, message)


# What a flag of this command can do about an error (lower layers never name flags).
FLAG_HINTS: dict[Reason, str] = {
    Reason.NO_CONFIG_SELECTED: "or pass -c NAME",
    Reason.LOCKED: "or raise --lock-timeout",
    Reason.BLOCKED: "or pass --skip-blocked to apply the rest",
}


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn vgpu-state errors into ``file:line:col`` lines or ``error: …`` and exit 1.

    With ``-o json`` the error is also printed on stdout as the one error document
    (:func:`vgpu_state.cli.errors.error_document`).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            lines = [str(issue) for issue in e.issues] or [str(e)]
            report(e.reason.value, e.kind.value, lines[0], issues=e.issues, text=lines)
        except VgpuStateError as e:
            hint = FLAG_HINTS.get(e.reason)
            message = f"{e} ({hint})" if hint else str(e)
            report(e.reason.value, e.kind.value, message)
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            report("OSError", "host", f"{where}{e.strerror or e}")

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
    context: str | None = None
    state_dir: str | None = None
    default_config: str | None = None
    strict: bool = False


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
            node_option(),
            click.option(
                "--label",
                "labels",
                multiple=True,
                metavar="KEY=VALUE",
                help="A node label used for selection (repeatable).",
            ),
            label_key_option(),
            default_config_option(),
            strict_option(STRICT_ENTRIES_HELP),
            sysfs_root_option(),
            sim_option(),
            state_dir_option(),
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
                metavar="FILE",
                type=click.Path(dir_okay=False),
                help=f"{KUBECONFIG_HELP} Given (or --context, --in-cluster): work on the Node "
                "--node of this cluster: its labels, held vGPUs, KubeVirt CR and status "
                "(docs/cluster.md).",
            ),
            click.option(
                "--context",
                metavar="NAME",
                help="The kubeconfig context (default: its current context).",
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
            proc_root_option(),
        ]
    ):
        wrapped = decorator(wrapped)
    return wrapped
