"""``vgpu-state export``: print a config that reproduces the node's live vGPU layout."""

from __future__ import annotations

import json

import click

from vgpu_state.cli.common import handle_errors
from vgpu_state.cli.options import (
    config_name_option,
    label_key_option,
    node_option,
    output_option,
    sim_option,
    state_dir_option,
    sysfs_root_option,
)
from vgpu_state.cli.session import open_host, settings
from vgpu_state.config import dump
from vgpu_state.config.dump import to_data
from vgpu_state.config.export import export_document
from vgpu_state.model.errors import require_readable


@click.command("export")
@sysfs_root_option()
@sim_option()
@node_option()
@config_name_option(
    "export: the exported layout gets this name (default: the node's config label when "
    "it has one, else current)."
)
@label_key_option()
@state_dir_option()
@output_option(("yaml", "json"), "yaml", help="The config file's format.")
@handle_errors
def export_cmd(
    sysfs_root: str | None,
    sim_spec: str | None,
    node: str | None,
    config_name: str | None,
    label_key: str,
    state_dir: str | None,
    output: str,
) -> None:
    """Print a config that reproduces the live vGPU layout.

    The config is also the document's default, and takes the name the node's config
    label gives, so planning against the document says "No changes".

    \b
    Examples:
      vgpu-state export > current.yaml
      vgpu-state export --sim configs/sim/a2-host.yaml -c a2-today
      vgpu-state export --sim configs/sim/mixed.yaml -o json
    """
    target = open_host(
        sysfs_root, sim_spec, node, settings(label_key, sim_spec, directory=state_dir)
    )
    try:
        snapshot = target.host.scan()
        labels = target.cluster.labels()
        require_readable(snapshot)
    finally:
        target.close()
    name = config_name or labels.get(label_key) or "current"
    document = export_document(snapshot, name)
    skipped = sum(1 for g in snapshot.gpus for v in g.vgpus if not v.type_name)
    if skipped:
        click.echo(f"warning: {skipped} vGPU(s) of unknown type are not exported", err=True)
    if output == "json":
        click.echo(json.dumps(to_data(document), indent=2))
        return
    click.echo(f"# Exported by vgpu-state from {snapshot.node or 'the node'}")
    click.echo(dump(document), nl=False)
