"""Split a node's vGPUs between the device plugin and DRA: each goes to exactly one.

The kubelet keeps separate books for device plugins and Dynamic Resource
Allocation; a vGPU offered through both could be handed to two VMs. Both
channels are fed from :func:`split`, which puts every vGPU of the snapshot in
exactly one of two snapshots, by the ``publish`` choice of its GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vgpu_state.model.policy import Publish
from vgpu_state.model.snapshot import NodeSnapshot


@dataclass(frozen=True)
class Channels:
    """The same node twice: only device-plugin vGPUs in one, only DRA vGPUs in the other."""

    device_plugin: NodeSnapshot
    dra: NodeSnapshot


def split(snapshot: NodeSnapshot, publish_for: Callable[[str], Publish]) -> Channels:
    """Each GPU's channel is ``publish_for(its address)``, e.g. ``DesiredState.publish_for``."""
    plugin_gpus = []
    dra_gpus = []
    for g in snapshot.gpus:
        if publish_for(g.address) is Publish.DRA:
            plugin_gpus.append(g.model_copy(update={"vgpus": ()}))
            dra_gpus.append(g)
        else:
            plugin_gpus.append(g)
            dra_gpus.append(g.model_copy(update={"vgpus": ()}))
    return Channels(
        device_plugin=snapshot.model_copy(update={"gpus": tuple(plugin_gpus)}),
        dra=snapshot.model_copy(update={"gpus": tuple(dra_gpus)}),
    )


def join(device_plugin: NodeSnapshot, dra: NodeSnapshot) -> NodeSnapshot:
    """The node again from its two channels (the inverse of :func:`split`).

    GPUs are matched by address; a GPU only one channel knows keeps its vGPUs.
    """
    dra_vgpus = {g.address: g.vgpus for g in dra.gpus}
    gpus = []
    for g in device_plugin.gpus:
        extra = dra_vgpus.get(g.address, ())
        gpus.append(g.model_copy(update={"vgpus": g.vgpus + extra}) if extra else g)
    return device_plugin.model_copy(update={"gpus": tuple(gpus)})
