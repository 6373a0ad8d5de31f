"""``vgpu-state apply``: plan, confirm and apply; or apply exactly a saved plan."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, ClassVar

import click

from vgpu_state.cli.common import (
    SessionArgs,
    fail,
    handle_errors,
    parse_in_use,
    selection_options,
)
from vgpu_state.cli.errors import json_output, print_error_document
from vgpu_state.cli.options import (
    deprecated_option,
    nvidia_smi_option,
    output_option,
    seconds_option,
)
from vgpu_state.cli.output import console, print_plan_text
from vgpu_state.cli.session import (
    Warnings,
    journal_for,
    open_host,
    open_target,
    reconcile,
    settings,
    warn_unfinished,
)
from vgpu_state.executor import ApplyError, ApplyResult, Outcome, StepResult
from vgpu_state.inputfiles import read_input
from vgpu_state.model.errors import StalePlanError
from vgpu_state.model.plan import Action, Plan
from vgpu_state.planner.saved import MAX_SAVED_PLAN_BYTES, parse_saved_plan
from vgpu_state.reconcile import Mode, apply_saved
from vgpu_state.render import render_json, render_text

if TYPE_CHECKING:
    from rich.console import Console


class _ApplyOutput(Warnings):
    """Renders an apply with rich: the plan, one line per step, a summary."""

    MARKS: ClassVar[dict[str, tuple[str, str]]] = {
        "ok": ("✓", "green"),
        "skipped": ("=", "cyan"),
        "failed": ("✗", "bold red"),
    }

    def __init__(self, out: Console) -> None:
        self.out = out

    def planned(self, plan: Plan) -> None:
        print_plan_text(render_text(plan))

    def applying(self, plan: Plan) -> None:
        self.out.print("\nApplying:")

    def step(self, action: Action, result: StepResult) -> None:
        from rich.text import Text

        mark, style = self.MARKS.get(result.outcome, ("?", ""))
        extra = " (already done)" if result.outcome is Outcome.SKIPPED else ""
        line = Text("  ")
        line.append(mark, style=style)
        type_name = f" {action.type_name or action.profile or ''}".rstrip()
        if action.enabled is not None:
            type_name = " on" if action.enabled else " off"
        line.append(
            f" {action.kind.value} {action.address}{type_name}{extra}"
            f"  {result.seconds * 1000:.1f} ms"
        )
        self.out.print(line)

    def applied(self, plan: Plan, result: ApplyResult) -> None:
        """Nothing yet: the summary waits for the fresh scan and its comparison."""
        return None

    def summary(
        self, plan: Plan, result: ApplyResult, config: str, differences: tuple[str, ...]
    ) -> bool:
        """Print the outcome after the fresh scan; True when the node matches its layout.

        "Apply complete" only when every planned step happened, nothing was blocked
        and the fresh scan shows the layout; otherwise what is missing and why.
        """
        c = result.counts
        counts = (
            f"{c['ok']} done, {c['skipped']} already done, "
            f"{len(plan.blocked)} blocked, in {result.seconds:.2f} s."
        )
        problems = (*result.notes, *differences)
        if not problems and not plan.blocked:
            self.out.print(f"\n[bold]Apply complete[/]: {counts}")
            return True
        self.out.print(f"\n[bold]Apply incomplete[/]: {counts}")
        click.echo(f'error: the node does not match configuration "{config}":', err=True)
        for line in problems:
            click.echo(f"  {line}", err=True)
        return False


class _JsonApplyOutput(Warnings):
    """``apply -o json``: nothing on stdout until the end, then one JSON object (the plan,
    every step, the outcome after the fresh scan)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def planned(self, plan: Plan) -> None:
        return None

    def applying(self, plan: Plan) -> None:
        return None

    def step(self, action: Action, result: StepResult) -> None:
        self.steps.append(
            {
                "kind": action.kind.value,
                "address": action.address,
                "type_name": action.type_name,
                "outcome": str(result.outcome),
                "seconds": round(result.seconds, 6),
            }
        )

    def applied(self, plan: Plan, result: ApplyResult) -> None:
        return None

    def summary(
        self, plan: Plan, result: ApplyResult | None, config: str, differences: tuple[str, ...]
    ) -> bool:
        notes = tuple(result.notes) if result is not None else ()
        problems = (*notes, *differences)
        complete = result is not None and not problems and not plan.blocked
        counts = result.counts if result is not None else {}
        doc = {
            "plan": json.loads(render_json(plan)),
            "config": config,
            "outcome": "complete" if complete else ("no-changes" if result is None and not
                                                    problems and not plan.blocked else
                                                    "incomplete"),
            "done": counts.get("ok", 0),
            "already_done": counts.get("skipped", 0),
            "blocked": len(plan.blocked),
            "seconds": round(result.seconds, 6) if result is not None else 0.0,
            "steps": self.steps,
            "differences": list(problems),
        }  # fmt: skip
        click.echo(json.dumps(doc, indent=2))
        return complete or doc["outcome"] == "no-changes"


