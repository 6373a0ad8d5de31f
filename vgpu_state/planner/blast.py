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
from functools import lru_cache
from typing import Any

from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.plan import Action, ActionKind, Capacity, Holder, Plan, plan_disruption
from vgpu_state.model.policy import Publish
from vgpu_state.model.resources import (
    ResourceNameError,
    driver_type_name,
    gpus_sysfs_names,
    name_prefix,
    resource_name,
)
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, Vgpu

_Key = tuple[str, str, Publish]
"""(resource or "", type name, channel)."""


@lru_cache(maxsize=4096)
def _resource(name: str) -> str:
    """The resource of a driver type name, or "" when the name cannot be one."""
    try:
        return resource_name(name)
    except ResourceNameError:
        return ""


def _key(name: str | None, short: str, channel: Publish) -> _Key:
    return (_resource(name), name, channel) if name else ("", short, channel)


class _Names:
    """The driver's type names of a node, read off the scan only when asked."""

    def __init__(self, snapshot: NodeSnapshot) -> None:
        self.snapshot = snapshot
        self._known: dict[str | None, dict[int, str]] = {}
        self._prefixes: dict[str, str | None] = {}
        self._listed_names: dict[tuple[str, int], str | None] = {}

    def known(self, g: Gpu) -> dict[int, str]:
        """The names of the type ids the GPUs of ``g``'s model show on this node.

        A type id names one type of one GPU model, so GPUs of other models never
        list it; reading only the same model's lists gives what the whole node's
        (:func:`~vgpu_state.model.resources.sysfs_names`, the KubeVirt CR's) gives.
        """
        found = self._known.get(g.model)
        if found is None:
            found = gpus_sysfs_names(x for x in self.snapshot.gpus if x.model == g.model)
            self._known[g.model] = found
        return found

    def prefix(self, g: Gpu) -> str | None:
        if g.address not in self._prefixes:
            self._prefixes[g.address] = name_prefix(g)
        return self._prefixes[g.address]

    def of_vgpu(self, g: Gpu, v: Vgpu) -> str | None:
        if v.type_sysfs_name:
            return v.type_sysfs_name
        return driver_type_name(v, self.known(g), self.prefix(g))

    def _listed(self, g: Gpu, a: Action) -> str | None:
        """The driver's name of the create's type id: from its parent's list, else the node's."""
        if a.type_id is None:
            return None
        cache_key = (g.address, a.type_id)
        if cache_key in self._listed_names:
            return self._listed_names[cache_key]
        name: str | None = None
        parent = next((vf for vf in g.vfs if vf.address == a.parent), None)
        for t in (*(parent.creatable if parent is not None else ()), *g.pf_creatable):
            if t.type_id == a.type_id and t.sysfs_name:
                name = t.sysfs_name
                break
        if name is None:
            name = self.known(g).get(a.type_id)
        self._listed_names[cache_key] = name
        return name

    def of_type(self, g: Gpu, short: str) -> str | None:
        """The driver's name of a type the plan does not create (a blocked create)."""
        listed = g.offered_type(short)
        name = self.known(g).get(listed.type_id) if listed is not None else None
        if not name:
            prefix = self.prefix(g)
            name = f"{prefix} {short}" if prefix else None
        return name

    def of_create(self, g: Gpu, a: Action) -> str | None:
        name = self._listed(g, a)
        if not name and a.type_name:
            prefix = self.prefix(g)
            if prefix:
                name = f"{prefix} {a.type_name}"
        return name


