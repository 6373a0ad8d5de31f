"""``vgpu-state dra-remove-slices``: delete the DRA driver's ResourceSlices (an uninstall).

The agent leaves its slices in place when it stops, as the kubelet's contract
for DRA drivers expects: a restart or a rollout is a short absence, and the
kubelet deletes a driver's slices itself when the driver stays away. Removing
vgpu-state for good is the one time to delete them at once.
"""

from __future__ import annotations

import click

from vgpu_state.cli.common import handle_errors
from vgpu_state.cli.options import kubeconfig_options, node_option


@click.command("dra-remove-slices")
@node_option("Only this node's slices (default: every node's).")
@kubeconfig_options()
@handle_errors
def dra_remove_slices(node: str | None, kubeconfig: str | None, context: str | None) -> None:
    """Delete the ResourceSlices of driver vgpu.vgpu-state.io, then check that none is left.

    For an uninstall, after the agent's DaemonSet is gone. A plain restart or
    rollout of the agent needs no such step.

    \b
    Examples:
      vgpu-state dra-remove-slices --kubeconfig ~/.kube/config
      vgpu-state dra-remove-slices --node gpu-node-1
    """
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.dra import remove_driver_slices

    api = KubeApi.connect(kubeconfig, context)
    try:
        names = remove_driver_slices(api, node)
    finally:
        api.close()
    where = f"node {node}" if node else "every node"
    for name in names:
        click.echo(f"deleted ResourceSlice {name}")
    click.echo(f"{len(names)} ResourceSlice(s) deleted; none left on {where}")