def _report_apply_error(e: ApplyError) -> None:
    if json_output():
        print_error_document(e.reason.value, e.kind.value, str(e))
    click.echo(f"\nerror: {e}", err=True)
    if e.not_run:
        click.echo("not run:", err=True)
        for a in e.not_run:
            click.echo(f"  {a.kind.value} {a.address}", err=True)
    click.echo("Run `vgpu-state plan` to see the remaining work.", err=True)


def _confirm(auto_approve: bool, skip_blocked: bool) -> Any:
    """The CLI's gate: refuse blocked plans without --skip-blocked, then ask."""

    def gate(p: Plan) -> bool:
        if p.blocked and not skip_blocked:
            fail(
                f"{len(p.blocked)} item(s) are blocked; nothing was changed. Resolve them "
                "or pass --skip-blocked to apply the rest"
            )
        if not p.actions:
            fail("nothing can be applied: every change is blocked")
        if not auto_approve:
            if not sys.stdin.isatty():
                fail("refusing to apply without confirmation: no terminal; pass --auto-approve")
            if not click.confirm("\nApply these changes?", default=False):
                fail("apply cancelled; nothing was changed")
        return True

    return gate


@click.command("apply")
@click.argument("saved_plan", required=False, type=click.Path(dir_okay=False))
@selection_options
@click.option("--auto-approve", is_flag=True, help="Apply without asking for confirmation.")
@click.option("--skip-blocked", is_flag=True, help="Apply the rest when some items are blocked.")
@deprecated_option("--journal", "journal_file")
@deprecated_option("--lock-file", "lock_file")
@seconds_option(
    "--lock-timeout", 30.0, "Seconds to wait for the host lock (0 to 86400).", maximum=86400
)
@click.option(
    "--sriov-manage",
    envvar="VGPU_STATE_SRIOV_MANAGE",
    help="The sriov-manage command (default /usr/lib/nvidia/sriov-manage when installed; "
    "'' writes sriov_numvfs). Env: VGPU_STATE_SRIOV_MANAGE.",
)
@nvidia_smi_option()
@output_option(
    help="text: the plan, each step and the outcome; json: one object at the end "
    "(needs --auto-approve or a saved plan)."
)
@handle_errors
def apply_cmd(
    saved_plan: str | None,
    session: SessionArgs,
    auto_approve: bool,
    skip_blocked: bool,
    journal_file: str | None,
    lock_file: str | None,
    lock_timeout: float,
    sriov_manage: str | None,
    nvidia_smi: str | None,
    output: str,
) -> None:
    """Plan, show the plan, ask, and apply it. With PLAN.json, apply exactly that plan.

    Every "Apply complete" follows a fresh scan of the host that matches the layout.

    \b
    Examples:
      vgpu-state apply -f layouts.yaml
      vgpu-state apply -f configs/examples/mixed-node.yaml --sim node.yaml --auto-approve
      vgpu-state plan -f layouts.yaml --out plan.json && vgpu-state apply plan.json
      vgpu-state apply -f layouts.yaml --auto-approve --skip-blocked -o json
    """
    if output == "json" and not saved_plan and not auto_approve:
        raise click.UsageError("-o json cannot ask for confirmation: pass --auto-approve")
    if saved_plan:
        _apply_saved(
            saved_plan,
            session,
            skip_blocked,
            journal_file,
            lock_file,
            lock_timeout,
            sriov_manage,
            output,
            nvidia_smi,
        )
        return
    s = settings(
        session.label_key,
        session.sim_spec,
        journal_file,
        lock_file,
        lock_timeout,
        sriov_manage,
        session.state_dir,
        default_config=session.default_config,
        strict=session.strict,
        nvidia_smi=nvidia_smi,
    )
    target = open_target(session, s, record=True)
    out = _JsonApplyOutput() if output == "json" else _ApplyOutput(console())
    try:
        warn_unfinished(journal_for(journal_file, session.sim_spec, session.state_dir))
        try:
            report = reconcile(
                session,
                target,
                s,
                Mode.APPLY,
                skip_blocked=skip_blocked,
                gate=_confirm(auto_approve, skip_blocked),
                reporter=out,
            )
        except ApplyError as e:
            _report_apply_error(e)
            target.save()
            sys.exit(1)
        if report.applied is not None and report.applied.steps:
            target.save()
    finally:
        target.close()
    p = report.plan
    if report.applied is None or not report.applied.steps:
        if isinstance(out, _JsonApplyOutput):
            if not out.summary(p, None, report.inputs.config, report.differences):
                sys.exit(1)
            return
        if p.blocked:
            fail("nothing can be applied: every change is blocked")
        if report.differences:
            fail(
                f'the node does not match configuration "{report.inputs.config}": '
                + "; ".join(report.differences)
            )
        return
    if not out.summary(p, report.applied, report.inputs.config, report.differences):
        sys.exit(1)


