"""``vgpu-state export``: print a config that reproduces the node's live vGPU layout."""

from __future__ import annotations

import json

import click

from vgpu_state.cli.common import handle_errors
from vgpu_state.cli.options import config_name_option, output_option, sysfs_root_option
from vgpu_state.cli.session import open_host, settings
from vgpu_state.config import DEFAULT_LABEL_KEY, dump
from vgpu_state.config.dump import to_data
from vgpu_state.config.export import export_document
from vgpu_state.model.errors import require_readable


@click.command("export")
@sysfs_root_option()
@click.option("--sim", "sim_spec", type=click.Path(dir_okay=False), help="A simulated node spec.")
@click.option("--node", help="Node name.")
@config_name_option(
    help="Name of the exported layout (default: the node's config label when it has "
    "one, else current).",
    envvar=None,
)
@click.option(
    "--label-key",
    default=DEFAULT_LABEL_KEY,
    show_default=True,
    help="The node label that names a config.",
)
@output_option(("yaml", "json"), "yaml", help="The config file's format.")
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

    \b
    Examples:
      vgpu-state export > current.yaml
      vgpu-state export --sim configs/sim/a2-host.yaml -c a2-today
      vgpu-state export --sim configs/sim/mixed.yaml -o json
    """
    target = open_host(sysfs_root, sim_spec, node, settings(label_key, sim_spec))
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
