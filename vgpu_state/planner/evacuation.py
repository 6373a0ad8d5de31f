"""What ``in-use: evacuate`` adds to a plan, and what a fleet needs of each node's plan.

Pure functions of a scan, its holders and a plan. Under ``evacuate`` a plan's steps
are those of ``protect``; a GPU whose switch is deferred lists the holders in its way
as :class:`~vgpu_state.model.plan.Move` (a VM, when the holder is a KubeVirt
virt-launcher pod, with the resource its vGPU is offered as: what another node needs
free to take it), and the free vGPUs of departing types are withheld while the switch
is pending (:attr:`~vgpu_state.model.plan.GpuPlan.withheld`).

:func:`node_evacuation` reduces a node's plan to what a fleet-wide view of the moves
needs: the node's moves, its room after its plan (free vGPUs per resource that no
holder has and no pending switch withholds) and what it withholds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vgpu_state.model.inuse import holder_vm
from vgpu_state.model.plan import Move, Plan
from vgpu_state.model.policy import InUsePolicy, Publish
from vgpu_state.model.resources import (
    ResourceNameError,
    driver_type_name,
    gpus_sysfs_names,
    name_prefix,
    resource_name,
)
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, Vgpu


def vgpu_resource(snapshot: NodeSnapshot, g: Gpu, v: Vgpu) -> str | None:
    """The extended resource ``v`` is offered as (``nvidia.com/NVIDIA_A2-4Q``), from the
    driver's name of its type (:mod:`vgpu_state.model.resources`); ``None`` when that
    name is not known or cannot be a resource."""
    known = gpus_sysfs_names(x for x in snapshot.gpus if x.model == g.model)
    name = driver_type_name(v, known, name_prefix(g))
    if name is None:
        return None
    try:
        return resource_name(name)
    except ResourceNameError:
        return None


def held_moves(
    snapshot: NodeSnapshot, g: Gpu, in_the_way: Iterable[Vgpu], in_use: Mapping[str, str]
) -> tuple[Move, ...]:
    """The held vGPUs among ``in_the_way`` (of GPU ``g``), each as the move that would
    free it, in the order given (by key). A vGPU in the way that nobody holds (kept by
    ``prune: false``, of a type that cannot be read) is no move."""
    moves: list[Move] = []
    for v in in_the_way:
        holder = in_use.get(v.key)
        if holder is None:
            continue
        moves.append(
            Move(
                holder=holder,
                vm=holder_vm(holder),
                vgpu=v.key,
                type_name=v.type_name,
                resource=vgpu_resource(snapshot, g, v),
            )
        )
    return tuple(moves)


@dataclass(frozen=True)
class NodeMove:
    """A move of one node's plan, with the GPU it leaves and that GPU's channel (a VM
    asks for a device plugin's resource, or a DRA device: it can move only to the same)."""

    gpu: str
    publish: Publish
    move: Move


@dataclass(frozen=True)
class NodeEvacuation:
    """What a fleet-wide view of the moves needs of one node's plan."""

    moves: tuple[NodeMove, ...] = ()
    room: tuple[tuple[str, Publish, int], ...] = ()
    """Per resource and channel, sorted: the vGPUs free after the plan that no holder has
    and no pending switch withholds (only resources with room)."""
    withheld: tuple[tuple[str, str, int], ...] = ()
    """(resource or "", type name, vGPUs) withheld now, per resource (``Capacity.withheld``)."""


def node_evacuation(plan: Plan, snapshot: NodeSnapshot | None = None) -> NodeEvacuation:
    """``plan`` reduced to its moves, its room and what it withholds.

    Room per resource is ``after - held``, less the vGPUs that stay withheld after the
    plan: those of GPUs whose switch is deferred (a switch that runs destroys what it
    withholds, so ``after`` lacks them already). Telling which resource those are needs
    the scan the plan was made from (``snapshot``); without it every withheld vGPU
    counts as staying withheld (less room, never more). A plan that withholds nothing
    needs none.
    """
    kept_withheld: Counter[tuple[str, Publish]] = Counter()
    deferred = [g for g in plan.gpus if g.deferred_switch is not None and g.withheld]
    if deferred and snapshot is None:
        for c in plan.capacity:
            kept_withheld[(c.resource or "", c.publish)] += c.withheld
    elif deferred and snapshot is not None:
        for header in deferred:
            g = snapshot.gpu(header.address)
            if g is None:
                continue
            withheld = frozenset(header.withheld)
            for v in g.vgpus:
                if v.key in withheld:
                    resource = vgpu_resource(snapshot, g, v) or ""
                    kept_withheld[(resource, header.publish)] += 1
    room: Counter[tuple[str, Publish]] = Counter()
    withheld_rows: list[tuple[str, str, int]] = []
    for c in plan.capacity:
        if c.withheld:
            withheld_rows.append((c.resource or "", c.type_name, c.withheld))
        if c.resource is None:
            continue
        free = c.after - c.held - kept_withheld[(c.resource, c.publish)]
        if free > 0:
            room[(c.resource, c.publish)] += free
    moves = tuple(
        NodeMove(g.address, g.publish, m)
        for g in plan.gpus
        if g.deferred_switch is not None
        for m in g.deferred_switch.moves
    )
    return NodeEvacuation(
        moves=moves,
        room=tuple((r, p, n) for (r, p), n in sorted(room.items())),
        withheld=tuple(withheld_rows),
    )


def evacuates(plan: Plan) -> bool:
    """The plan was made under ``in-use: evacuate``."""
    return plan.policy.in_use is InUsePolicy.EVACUATE