def capacity(plan: Plan, snapshot: NodeSnapshot, in_use: Mapping[str, str]) -> tuple[Capacity, ...]:
    """Per resource and channel: vGPUs now, after the plan, and held now.

    Counted as :func:`~vgpu_state.planner.expected.expected_snapshot` would leave
    the node (destroys remove a vGPU, creates add one), without building it.
    """
    names = _Names(snapshot)
    publish = {g.address: g.publish for g in plan.gpus}
    default = plan.policy.publish
    # Plain dicts, not Counters: counted for every vGPU of every node of a fleet.
    before: dict[_Key, int] = {}
    after: dict[_Key, int] = {}
    held: dict[_Key, int] = {}
    withheld: dict[_Key, int] = {}
    withheld_of = {h.address: h.withheld for h in plan.gpus if h.withheld}
    by_gpu: dict[str, list[Action]] = {}
    for a in plan.actions:
        by_gpu.setdefault(a.gpu, []).append(a)
    for g in snapshot.gpus:
        channel = publish.get(g.address, default)
        actions = by_gpu.get(g.address, ())
        # A vGPU's resource follows from its type's names: worked out once per type.
        key_of: dict[tuple[str | None, str | None, int | None], _Key] = {}
        keys: dict[str, _Key] = {}
        for v in g.vgpus:
            kind = (v.type_sysfs_name, v.type_name, v.type_id)
            key = key_of.get(kind)
            if key is None:
                key = key_of[kind] = _key(names.of_vgpu(g, v), v.type_label, channel)
            vgpu = v.key
            keys[vgpu] = key
            before[key] = before.get(key, 0) + 1
            if in_use and vgpu in in_use:
                held[key] = held.get(key, 0) + 1
        for key in keys.values():
            after[key] = after.get(key, 0) + 1
        for k in withheld_of.get(g.address, ()):
            if k in keys:
                withheld[keys[k]] = withheld.get(keys[k], 0) + 1
        # A create's resource follows from its type (its name on the GPU is the first
        # create's of that type id; without an id, the GPU's prefix and the type's
        # name): worked out once per type.
        created: dict[tuple[int | None, str | None], _Key] = {}
        for a in actions:
            if a.kind is ActionKind.DESTROY:
                gone = keys.get(a.vgpu_key)
                if gone is not None:
                    after[gone] = after.get(gone, 0) - 1
            elif a.kind is ActionKind.CREATE:
                made = (a.type_id, a.type_name)
                key = created.get(made)
                if key is None:
                    key = created[made] = _key(names.of_create(g, a), a.type_label, channel)
                after[key] = after.get(key, 0) + 1
    blocked: dict[_Key, int] = {}
    codes: dict[_Key, BlockedReason] = {}
    waits: dict[_Key, set[str]] = {}
    gpus: dict[str, Gpu] = {g.address: g for g in snapshot.gpus}
    for b in plan.blocked:
        on = gpus.get(b.gpu)
        if b.kind is not ActionKind.CREATE or on is None or not b.type_name:
            continue
        channel = publish.get(on.address, default)
        key = _key(names.of_type(on, b.type_name), b.type_name, channel)
        blocked[key] = blocked.get(key, 0) + 1
        codes.setdefault(key, b.code)
        if b.code is BlockedReason.SWITCH_DEFERRED and b.holder is not None:
            waits.setdefault(key, set()).add(b.holder)
    return tuple(
        _capacity(
            key[0] or None,
            key[1],
            key[2],
            before.get(key, 0),
            after.get(key, 0),
            held.get(key, 0),
            blocked.get(key, 0),
            codes.get(key),
            tuple(sorted(waits.get(key, ()))),
            withheld.get(key, 0),
        )
        for key in sorted(
            set(before) | set(after) | set(blocked), key=lambda k: (k[0] or "~", k[1], k[2])
        )
    )


@lru_cache(maxsize=4096, typed=True)
def _capacity(
    resource: str | None,
    type_name: str,
    publish: Publish,
    before: int,
    after: int,
    held: int,
    blocked: int,
    code: BlockedReason | None,
    waits_for: tuple[str, ...],
    withheld: int = 0,
) -> Capacity:
    """One frozen value for equal rows (a fleet's nodes of one pool share theirs)."""
    return Capacity(
        resource=resource,
        type_name=type_name,
        publish=publish,
        before=before,
        after=after,
        held=held,
        blocked=blocked,
        blocked_code=code,
        waits_for=waits_for,
        withheld=withheld,
    )


def _holders(names: list[str]) -> tuple[Holder, ...]:
    return tuple(Holder(holder=h, vgpus=n) for h, n in sorted(Counter(names).items()))


def with_blast_radius(plan: Plan, snapshot: NodeSnapshot, in_use: Mapping[str, str]) -> Plan:
    """``plan`` with its disruption, capacity and affected/protected holders filled in."""
    return _copy_with(plan, blast_radius(plan, snapshot, in_use))


def blast_radius(plan: Plan, snapshot: NodeSnapshot, in_use: Mapping[str, str]) -> dict[str, Any]:
    """``plan``'s disruption, capacity and affected and protected holders, by field name."""
    destroyed = [
        in_use[a.vgpu_key]
        for a in plan.actions
        if a.kind is ActionKind.DESTROY and a.vgpu_key in in_use
    ]
    # A blocked destroy names its holder only under in-use: protect (also when the
    # vGPU is kept for another reason too, such as a type that cannot be read).
    protected = [
        b.holder for b in plan.blocked if b.kind is ActionKind.DESTROY and b.holder is not None
    ]
    return {
        "disruption": plan_disruption(plan.actions, frozenset(in_use)),
        "capacity": capacity(plan, snapshot, in_use),
        "affected": _holders(destroyed),
        "protected": _holders(protected),
    }


def _copy_with(plan: Plan, update: dict[str, Any]) -> Plan:
    """``plan.model_copy(update=update)`` without pydantic's general copy (the values are
    of their fields' types: made here)."""
    copied = plan.__class__.__new__(plan.__class__)
    object.__setattr__(copied, "__dict__", {**plan.__dict__, **update})
    object.__setattr__(copied, "__pydantic_extra__", None)
    object.__setattr__(
        copied, "__pydantic_fields_set__", plan.__pydantic_fields_set__ | set(update)
    )
    object.__setattr__(copied, "__pydantic_private__", None)
    return copied
