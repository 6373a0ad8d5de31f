"""``vgpu-state doctor``: can this host run vGPUs, and if not, why (plain sentences)."""

from __future__ import annotations

import os
import shutil
import sys

import click

from vgpu_state.cli.common import SessionArgs, handle_errors, selection_options
from vgpu_state.cli.options import output_option
from vgpu_state.cli.session import open_host, reconcile, settings
from vgpu_state.doctor.checks import (
    SmiTool,
    SriovTool,
    Status,
    config_checks,
    config_failure,
    diagnose,
)
from vgpu_state.model.errors import ConfigError, VgpuStateError
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.reconcile import NoGpusError, QuietReporter, Settings
from vgpu_state.render.doctor import render_report, render_report_json
from vgpu_state.wellknown import NVIDIA_SMI, SRIOV_MANAGE


class _Heard(QuietReporter):
    """Keeps the reconcile's warnings (the config's and the cluster's), once each,
    so that doctor shows them as checks rather than on stderr."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


def _sriov_tool(session: SessionArgs, s: Settings) -> SriovTool:
    """The sriov-manage the node would use: the simulated one, the flag's, or the installed one."""
    if session.sim_spec:
        from vgpu_state.sim.spec import load_spec

        spec = load_spec(session.sim_spec, catalog=s.catalog)
        if spec.sriov_manage:
            return SriovTool(command="sriov-manage (simulated)", found=True)
        return SriovTool(command="", found=True, missing="the simulated sriov-manage")
    if s.sriov_manage is None:
        if os.access(SRIOV_MANAGE, os.X_OK):
            return SriovTool(command=SRIOV_MANAGE, found=True)
        # apply then writes sriov_numvfs itself (see Settings.sriov_manage).
        return SriovTool(command="", found=True, missing=SRIOV_MANAGE)
    if not s.sriov_manage:
        return SriovTool(command="", found=True)
    program = s.sriov_manage[0]
    found = shutil.which(program) is not None
    return SriovTool(command=" ".join(s.sriov_manage), found=found)


def _smi_tool(session: SessionArgs, s: Settings) -> SmiTool:
    """The nvidia-smi the node would use: the simulated one, the flag's, or the installed one."""
    if session.sim_spec:
        from vgpu_state.sim.spec import load_spec

        spec = load_spec(session.sim_spec, catalog=s.catalog)
        if spec.nvidia_smi:
            return SmiTool(command="nvidia-smi (simulated)", found=True)
        return SmiTool(command="", found=False, missing="the simulated nvidia-smi")
    if s.nvidia_smi is None:
        if os.access(NVIDIA_SMI, os.X_OK):
            return SmiTool(command=NVIDIA_SMI, found=True)
        return SmiTool(command="", found=False, missing=NVIDIA_SMI)
    if not s.nvidia_smi:
        return SmiTool(command="", found=False, missing="nvidia-smi (--nvidia-smi '')")
    program = s.nvidia_smi[0]
    return SmiTool(command=" ".join(s.nvidia_smi), found=shutil.which(program) is not None)


@click.command("doctor")
@selection_options
@output_option()
@click.option(
    "--sriov-manage",
    envvar="VGPU_STATE_SRIOV_MANAGE",
    help="The sriov-manage command apply would use (default /usr/lib/nvidia/sriov-manage; "
    "'' writes sriov_numvfs). Env: VGPU_STATE_SRIOV_MANAGE.",
)
@click.option(
    "--nvidia-smi",
    envvar="VGPU_STATE_NVIDIA_SMI",
    help="The nvidia-smi command that reads MIG and mixed-size mode (default "
    "/usr/bin/nvidia-smi when installed; '' for none). Env: VGPU_STATE_NVIDIA_SMI.",
)
@handle_errors
def doctor_cmd(
    session: SessionArgs, output: str, sriov_manage: str | None, nvidia_smi: str | None
) -> None:
    """Check whether this host can run vGPUs and say why not, GPU by GPU.

    Reads sysfs (never writes). With -f, also checks that the config selected
    for the node can be laid out on each GPU it covers. Exit 0 when no check
    fails (warnings allowed), 1 when one fails or on an error.

    \b
    Examples:
      vgpu-state doctor
      vgpu-state doctor --sim configs/sim/mixed.yaml
      vgpu-state doctor -f layouts.yaml -c a2-mixed
      vgpu-state doctor -o json
    """
    s = settings(
        session.label_key,
        session.sim_spec,
        sriov_manage=sriov_manage,
        directory=session.state_dir,
        nvidia_smi=nvidia_smi,
    )
    if session.sim_spec and s.sriov_manage is not None:
        # open_host refuses --sriov-manage with --sim; a simulated node brings its own.
        raise click.UsageError("--sriov-manage applies to a real sysfs, not to --sim")
    if session.sim_spec and s.nvidia_smi is not None:
        raise click.UsageError(
            "--nvidia-smi applies to a real host, not to --sim (the spec's nvidia-smi: true)"
        )
    tool = _sriov_tool(session, s)
    smi = _smi_tool(session, s)
    target = open_host(
        session.sysfs_root, session.sim_spec, session.node, s, proc_root=session.proc_root
    )
    try:
        config = None
        if session.config_file:
            heard = _Heard()
            try:
                report = reconcile(session, target, s, reporter=heard)
            except ConfigError as e:
                lines = [str(issue) for issue in e.issues] or [str(e)]
                snapshot = _scan(target.host.scan(), session)
                config = config_failure(lines, tuple(heard.warnings))
            except NoGpusError as e:
                # Not the config's fault: the host shows no GPU (the gpus check says more).
                snapshot = _scan(target.host.scan(), session)
                config = config_failure(
                    [str(e)],
                    tuple(heard.warnings),
                    action="the host shows no NVIDIA GPU: see the checks above (is the GPU "
                    "on the bus, the vGPU Manager loaded, --sysfs-root right?)",
                )
            except VgpuStateError as e:
                snapshot = _scan(target.host.scan(), session)
                config = config_failure([str(e)], tuple(heard.warnings))
            else:
                for message in report.inputs.warnings:
                    heard.warning(message)
                snapshot = _scan(report.inputs.snapshot, session)
                config = config_checks(report.plan, tuple(heard.warnings))
        else:
            snapshot = _scan(target.host.scan(), session)
        result = diagnose(snapshot, tool, config, smi, s.catalog)
    finally:
        target.close()
    if output == "json":
        sys.stdout.write(render_report_json(result))
    else:
        sys.stdout.write(render_report(result))
    if result.status is Status.FAIL:
        sys.exit(1)


def _scan(snapshot: NodeSnapshot, session: SessionArgs) -> NodeSnapshot:
    if session.sim_spec:
        return snapshot.model_copy(update={"sysfs_root": f"sim:{session.sim_spec}"})
    return snapshot
