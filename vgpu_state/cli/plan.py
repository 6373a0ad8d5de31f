"""``vgpu-state plan``, ``apply``, ``assert``, ``export`` and ``history``."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import click

from vgpu_state.cli.common import (
    SessionArgs,
    fail,
    handle_errors,
    parse_in_use,
    parse_labels,
    selection_options,
)
from vgpu_state.cli.output import console, print_plan_text
from vgpu_state.cli.session import (
    Target,
    journal_for,
    open_host,
    ports,
    settings,
)
from vgpu_state.config import DEFAULT_LABEL_KEY
from vgpu_state.executor import ApplyError, ApplyResult, Journal, Outcome, StepResult
from vgpu_state.model.errors import SelectionError, StalePlanError, UserError, require_readable
from vgpu_state.model.files import read_input
from vgpu_state.model.plan import Action, Plan
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.planner import render_json, render_text
from vgpu_state.planner.saved import MAX_SAVED_PLAN_BYTES, parse_saved_plan, saved_plan_document
from vgpu_state.reconcile import (
    Mode,
    QuietReporter,
    Report,
    Settings,
    apply_saved,
    reconcile_once,
)

if TYPE_CHECKING:
    from rich.console import Console


def _open(args: SessionArgs, s: Settings) -> Target:
    if not args.config_file:
        raise SelectionError("missing the config file: pass -f FILE or set VGPU_STATE_CONFIG_FILE")
    if args.config_file == "-" and args.in_use_file == "-":
        raise click.UsageError("-f - and --in-use-file - cannot both read standard input")
    return open_host(args.sysfs_root, args.sim_spec, args.node, s)


def _reconcile(
    args: SessionArgs,
    target: Target,
    s: Settings,
    mode: Mode = Mode.PLAN,
    **kwargs: Any,
) -> Report:
    """One reconcile of the node named by the selection options."""
    assert args.config_file is not None
    node_ports = ports(
        target,
        args.config_file,
        parse_labels(args.labels),
        parse_in_use(args.in_use, args.in_use_file),
        s,
    )
    reporter = kwargs.pop("reporter", None) or _Warnings()
    cluster = None
    if args.kubeconfig or args.in_cluster:
        from vgpu_state.cli.kube import kube_ports

        node_ports, cluster = kube_ports(node_ports, target, args, mode, reporter.warning)
        reporter = cluster.reporter(reporter)
        if kwargs.get("gate") is not None:
            kwargs["gate"] = cluster.gate(kwargs["gate"], bool(kwargs.get("skip_blocked")))
    report = reconcile_once(
        node_ports,
        s,
        mode=mode,
        config_name=args.config_name,
        reporter=reporter,
        **kwargs,
    )
    if cluster is None:
        return report
    for action in cluster.applied:
        click.echo(f"  {action.op} {action.address}   resource: {action.resource}")
    return dataclasses.replace(report, plan=cluster.decorate(report.plan))


def _warn_unfinished(journal: Journal) -> None:
    unfinished = journal.unfinished()
    for warning in journal.warnings:
        click.echo(f"warning: {warning}", err=True)
    for u in unfinished:
        click.echo(f"warning: {u.describe()}", err=True)


def _when(ts: object) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))  # type: ignore[arg-type]
    except (OverflowError, OSError, ValueError, TypeError):
        return "(no time)"


@click.command("plan")
@selection_options
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), help="Save the plan here.")
@click.option(
    "--detailed-exitcode",
    is_flag=True,
    help="Exit 0 with no changes, 1 on error, 2 when there are changes or blocked items.",
)
@click.option("--journal", "journal_file", help="Journal file (to report unfinished applies).")
@handle_errors
def plan_cmd(
    session: SessionArgs,
    output: str,
    out_file: str | None,
    detailed_exitcode: bool,
    journal_file: str | None,
) -> None:
    """Show what apply would change: the minimal, safe diff. Changes nothing."""
    s = settings(session.label_key, session.sim_spec, journal_file)
    target = _open(session, s)
    try:
        _warn_unfinished(journal_for(journal_file, session.sim_spec))
        report = _reconcile(session, target, s)
        p = report.plan
        if output == "json":
            sys.stdout.write(render_json(p))
        else:
            print_plan_text(render_text(p))
        if out_file:
            _save_plan(out_file, report, session.sysfs_root, session.sim_spec)
            if output == "text":
                click.echo(f"\nSaved the plan to {out_file}. Apply exactly it with:")
                click.echo(f"  vgpu-state apply {out_file}")
    finally:
        target.close()
    if detailed_exitcode and not p.is_converged:
        sys.exit(2)


def _save_plan(path: str, report: Report, sysfs_root: str | None, sim_spec: str | None) -> None:
    i = report.inputs
    doc = saved_plan_document(report.plan, i.desired, i.snapshot, i.in_use, sim_spec, sysfs_root)
    try:
        Path(path).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    except OSError as e:
        fail(f"{path}: cannot save the plan: {e.strerror}")


class _Warnings(QuietReporter):
    """Prints the reconcile's warnings on stderr."""

    def warning(self, message: str) -> None:
        click.echo(f"warning: {message}", err=True)


