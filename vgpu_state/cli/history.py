"""``vgpu-state history``: the journal of past applies, newest last."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter

import click

from vgpu_state.cli.common import handle_errors
from vgpu_state.cli.options import (
    deprecated_option,
    output_option,
    sim_option,
    state_dir_option,
)
from vgpu_state.cli.session import journal_for


def _when(ts: float | None) -> str:
    if ts is None:
        return "(no time)"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    except (OverflowError, OSError, ValueError, TypeError):
        return "(no time)"


@click.command("history")
@state_dir_option()
@deprecated_option("--journal", "journal_file")
@sim_option("The simulated node (its spec file) whose journal to show.")
@click.option(
    "-n",
    "count",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Last N applies.",
)
@click.option("-v", "--verbose", is_flag=True, help="List every step.")
@output_option()
@handle_errors
def history_cmd(
    state_dir: str | None,
    journal_file: str | None,
    sim_spec: str | None,
    count: int,
    verbose: bool,
    output: str,
) -> None:
    """Print the journal of past applies, newest last.

    \b
    Examples:
      vgpu-state history
      vgpu-state history --sim node.yaml -n 3 -v
      vgpu-state history --state-dir ./state -o json
    """
    journal = journal_for(journal_file, sim_spec, state_dir)
    applies = journal.applies()
    for warning in journal.warnings:
        click.echo(f"warning: {warning}", err=True)
    if output == "json":
        chosen = applies[-count:] if count else []
        doc = {"journal": str(journal.path), "applies": [dataclasses.asdict(a) for a in chosen]}
        click.echo(json.dumps(doc, indent=2))
        return
    if count == 0:
        return
    if not applies:
        click.echo(f"no applies recorded in {journal.path}")
        return
    for a in applies[-count:]:
        outcome = a.outcome if a.ended else "UNFINISHED"
        steps = Counter(s.outcome for s in a.steps)
        took = f" in {a.seconds:.2f} s" if a.seconds is not None else ""
        total = a.total if a.total is not None else "?"
        click.echo(
            f"{_when(a.started)}  plan {a.plan_id}  node {a.node}  config {a.config!r} "
            f"({a.selection})  {outcome}: {steps['ok']} done, "
            f"{steps['skipped']} already done, {steps['failed']} failed "
            f"of {total}{took}"
        )
        if verbose:
            for s in a.steps:
                err = f" errno {s.errno}" if s.errno else ""
                click.echo(f"    {s.outcome!s:8} {s.kind!s:13} {s.address}{err}")
