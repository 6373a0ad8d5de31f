"""``vgpu-state fleet plan``: the cluster-wide dry run of a config file. Writes nothing.

Every node with a ``VGPUNodeState`` is planned as its agent would plan it:
the config selected by the Node's live labels, against the scan and holders
its agent last reported (see :mod:`vgpu_state.reconcile.fleet`).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from vgpu_state.cli.common import handle_errors
from vgpu_state.model.plan import ActionKind, Blocked, GpuPlan, Plan
from vgpu_state.reconcile.fleet import FleetPlan, NodePlan, Outcome, fleet_document

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

DEFAULT_MAX_AGE = "30m"
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> datetime.timedelta | None:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d``; ``0`` accepts any age (``None``)."""
    match = _DURATION.match(text)
    if match is None:
        raise click.BadParameter(
            f"{text!r}: expected a duration such as 90s, 15m, 2h or 0", param_hint="--max-age"
        )
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    return datetime.timedelta(seconds=seconds) if seconds else None


@click.group("fleet")
def fleet() -> None:
    """Commands over every node of a cluster."""


@fleet.command("plan")
@click.option(
    "-f",
    "--config-file",
    "config_file",
    required=True,
    envvar="VGPU_STATE_CONFIG_FILE",
    help="Config file (- for stdin). Env: VGPU_STATE_CONFIG_FILE.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    help="The cluster (default: in-cluster, then $KUBECONFIG or ~/.kube/config).",
)
@click.option("--context", help="The kubeconfig context (default: its current context).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table")
@click.option(
    "--max-age",
    default=DEFAULT_MAX_AGE,
    show_default=True,
    help="A node whose last scan is older is unknown (0: any age).",
)
@click.option(
    "--detailed-exitcode",
    is_flag=True,
    help="Exit 0 with no changes, 1 on error or unknown nodes, 2 when there are changes.",
)
@handle_errors
def plan_cmd(
    config_file: str,
    kubeconfig: str | None,
    context: str | None,
    output: str,
    max_age: str,
    detailed_exitcode: bool,
) -> None:
    """Plan every node that reports a VGPUNodeState against CONFIG (reads only).

    Each node gets the config its live labels select, planned against the scan
    and holders its agent last reported. Exit codes: 0 every node planned (or
    listed as unknown), 1 an error (the config, the cluster, or a node whose
    plan fails); with --detailed-exitcode 0 means every node is known and
    unchanged, 2 changes or blocked items, 1 also any unknown node.
    """
    from vgpu_state.catalog import default_catalog
    from vgpu_state.cli.session import config_source
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.fleet import read_fleet
    from vgpu_state.reconcile.fleet import plan_fleet
    from vgpu_state.reconcile.settings import Settings

    limit = parse_duration(max_age)
    settings = Settings(catalog=default_catalog())
    document = config_source(config_file, settings).document()
    api = KubeApi.connect(kubeconfig, context)
    try:
        nodes = read_fleet(api)
    finally:
        api.close()
    now = datetime.datetime.now(tz=datetime.UTC)
    result = plan_fleet(document, nodes, Settings(catalog=default_catalog()), now, limit)
    if output == "json":
        sys.stdout.write(json.dumps(fleet_document(result, config_file), indent=2) + "\n")
    else:
        render_table(result, config_file, _console())
    sys.exit(exit_code(result, detailed_exitcode))


def exit_code(result: FleetPlan, detailed: bool) -> int:
    """0 / 1 / 2 as the command's help and docs/cluster.md say."""
    if result.totals.errors:
        return 1
    if not detailed:
        return 0
    if result.totals.unknown:
        return 1
    return 2 if result.has_changes else 0


# rendering ---------------------------------------------------------------------------------
OUTCOME_STYLE = {
    Outcome.CHANGES: "yellow",
    Outcome.NO_CHANGES: "green",
    Outcome.UNKNOWN: "magenta",
    Outcome.ERROR: "bold red",
}
MARK_STYLE = {"+": "green", "-": "red", "~": "yellow", "!": "bold magenta"}


def _console() -> Console:
    from rich.console import Console

    if sys.stdout.isatty():
        return Console(highlight=False)
    width = int(os.environ.get("COLUMNS", "0") or 0)
    return Console(file=sys.stdout, highlight=False, width=max(width, 120))


def _source(source: str) -> str:
    if source == "label":
        return "node label"
    return source


def _heading(n: NodePlan) -> str:
    parts = [n.node]
    if n.plan is not None:
        sel = n.plan.selection
        text = f'config "{sel.config}" (by {_source(sel.source)})'
        if n.reported_config and n.reported_config != sel.config:
            text += f', was "{n.reported_config}"'
        parts.append(text)
    if n.scanned_at is not None:
        parts.append(f"scanned {n.scanned_at:%Y-%m-%dT%H:%M:%SZ}")
    return ": ".join(parts[:2]) + (f", {parts[2]}" if len(parts) > 2 else "")


def _gpu_name(g: GpuPlan) -> str:
    return f"{g.address} {g.model or 'unknown model'}"