class _ApplyOutput(_Warnings):
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
        type_name = f" {action.type_name}" if action.type_name else ""
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


def _report_apply_error(e: ApplyError) -> None:
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
@click.option("--journal", "journal_file", help="Journal file. Env: VGPU_STATE_JOURNAL.")
@click.option("--lock-file", help="Host lock file. Env: VGPU_STATE_LOCK_FILE.")
@click.option(
    "--lock-timeout",
    type=click.FloatRange(min=0, max=86400),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the host lock (0 to 86400).",
)
@click.option(
    "--sriov-manage",
    envvar="VGPU_STATE_SRIOV_MANAGE",
    help="The sriov-manage command (default /usr/lib/nvidia/sriov-manage when installed; "
    "'' writes sriov_numvfs). Env: VGPU_STATE_SRIOV_MANAGE.",
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
) -> None:
    """Plan, show the plan, ask, and apply it. With PLAN.json, apply exactly that plan."""
    if saved_plan:
        _apply_saved(
            saved_plan,
            session,
            skip_blocked,
            journal_file,
            lock_file,
            lock_timeout,
            sriov_manage,
        )
        return
    s = settings(
        session.label_key, session.sim_spec, journal_file, lock_file, lock_timeout, sriov_manage
    )
    target = _open(session, s)
    output = _ApplyOutput(console())
    try:
        _warn_unfinished(journal_for(journal_file, session.sim_spec))
        try:
            report = _reconcile(
                session,
                target,
                s,
                Mode.APPLY,
                skip_blocked=skip_blocked,
                gate=_confirm(auto_approve, skip_blocked),
                reporter=output,
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
        if p.blocked:
            fail("nothing can be applied: every change is blocked")
        if report.differences:
            fail(
                f'the node does not match configuration "{report.inputs.config}": '
                + "; ".join(report.differences)
            )
        return
    if not output.summary(p, report.applied, report.inputs.config, report.differences):
        sys.exit(1)


def _apply_saved(
    path: str,
    args: SessionArgs,
    skip_blocked: bool,
    journal_file: str | None,
    lock_file: str | None,
    lock_timeout: float,
    sriov_manage: str | None,
) -> None:
    saved = parse_saved_plan(read_input(path, MAX_SAVED_PLAN_BYTES, "saved plan"), path)
    sim_spec, sysfs_root = args.sim_spec, args.sysfs_root
    if not sim_spec and not sysfs_root:
        sim_spec, sysfs_root = saved.sim, saved.sysfs_root
    flagged = parse_in_use(args.in_use, args.in_use_file)
    s = settings(args.label_key, sim_spec, journal_file, lock_file, lock_timeout, sriov_manage)
    output = _ApplyOutput(console())
    target = open_host(sysfs_root, sim_spec, saved.plan.node, s)
    try:
        try:
            p, result = apply_saved(
                target.host,
                target.cluster.with_overrides(in_use=flagged),
                s,
                saved,
                skip_blocked=skip_blocked,
                reporter=output,
            )
        except StalePlanError as e:
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
    if result is not None and not output.summary(
        p, result, saved.desired.config, result.differences
    ):
        sys.exit(1)


@click.command("assert")
@selection_options
@click.option("--journal", "journal_file", help="Journal file (to report unfinished applies).")
@handle_errors
def assert_cmd(session: SessionArgs, journal_file: str | None) -> None:
    """Exit 0 when the node matches the selected config, 1 otherwise (listing differences)."""
    s = settings(session.label_key, session.sim_spec, journal_file)
    target = _open(session, s)
    try:
        _warn_unfinished(journal_for(journal_file, session.sim_spec))
        report = _reconcile(session, target, s)
    finally:
        target.close()
    config = report.inputs.desired.config
    if report.differences:
        click.echo(f'Assertion failure: the node does not match configuration "{config}":')
        for line in report.differences:
            click.echo(f"  {line}")
        sys.exit(1)
    click.echo(f'The node matches configuration "{config}" ({report.inputs.detail}).')


def export_document(snapshot: NodeSnapshot, name: str) -> dict[str, Any]:
    """A config document (vgpu-device-manager shape) that reproduces the live layout.

    ``default: name`` makes the config the node's when nothing else selects one, so
    ``plan -f`` on the document says "No changes" without ``-c``. Raises
    :class:`NothingToExportError` when no GPU of the node has a vGPU manager.
    """
    layouts: list[tuple[str, dict[str, int]]] = []
    for g in snapshot.gpus:
        if g.layout.value == "unavailable":
            continue
        counts: Counter[str] = Counter(v.type_name for v in g.vgpus if v.type_name)
        layouts.append((g.address, dict(sorted(counts.items()))))
    if not layouts:
        what = "no NVIDIA GPUs" if not snapshot.gpus else "no GPU with a vGPU manager"
        raise NothingToExportError(f"nothing to export: the node has {what}")
    distinct = {json.dumps(c, sort_keys=True) for _, c in layouts}
    entries: list[dict[str, Any]]
    if len(distinct) == 1 and len(layouts) == len(snapshot.gpus):
        entries = [{"devices": "all", "vgpu-devices": layouts[0][1]}]
    else:
        entries = [{"devices": [a], "vgpu-devices": c} for a, c in layouts]
    return {"version": "v1", "default": name, "vgpu-configs": {name: entries}}


class NothingToExportError(UserError):
    """The node has no layout to export (no GPU with a vGPU manager)."""


@click.command("export")
@click.option("--sysfs-root", type=click.Path(file_okay=False), help="sysfs root (default /sys).")
@click.option("--sim", "sim_spec", type=click.Path(dir_okay=False), help="A simulated node spec.")
@click.option("--node", help="Node name.")
@click.option(
    "--config-name",
    help="Name of the config (default: the node's config label when it has one, else current).",
)
@click.option("--label-key", default=DEFAULT_LABEL_KEY, show_default=True)
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml")
@handle_errors
def export_cmd(
    sysfs_root: str | None,
    sim_spec: str | None,
    node: str | None,
    config_name: str | None,
    label_key: str,
    output: str,
) -> None:
    """Print a config that reproduces the live vGPU layout.

    The config is also the document's default, and takes the name the node's config
    label gives, so planning against the document says "No changes".
    """
    target = open_host(sysfs_root, sim_spec, node, settings(label_key, sim_spec))
    try:
        snapshot = target.host.scan()
        labels = target.cluster.labels()
        require_readable(snapshot)
    finally:
        target.close()
    name = config_name or labels.get(label_key) or "current"
    doc = export_document(snapshot, name)
    skipped = sum(1 for g in snapshot.gpus for v in g.vgpus if not v.type_name)
    if skipped:
        click.echo(f"warning: {skipped} vGPU(s) of unknown type are not exported", err=True)
    if output == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.default_flow_style = False
    click.echo(f"# Exported by vgpu-state from {snapshot.node or 'the node'}")
    yaml.dump(doc, sys.stdout)


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
    plans: dict[str, dict[str, Any]] = {}
    for r in journal.records():
        pid = str(r.get("plan_id"))
        entry = plans.setdefault(pid, {"steps": [], "start": r, "end": None})
        if r.get("event") == "plan-start":
            entry["start"] = r
        elif r.get("event") == "action":
            entry["steps"].append(r)
        elif r.get("event") == "plan-end":
            entry["end"] = r
    for warning in journal.warnings:
        click.echo(f"warning: {warning}", err=True)
    if count == 0:
        return
    if not plans:
        click.echo(f"no applies recorded in {journal.path}")
        return
    for pid, entry in list(plans.items())[-count:]:
        start, end = entry["start"], entry["end"]
        when = _when(start.get("ts", 0))
        outcome = end.get("outcome") if end else "UNFINISHED"
        steps = Counter(s.get("outcome") for s in entry["steps"])
        took = f" in {end.get('seconds', 0):.2f} s" if end and "seconds" in end else ""
        click.echo(
            f"{when}  plan {pid}  node {start.get('node')}  config {start.get('config')!r} "
            f"({start.get('selection')})  {outcome}: {steps['ok']} done, "
            f"{steps['skipped']} already done, {steps['failed']} failed "
            f"of {start.get('actions', '?')}{took}"
        )
        if verbose:
            for s in entry["steps"]:
                err = f" errno {s['errno']}" if s.get("errno") else ""
                outcome_text, kind = str(s.get("outcome")), str(s.get("kind"))
                click.echo(f"    {outcome_text:8} {kind:13} {s.get('address')}{err}")
