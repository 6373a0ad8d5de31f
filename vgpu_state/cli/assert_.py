"""``vgpu-state assert``: exit 0 when the node matches its config, 1 otherwise."""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import click

from vgpu_state.cli.common import SessionArgs, handle_errors, selection_options
from vgpu_state.cli.options import deprecated_option, nvidia_smi_option, output_option
from vgpu_state.cli.session import (
    journal_for,
    open_target,
    reconcile,
    settings,
    warn_unfinished,
)
from vgpu_state.reconcile import NoGpusError


@click.command("assert")
@selection_options
@deprecated_option("--journal", "journal_file")
@nvidia_smi_option()
@output_option()
@handle_errors
def assert_cmd(
    session: SessionArgs, journal_file: str | None, output: str, nvidia_smi: str | None
) -> None:
    """Exit 0 when the node matches the selected config, 1 otherwise (listing differences).

    Reads the host afresh; changes nothing. With -o json: one object with
    "matches", "config" and "differences".

    \b
    Examples:
      vgpu-state assert -f layouts.yaml
      vgpu-state assert -f configs/examples/mixed-node.yaml --sim node.yaml -c mixed
      vgpu-state assert -f layouts.yaml -o json
    """
    s = settings(session.label_key, session.sim_spec, journal_file, directory=session.state_dir,
                 default_config=session.default_config, strict=session.strict,
                 nvidia_smi=nvidia_smi)  # fmt: skip
    target = open_target(session, s)
    try:
        warn_unfinished(journal_for(journal_file, session.sim_spec, session.state_dir))
        try:
            report = reconcile(session, target, s)
        except NoGpusError as e:
            # A health check built on assert must go red when the GPUs fall off the bus:
            # entries selected by device-filter match nothing then, and nothing differs.
            _no_gpus(e, output)
    finally:
        target.close()
    config = report.inputs.desired.config
    if output == "json":
        differences = list(report.differences)
        doc = {
            "matches": not differences,
            "node": report.inputs.snapshot.node,
            "config": config,
            "selection": report.inputs.detail,
            "differences": differences,
        }
        click.echo(json.dumps(doc, indent=2))
        sys.exit(0 if not differences else 1)
    if report.differences:
        click.echo(f'Assertion failure: the node does not match configuration "{config}":')
        for line in report.differences:
            click.echo(f"  {line}")
        sys.exit(1)
    click.echo(f'The node matches configuration "{config}" ({report.inputs.detail}).')


def _no_gpus(e: NoGpusError, output: str) -> NoReturn:
    if output == "json":
        doc = {
            "matches": False,
            "node": e.node,
            "config": e.config,
            "selection": e.detail,
            "differences": [str(e)],
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(f"Assertion failure: {e}.")
    sys.exit(1)
