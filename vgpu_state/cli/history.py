"""``vgpu-state history``: the journal of past applies, newest last."""

from __future__ import annotations

import time
from collections import Counter

import click

from vgpu_state.cli.common import handle_errors
from vgpu_state.cli.session import journal_for


def _when(ts: float | None) -> str:
    if ts is None:
        return "(no time)"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    except (OverflowError, OSError, ValueError, TypeError):
        return "(no time)"


@click.command("history")
@click.option("--journal", "journal_file", help="Journal file. Env: VGPU_STATE_JOURNAL.")
@click.option("--sim", "sim_spec", type=click.Path(dir_okay=False), help="The sim spec's journal.")
@click.option(
    "-n", "count", type=click.IntRange(min=0), default=10, show_default=True,
    help="Last N applies.",
)
@click.option("-v", "--verbose", is_flag=True, help="List every step.")
@handle_errors
def history_cmd(journal_file: str | None, sim_spec: str | None, count: int, verbose: bool) -> None:
    """Print the journal of past applies, newest last."""
    journal = journal_for(journal_file, sim_spec)
    applies = journal.applies()
    for warning in journal.warnings:
        click.echo(f"warning: {warning}", err=True)
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