def _apply_saved(
    path: str,
    args: SessionArgs,
    skip_blocked: bool,
    journal_file: str | None,
    lock_file: str | None,
    lock_timeout: float,
    sriov_manage: str | None,
    output_format: str = "text",
    nvidia_smi: str | None = None,
) -> None:
    saved = parse_saved_plan(read_input(path, MAX_SAVED_PLAN_BYTES, "saved plan"), path)
    sim_spec, sysfs_root = args.sim_spec, args.sysfs_root
    if not sim_spec and not sysfs_root:
        sim_spec, sysfs_root = saved.sim, saved.sysfs_root
    flagged = parse_in_use(args.in_use, args.in_use_file)
    s = settings(
        args.label_key,
        sim_spec,
        journal_file,
        lock_file,
        lock_timeout,
        sriov_manage,
        args.state_dir,
        nvidia_smi=nvidia_smi,
    )
    output: _ApplyOutput | _JsonApplyOutput = (
        _JsonApplyOutput() if output_format == "json" else _ApplyOutput(console())
    )
    target = open_host(
        sysfs_root, sim_spec, saved.plan.node, s, record=True, proc_root=args.proc_root
    )
    try:
        try:
            p, result = apply_saved(
                target.host,
                target.cluster.with_overrides(in_use=flagged),
                s,
                saved,
                skip_blocked=skip_blocked,
                reporter=output,
                processes=target.processes,
            )
        except StalePlanError as e:
            if json_output():
                print_error_document(e.reason.value, e.kind.value, f"{e}: " + "; ".join(e.changes))
            click.echo(f"error: {e}. What moved:", err=True)
            for line in e.changes:
                click.echo(f"  {line}", err=True)
            click.echo("Run `vgpu-state plan` again.", err=True)
            sys.exit(1)
        except ApplyError as e:
            _report_apply_error(e)
            target.save()
            sys.exit(1)
        if result is not None:
            target.save()
    finally:
        target.close()
    if result is None and isinstance(output, _JsonApplyOutput):
        output.summary(p, None, saved.desired.config, ())
        return
    if result is not None and not output.summary(
        p, result, saved.desired.config, result.differences
    ):
        sys.exit(1)
