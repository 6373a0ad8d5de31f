"""``vgpu-state plan``: show the changes apply would make; optionally save the plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from vgpu_state.cli.common import SessionArgs, fail, handle_errors, selection_options
from vgpu_state.cli.options import deprecated_option, nvidia_smi_option, output_option
from vgpu_state.cli.output import print_plan_text
from vgpu_state.cli.session import (
    journal_for,
    open_target,
    reconcile,
    settings,
    warn_unfinished,
)
from vgpu_state.planner.saved import saved_plan_document
from vgpu_state.reconcile import Report
from vgpu_state.render import render_json, render_text


@click.command("plan")
@selection_options
@output_option()
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False),
    help="Save the plan here (with -o json: only there; stdout stays empty).",
)
@click.option(
    "--detailed-exitcode",
    is_flag=True,
    help="Exit 0 with no changes, 1 on error, 2 when there are changes or blocked items.",
)
@deprecated_option("--journal", "journal_file")
@nvidia_smi_option()
@handle_errors
def plan_cmd(
    session: SessionArgs,
    output: str,
    out_file: str | None,
    detailed_exitcode: bool,
    journal_file: str | None,
    nvidia_smi: str | None,
) -> None:
    """Show what apply would change: the minimal, safe diff. Changes nothing.

    \b
    Examples:
      vgpu-state plan -f layouts.yaml
      vgpu-state plan -f configs/examples/mixed-node.yaml --sim node.yaml
      vgpu-state plan -f layouts.yaml -c a2-mixed --node gpu-7 --label pool=vdi
      vgpu-state plan -f layouts.yaml -o json --out plan.json
      vgpu-state plan -f layouts.yaml --kubeconfig ~/.kube/config --node gpu-7
    """
    s = settings(session.label_key, session.sim_spec, journal_file, directory=session.state_dir,
                 default_config=session.default_config, strict=session.strict,
                 nvidia_smi=nvidia_smi)  # fmt: skip
    target = open_target(session, s)
    try:
        warn_unfinished(journal_for(journal_file, session.sim_spec, session.state_dir))
        report = reconcile(session, target, s)
        p = report.plan
        if out_file:
            # Saved before anything is printed: a plan that cannot be saved is an error,
            # and -o json prints one document, the plan or the error.
            _save_plan(out_file, report, session.sysfs_root, session.sim_spec)
        if output == "json" and out_file:
            # The JSON goes to the file only; a note on stderr says where.
            click.echo(f"Saved the plan to {out_file} (apply it: vgpu-state apply {out_file})",
                       err=True)  # fmt: skip
        elif output == "json":
            sys.stdout.write(render_json(p))
        else:
            print_plan_text(render_text(p))
            if out_file:
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
        fail(f"{path}: cannot save the plan: {e.strerror}", "OSError", "host")