def _grouped_blocked(items: tuple[Blocked, ...]) -> Iterator[tuple[int, Blocked]]:
    """Blocked items; creates of one type with one reason collapse into a count."""
    i = 0
    while i < len(items):
        b = items[i]
        n = 1
        if b.kind is not ActionKind.DESTROY:
            while (
                i + n < len(items)
                and items[i + n].kind is b.kind
                and (items[i + n].type_name, items[i + n].reason) == (b.type_name, b.reason)
            ):
                n += 1
        yield n, b
        i += n


def _rows(plan: Plan) -> Iterator[tuple[str, str, str, str, str]]:
    """(GPU, mark, count, vGPU type, detail) rows: actions counted by kind and type."""
    for g in plan.gpus:
        name = _gpu_name(g)
        counts: dict[tuple[ActionKind, str], int] = {}
        sriov: list[str] = []
        for a in plan.gpu_actions(g.address):
            if a.kind is ActionKind.ENABLE_SRIOV:
                after = (a.after or {}).get("sriov_numvfs")
                sriov.append(f"enable SR-IOV: {after} virtual functions")
                continue
            key = (a.kind, a.type_name or f"type id {a.type_id}")
            counts[key] = counts.get(key, 0) + 1
        blocked = plan.gpu_blocked(g.address)
        if not counts and not sriov and not blocked:
            continue
        kept = f"{g.kept} vGPU(s) unchanged" if g.managed else "not managed by this config"
        for (kind, type_name), n in counts.items():
            if kind is ActionKind.DESTROY:
                yield name, "-", str(n), type_name, "destroy"
                name = ""
        for line in sriov:
            yield name, "~", "", "", line
            name = ""
        for (kind, type_name), n in counts.items():
            if kind is ActionKind.CREATE:
                yield name, "+", str(n), type_name, "create"
                name = ""
        for n, b in _grouped_blocked(blocked):
            what = "cannot be destroyed" if b.kind is ActionKind.DESTROY else "cannot be created"
            yield name, "!", str(n), b.type_name or "", f"{what}: {b.reason}"
            name = ""
        yield "", "", "", "", kept


def node_table(n: NodePlan) -> Table:
    """One node's table: what would be destroyed, enabled, created and what is blocked."""
    from rich.table import Table
    from rich.text import Text

    assert n.plan is not None
    table = Table(expand=False)
    table.add_column("GPU", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_column("vGPU type", no_wrap=True)
    table.add_column("detail")
    for gpu, mark, count, type_name, detail in _rows(n.plan):
        style = MARK_STYLE.get(mark, "dim" if not mark else "")
        table.add_row(gpu, Text(mark, style=style), count, type_name, Text(detail, style=style))
    return table


def _summary(plan: Plan | None) -> tuple[str, str, str, str]:
    if plan is None:
        return "", "", "", ""
    s = plan.summary
    return str(s.create), str(s.destroy), str(s.sriov), str(s.blocked)


def fleet_table(result: FleetPlan) -> Table:
    """Every node on one line: config, outcome, counts, and why for unknown and errors."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Fleet", title_justify="left", title_style="bold")
    table.add_column("node", no_wrap=True)
    table.add_column("config")
    table.add_column("outcome", no_wrap=True)
    for head in ("create", "destroy", "SR-IOV", "blocked"):
        table.add_column(head, justify="right")
    table.add_column("note")
    for n in result.nodes:
        config = n.plan.selection.config if n.plan is not None else ""
        if n.reported_config and n.plan is not None and n.reported_config != config:
            config = f"{config} (was {n.reported_config})"
        note = f"{n.reason}: {n.message}" if n.reason else "; ".join(n.warnings)
        table.add_row(
            n.node,
            config,
            Text(n.outcome.value, style=OUTCOME_STYLE[n.outcome]),
            *_summary(n.plan),
            note,
        )
    return table


def totals_line(result: FleetPlan) -> str:
    t = result.totals
    return (
        f"Fleet: {t.nodes} node(s): {t.changed} with changes, {t.unchanged} unchanged, "
        f"{t.unknown} unknown, {t.errors} error(s). "
        f"{t.create} to create, {t.destroy} to destroy, {t.sriov} SR-IOV to enable, "
        f"{t.blocked} blocked."
    )


def render_table(result: FleetPlan, config_file: str, out: Console) -> None:
    """A table per node that would change, the fleet table, the totals."""
    from rich.text import Text

    out.print(
        f"Fleet plan of {config_file}: {result.totals.nodes} node(s) with a VGPUNodeState, "
        "each planned against the scan and holders it last reported. Nothing is changed."
    )
    for n in result.nodes:
        if n.outcome is Outcome.CHANGES:
            out.print()
            out.print(Text(_heading(n), style="bold"))
            out.print(node_table(n))
            for warning in n.warnings:
                out.print(Text(f"  warning: {warning}", style="yellow"))
    out.print()
    out.print(fleet_table(result))
    out.print()
    out.print(Text(totals_line(result), style="bold"))
