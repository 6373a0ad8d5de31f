"""``vgpu-state plan``, ``apply``, ``assert``, ``export`` and ``history``."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
    Session,
    close_host,
    default_state_path,
    open_host,
    open_session,
    save_simulated,
)
from vgpu_state.executor import ApplyError, HostLock, Journal, StepResult, apply
from vgpu_state.model.errors import SelectionError
from vgpu_state.model.files import read_input
from vgpu_state.model.inuse import InUse
from vgpu_state.model.plan import Action, Plan
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.planner import plan as make_plan
from vgpu_state.planner import render_json, render_text
from vgpu_state.planner.inuse import normalise_in_use
from vgpu_state.planner.saved import (
    MAX_SAVED_PLAN_BYTES,
    check_saved_plan,
    parse_saved_plan,
    saved_plan_document,
)


def _session(args: SessionArgs, sriov_manage: str | None = None) -> Session:
    if not args.config_file:
        raise SelectionError("missing the config file: pass -f FILE or set VGPU_STATE_CONFIG_FILE")
    s = open_session(
        args.config_file,
        args.config_name,
        args.node,
        parse_labels(args.labels),
        args.label_key,
        args.sysfs_root,
        args.sim_spec,
        parse_in_use(args.in_use, args.in_use_file),
        sriov_manage,
    )
    for warning in s.warnings:
        click.echo(f"warning: {warning}", err=True)
    return s


def _warn_unfinished(journal: Journal) -> None:
    for u in journal.unfinished():
        click.echo(f"warning: {u.describe()}", err=True)


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
    s = _session(session)
    try:
        _warn_unfinished(s.journal(journal_file))
        p = make_plan(s.desired, s.snapshot, s.in_use)
        if output == "json":
            sys.stdout.write(render_json(p))
        else:
            print_plan_text(render_text(p))
        if out_file:
            _save_plan(out_file, p, s, session.sysfs_root, session.sim_spec)
            if output == "text":
                click.echo(f"\nSaved the plan to {out_file}. Apply exactly it with:")
                click.echo(f"  vgpu-state apply {out_file}")
    finally:
        s.close()
    if detailed_exitcode and not p.is_converged:
        sys.exit(2)


def _save_plan(
    path: str, p: Plan, s: Session, sysfs_root: str | None, sim_spec: str | None
) -> None:
    doc = saved_plan_document(p, s.desired, s.snapshot, s.in_use, sim_spec, sysfs_root)
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _progress(out: Any) -> Any:
    from rich.text import Text

    marks = {"ok": ("✓", "green"), "skipped": ("=", "cyan"), "failed": ("✗", "bold red")}

    def report(a: Action, r: StepResult) -> None:
        mark, style = marks.get(r.outcome, ("?", ""))
        extra = " (already done)" if r.outcome == "skipped" else ""
        line = Text("  ")
        line.append(mark, style=style)
        line.append(
            f" {a.kind.value} {a.address}{' ' + a.type_name if a.type_name else ''}{extra}"
            f"  {r.seconds * 1000:.1f} ms"
        )
        out.print(line)

    return report


def _run_apply(
    p: Plan,
    host: Any,
    snapshot: NodeSnapshot,
    in_use: Mapping[str, str],
    journal: Journal,
    skip_blocked: bool,
) -> bool:
    """Run the plan, print progress and a summary; True when the node converged."""
    out = console()
    out.print("\nApplying:")
    try:
        result = apply(
            p,
            host,
            journal=journal,
            in_use=in_use,
            skip_blocked=skip_blocked,
            progress=_progress(out),
            snapshot=snapshot,
        )
    except ApplyError as e:
        click.echo(f"\nerror: {e}", err=True)
        if e.not_run:
            click.echo("not run:", err=True)
            for a in e.not_run:
                click.echo(f"  {a.kind.value} {a.address}", err=True)
        click.echo("Run `vgpu-state plan` to see the remaining work.", err=True)
        return False
    c = result.counts
    out.print(
        f"\n[bold]Apply complete[/]: {c['ok']} done, {c['skipped']} already done, "
        f"{len(p.blocked)} blocked, in {result.seconds:.2f} s."
    )
    return not p.blocked


@click.command("apply")
@click.argument("saved_plan", required=False, type=click.Path(dir_okay=False))
@selection_options
@click.option("--auto-approve", is_flag=True, help="Apply without asking for confirmation.")
@click.option("--skip-blocked", is_flag=True, help="Apply the rest when some items are blocked.")
@click.option("--journal", "journal_file", help="Journal file. Env: VGPU_STATE_JOURNAL.")
@click.option("--lock-file", help="Host lock file. Env: VGPU_STATE_LOCK_FILE.")
@click.option(
    "--lock-timeout", type=float, default=30.0, show_default=True, help="Seconds to wait."
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
    lock = default_state_path(lock_file, "VGPU_STATE_LOCK_FILE", session.sim_spec, "lock")
    with HostLock(lock, lock_timeout):
        s = _session(session, sriov_manage)
        try:
            journal = s.journal(journal_file)
            _warn_unfinished(journal)
            p = make_plan(s.desired, s.snapshot, s.in_use)
            print_plan_text(render_text(p))
            if not p.actions and (skip_blocked or not p.blocked):
                _settle_unfinished(p, s, journal)
            if p.is_converged:
                return
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
            ok = _run_apply(p, s.host, s.snapshot, s.in_use, journal, skip_blocked)
            s.save_sim()
        finally:
            s.close()
    if not ok:
        sys.exit(1)


def _settle_unfinished(p: Plan, s: Session, journal: Journal) -> None:
    """Nothing left to run: journal an empty apply so interrupted plans count as finished."""
    if journal.unfinished():
        apply(p, s.host, journal=journal, in_use=s.in_use, skip_blocked=True, snapshot=s.snapshot)


def _diff_views(saved: dict[str, Any], live: dict[str, Any]) -> list[str]:
    def index(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {g["address"]: g for g in view.get("gpus", [])}

    a, b = index(saved), index(live)
    lines: list[str] = []
    for address in sorted(set(a) | set(b)):
        old, new = a.get(address), b.get(address)
        if old is None or new is None:
            lines.append(f"gpu[{address}] {'appeared' if old is None else 'disappeared'}")
            continue
        if old["sriov_numvfs"] != new["sriov_numvfs"]:
            lines.append(
                f"gpu[{address}] sriov_numvfs {old['sriov_numvfs']} -> {new['sriov_numvfs']}"
            )
        before = {tuple(v) for v in old["vgpus"]}
        after = {tuple(v) for v in new["vgpus"]}
        for v in sorted(after - before):
            lines.append(f"gpu[{address}] + vGPU {v[2] or v[1]} ({v[4]}) appeared")
        for v in sorted(before - after):
            lines.append(f"gpu[{address}] - vGPU {v[2] or v[1]} ({v[4]}) disappeared")
    return lines


def _apply_saved(
    path: str,
    session: SessionArgs,
    skip_blocked: bool,
    journal_file: str | None,
    lock_file: str | None,
    lock_timeout: float,
    sriov_manage: str | None,
) -> None:
    saved = parse_saved_plan(read_input(path, MAX_SAVED_PLAN_BYTES, "saved plan"), path)
    p = saved.plan
    sim_spec, sysfs_root = session.sim_spec, session.sysfs_root
    if not sim_spec and not sysfs_root:
        sim_spec, sysfs_root = saved.sim, saved.sysfs_root
    flagged = parse_in_use(session.in_use, session.in_use_file)
    lock = default_state_path(lock_file, "VGPU_STATE_LOCK_FILE", sim_spec, "lock")
    with HostLock(lock, lock_timeout):
        target = open_host(sysfs_root, sim_spec, p.node, sriov_manage)
        try:
            snapshot = target.host.scan()
            if snapshot.fingerprint() != p.snapshot_fingerprint:
                click.echo(
                    "error: saved plan is stale: the host changed after the plan was made; "
                    "nothing was changed. What moved:",
                    err=True,
                )
                for line in _diff_views(saved.snapshot_view, snapshot.stable_view()):
                    click.echo(f"  {line}", err=True)
                click.echo("Run `vgpu-state plan` again.", err=True)
                sys.exit(1)
            live = target.cluster.with_overrides(in_use=flagged).in_use()
            held, warnings = normalise_in_use(live, snapshot)
            for warning in warnings:
                click.echo(f"warning: {warning}", err=True)
            p = check_saved_plan(saved, snapshot, held)
            print_plan_text(render_text(p))
            if p.is_converged:
                return
            if p.blocked and not skip_blocked:
                fail(f"{len(p.blocked)} item(s) are blocked; pass --skip-blocked to apply the rest")
            journal = Journal(
                default_state_path(journal_file, "VGPU_STATE_JOURNAL", sim_spec, "journal")
            )
            in_use = InUse({**saved.in_use, **held})
            ok = _run_apply(p, target.host, snapshot, in_use, journal, skip_blocked)
            save_simulated(target)
        finally:
            close_host(target)
    if not ok:
        sys.exit(1)


@click.command("assert")
@selection_options
@click.option("--journal", "journal_file", help="Journal file (to report unfinished applies).")
@handle_errors
def assert_cmd(session: SessionArgs, journal_file: str | None) -> None:
    """Exit 0 when the node matches the selected config, 1 otherwise (listing differences)."""
    s = _session(session)
    try:
        _warn_unfinished(s.journal(journal_file))
        differences = []
        for dg in s.desired.gpus:
            g = s.snapshot.gpu(dg.address)
            live = Counter(v.type_name or f"type id {v.type_id}" for v in (g.vgpus if g else ()))
            want = Counter({n: c for n, c in dg.types if c})
            for name in sorted(set(live) | set(want)):
                if live[name] < want[name]:
                    differences.append(
                        f"gpu[{dg.address}]: {want[name] - live[name]} × {name} missing "
                        f"(want {want[name]}, have {live[name]})"
                    )
                elif live[name] > want[name]:
                    differences.append(
                        f"gpu[{dg.address}]: {live[name] - want[name]} × {name} not wanted "
                        f"(want {want[name]}, have {live[name]})"
                    )
    finally:
        s.close()
    if differences:
        click.echo(
            f'Assertion failure: the node does not match configuration "{s.desired.config}":'
        )
        for line in differences:
            click.echo(f"  {line}")
        sys.exit(1)
    click.echo(f'The node matches configuration "{s.desired.config}" ({s.selection_detail}).')


def export_document(snapshot: NodeSnapshot, name: str) -> dict[str, Any]:
    """A config document (vgpu-device-manager shape) that reproduces the live layout."""
    layouts: list[tuple[str, dict[str, int]]] = []
    for g in snapshot.gpus:
        if g.layout.value == "unavailable":
            continue
        counts: Counter[str] = Counter(v.type_name for v in g.vgpus if v.type_name)
        layouts.append((g.address, dict(sorted(counts.items()))))
    distinct = {json.dumps(c, sort_keys=True) for _, c in layouts}
    entries: list[dict[str, Any]]
    if len(distinct) == 1 and len(layouts) == len(snapshot.gpus):
        entries = [{"devices": "all", "vgpu-devices": layouts[0][1]}]
    else:
        entries = [{"devices": [a], "vgpu-devices": c} for a, c in layouts]
    return {"version": "v1", "vgpu-configs": {name: entries}}


@click.command("export")
@click.option("--sysfs-root", type=click.Path(file_okay=False), help="sysfs root (default /sys).")
@click.option("--sim", "sim_spec", type=click.Path(dir_okay=False), help="A simulated node spec.")
@click.option("--node", help="Node name.")
@click.option("--config-name", default="current", show_default=True, help="Name of the config.")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml")
@handle_errors
def export_cmd(
    sysfs_root: str | None, sim_spec: str | None, node: str | None, config_name: str, output: str
) -> None:
    """Print a config that reproduces the live vGPU layout (plan against it: No changes)."""
    target = open_host(sysfs_root, sim_spec, node)
    try:
        snapshot = target.host.scan()
    finally:
        close_host(target)
    doc = export_document(snapshot, config_name)
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
@click.option("-n", "count", type=int, default=10, show_default=True, help="Last N applies.")
@click.option("-v", "--verbose", is_flag=True, help="List every step.")
@handle_errors
def history_cmd(journal_file: str | None, sim_spec: str | None, count: int, verbose: bool) -> None:
    """Print the journal of past applies, newest last."""
    journal = Journal(default_state_path(journal_file, "VGPU_STATE_JOURNAL", sim_spec, "journal"))
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
    if not plans:
        click.echo(f"no applies recorded in {journal.path}")
        return
    for pid, entry in list(plans.items())[-count:]:
        start, end = entry["start"], entry["end"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(start.get("ts", 0))))
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
                click.echo(f"    {s.get('outcome'):8} {s.get('kind'):13} {s.get('address')}{err}")
