"""A plan's blast radius: capacity per resource before and after, and whom it touches.

Pure functions of a plan, the scan it was made from and the held vGPUs. The
resource of a vGPU is the one the device plugin advertises and the KubeVirt CR
permits (:mod:`vgpu_state.model.resources`, of the driver's type name); "after"
is :func:`~vgpu_state.planner.expected.expected_snapshot`, so a blocked step
counts as not taken: a held vGPU that cannot be destroyed stays, a create that
is blocked adds nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.pci import PciAddress
from vgpu_state.model.plan import ActionKind, Capacity, Holder, Plan, plan_disruption
from vgpu_state.model.policy import Publish
from vgpu_state.model.resources import (
    ResourceNameError,
    driver_type_name,
    name_prefix,
    resource_name,
    sysfs_names,
)
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.planner.expected import expected_snapshot

_Key = tuple[str, str, Publish]
"""(resource or "", type name, channel)."""


def _count(
    snapshot: NodeSnapshot,
    known: dict[int, str],
    publish: Mapping[PciAddress, Publish],
    default: Publish,
    in_use: Mapping[str, str],
) -> tuple[Counter[_Key], Counter[_Key]]:
    total: Counter[_Key] = Counter()
    held: Counter[_Key] = Counter()
    for g in snapshot.gpus:
        prefix = name_prefix(g)
        channel = publish.get(g.address, default)
        for v in g.vgpus:
            name = driver_type_name(v, known, prefix)
            resource = ""
            if name:
                try:
                    resource = resource_name(name)
                except ResourceNameError:
                    resource = ""
            key = (resource, name or v.type_name or f"type id {v.type_id}", channel)
            total[key] += 1
            if v.key in in_use:
                held[key] += 1
    return total, held


def capacity(plan: Plan, snapshot: NodeSnapshot, in_use: Mapping[str, str]) -> tuple[Capacity, ...]:
    """Per resource and channel: vGPUs now, after the plan, and held now."""
    after_snapshot = expected_snapshot(plan, snapshot) if plan.actions else snapshot
    known = sysfs_names(snapshot)
    publish = {g.address: g.publish for g in plan.gpus}
    default = plan.policy.publish
    before, held = _count(snapshot, known, publish, default, in_use)
    after, _ = _count(after_snapshot, known, publish, default, {})
    return tuple(
        Capacity(
            resource=key[0] or None,
            type_name=key[1],
            publish=key[2],
            before=before[key],
            after=after[key],
            held=held[key],
        )
        for key in sorted(set(before) | set(after), key=lambda k: (k[0] or "~", k[1], k[2]))
    )


def _holders(names: list[str]) -> tuple[Holder, ...]:
    return tuple(Holder(holder=h, vgpus=n) for h, n in sorted(Counter(names).items()))


def with_blast_radius(plan: Plan, snapshot: NodeSnapshot, in_use: Mapping[str, str]) -> Plan:
    """``plan`` with its disruption, capacity and affected/protected holders filled in."""
    destroyed = [
        in_use[key]
        for a in plan.actions
        if a.kind is ActionKind.DESTROY and (key := a.vf or a.uuid or "") in in_use
    ]
    protected = [
        b.holder for b in plan.blocked if b.code is BlockedReason.IN_USE and b.holder is not None
    ]
    return plan.model_copy(
        update={
            "disruption": plan_disruption(plan.actions, frozenset(in_use)),
            "capacity": capacity(plan, snapshot, in_use),
            "affected": _holders(destroyed),
            "protected": _holders(protected),
        }
    )
