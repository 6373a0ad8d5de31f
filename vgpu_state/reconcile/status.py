"""Pure: a reconcile's outcome as the node's status conditions and Events."""

from __future__ import annotations

from collections.abc import Iterable

from vgpu_state.model.desired import SkippedEntry
from vgpu_state.model.errors import Reason, VgpuStateError
from vgpu_state.model.plan import ActionKind, Blocked, GpuPlan, Plan
from vgpu_state.model.snapshot import NodeSnapshot, Vgpu
from vgpu_state.model.status import (
    Condition,
    ConditionType,
    ConfigState,
    EventType,
    NodeEvent,
    NodeStatus,
    PendingSwitch,
)
from vgpu_state.model.withheld import MAX_CONFIG, MAX_REASON, WithheldVgpu, fitted
from vgpu_state.reconcile.report import Report


def withheld_keys(plan: Plan) -> frozenset[str]:
    """The vGPUs ``plan`` withholds: every GPU's :attr:`~vgpu_state.model.plan.GpuPlan.withheld`
    (free vGPUs of departing types while the GPU's switch is pending, ``in-use: evacuate``)."""
    return frozenset(k for g in plan.gpus for k in g.withheld)


def _by_key(snapshot: NodeSnapshot) -> dict[str, Vgpu]:
    return {v.key: v for g in snapshot.gpus for v in g.vgpus}


def still_withheld(report: Report) -> frozenset[str]:
    """Of the plan's withheld vGPUs, those the final scan still shows as the plan saw them
    (same key, same type). A switch that ran destroyed them; a vGPU created since under a
    reused key (mdev UUIDs are derived from the GPU's slots) is a new one, offered."""
    keys = withheld_keys(report.plan)
    if not keys:
        return keys
    before, after = _by_key(report.inputs.snapshot), _by_key(report.final)
    kept = set()
    for key in keys:
        old, new = before.get(key), after.get(key)
        if old is None or new is None:
            continue
        if (old.type_id, old.type_name) == (new.type_id, new.type_name):
            kept.add(key)
    return frozenset(kept)


SWITCH_NAMED = 3
"""How many holders a pending switch's message names; the rest are counted."""


def withheld_vgpus(
    plan: Plan, snapshot: NodeSnapshot, keys: frozenset[str], *, declined: bool = False
) -> tuple[WithheldVgpu, ...]:
    """``keys`` (of :func:`withheld_keys`) as the agent records them for ``scan``: each
    with its GPU, its type in ``snapshot`` and why (``switch deferred: waits for
    <holders>``, or ``switch planned``; ``declined``: the plan waits for a rollout slot).
    Sorted by GPU and key."""
    if not keys:
        return ()
    types = {v.key: v.type_label for g in snapshot.gpus for v in g.vgpus}
    out: list[WithheldVgpu] = []
    for g in plan.gpus:
        mine = sorted(k for k in g.withheld if k in keys)
        if not mine:
            continue
        d = g.deferred_switch
        if d is not None:
            waits = _holders_text(d.waits_for) if d.waits_for else f"{len(d.in_the_way)} vGPU(s)"
            reason = f"switch deferred: waits for {waits}"
            if d.moves:
                moving = tuple(m.vm or m.holder for m in d.moves)
                reason += f"; to be moved: {_holders_text(moving)}"
        else:
            reason = "switch planned" + ("; waiting for a rollout slot" if declined else "")
        out.extend(
            WithheldVgpu(
                key=k,
                gpu=str(g.address),
                type=fitted(types.get(k, "unknown"), 128),
                reason=fitted(reason, MAX_REASON),
                config=fitted(plan.selection.config, MAX_CONFIG),
            )
            for k in mine
        )
    return tuple(out)


def _departing(report: Report, g: GpuPlan) -> tuple[str, ...]:
    """The vGPU types leaving ``g``: those of its destroys, and those on it now that its
    layout no longer names (a deferred switch destroys nothing yet)."""
    plan = report.plan
    names = {a.type_label for a in plan.gpu_actions(g.address) if a.kind is ActionKind.DESTROY}
    gpu = report.inputs.snapshot.gpu(g.address)
    wanted = next((d for d in report.inputs.desired.gpus if d.address == g.address), None)
    if gpu is not None and wanted is not None:
        keep = {name for name, count in wanted.types if count > 0}
        names |= {v.type_label for v in gpu.vgpus if v.type_name not in keep}
    if not names and gpu is not None and g.deferred_switch is not None:
        in_the_way = set(g.deferred_switch.in_the_way)
        names = {v.type_label for v in gpu.vgpus if v.key in in_the_way}
    return tuple(sorted(names))


def _holders_text(holders: tuple[str, ...]) -> str:
    named = ", ".join(holders[:SWITCH_NAMED])
    more = len(holders) - SWITCH_NAMED
    return named + (f" and {more} more" if more > 0 else "")


def pending_switches(report: Report, *, enforcing: bool = True) -> tuple[PendingSwitch, ...]:
    """The GPUs whose layout switch is still pending after ``report``: deferred ones, and
    (while nothing ran: a plan waiting for a rollout slot) those whose vGPUs the plan
    destroys. ``enforcing`` false (plan-only: nothing is carried out): none."""
    if not enforcing:
        return ()
    plan = report.plan
    policy = plan.policy.in_use.value
    ran = report.applied is not None
    withheld = still_withheld(report)
    out: list[PendingSwitch] = []
    for g in plan.gpus:
        keys = tuple(sorted(k for k in g.withheld if k in withheld))
        destroys = sum(1 for a in plan.gpu_actions(g.address) if a.kind is ActionKind.DESTROY)
        parts: list[str] = []
        d = g.deferred_switch
        if d is not None:
            state = "deferred"
            way = len(d.in_the_way)
            parts.append(
                f"{d.creates} vGPU(s) of the new layout wait for {way} vGPU(s) in the way"
                if d.creates
                else f"waits for {way} vGPU(s) in the way"
            )
            if d.waits_for:
                parts.append(f"held by {_holders_text(d.waits_for)}")
            if d.moves:
                moving = tuple(m.vm or m.holder for m in d.moves)
                parts.append(f"to be moved (in-use: evacuate): {_holders_text(moving)}")
            elif policy != "evacuate":
                parts.append(f"nothing is moved (in-use: {policy})")
        elif destroys and not ran:
            state = "planned"
            parts.append(f"the plan destroys {destroys} vGPU(s)")
            if report.declined:
                parts.append("waiting for a rollout slot")
            elif plan.cluster_blocked:
                parts.append(f"nothing is applied: {plan.cluster_blocked[0].reason}")
        else:
            continue
        if keys:
            parts.append(f"{len(keys)} free vGPU(s) of departing types withheld")
        out.append(
            PendingSwitch(
                gpu=g.address,
                state=state,
                policy=policy,
                departing=_departing(report, g),
                withheld=keys,
                message="; ".join(parts),
            )
        )
    return tuple(out)


def node_status(report: Report, *, enforcing: bool = True) -> NodeStatus:
    """Synced / Ready / Blocked conditions with reason codes, and the state label's value.

    A blocked item of the cluster (KubeVirt managing mdevs itself) makes the
    state ``failed`` and, when the plan had changes, ``Synced`` names it. The
    GPUs whose layout switch is pending are listed (:func:`pending_switches`).
    """
    plan = report.plan
    blocked = plan.blocked
    held_back = plan.cluster_blocked
    if held_back and plan.actions:
        synced = Condition(
            type=ConditionType.SYNCED,
            status=False,
            reason=held_back[0].code.value,
            message=f"nothing was applied: {held_back[0].address}: {held_back[0].reason}"
            + "".join(f"; {d}" for d in report.differences),
        )
    elif report.matches:
        synced = Condition(
            type=ConditionType.SYNCED,
            status=True,
            reason="Synced",
            message=f'the node matches configuration "{plan.selection.config}"'
            + _skipped_note(plan.skipped),
        )
    else:
        synced = Condition(
            type=ConditionType.SYNCED,
            status=False,
            reason="Blocked" if blocked and not plan.actions else "Pending",
            message="; ".join(report.differences) + _skipped_note(plan.skipped),
        )
    if blocked:
        first = blocked[0]
        block = Condition(
            type=ConditionType.BLOCKED,
            status=True,
            reason=first.code.value,
            message="; ".join(f"{b.address}: {b.reason}" for b in blocked),
        )
    else:
        block = Condition(type=ConditionType.BLOCKED, status=False, reason="NotBlocked")
    ready = Condition(
        type=ConditionType.READY,
        status=True,
        reason="ConfigOutdated" if report.config_warning else "Ready",
        message=report.config_warning or "",
    )
    if held_back:
        # Another manager of the node's vGPUs is active: what the host shows now cannot
        # be called a success, and nothing changes until an operator hands it over.
        state = ConfigState.FAILED
    else:
        state = ConfigState.SUCCESS if report.matches else ConfigState.PENDING
    return NodeStatus(
        node=report.inputs.node,
        config=plan.selection.config,
        state=state,
        conditions=(synced, ready, block),
        vgpus=report.live_layout(),
        selected_by=report.inputs.source,
        selected_detail=report.inputs.detail,
        switches=pending_switches(report, enforcing=enforcing),
    )


SKIPPED_NAMED = 4
"""How many skipped entries a status message or Event names; the rest are counted."""


def _skipped_text(skipped: tuple[SkippedEntry, ...]) -> str:
    named = "; ".join(e.message for e in skipped[:SKIPPED_NAMED])
    more = len(skipped) - SKIPPED_NAMED
    return named + (f"; and {more} more skipped" if more > 0 else "")


def _skipped_note(skipped: tuple[SkippedEntry, ...]) -> str:
    """`` (entry [1] of T4-small: no GPU 1 on this node, skipped)``, or ``""``."""
    return f" ({_skipped_text(skipped)})" if skipped else ""


def failed_status(node: str, config: str | None, error: VgpuStateError) -> NodeStatus:
    """The status of a reconcile that ended with ``error``."""
    return NodeStatus(
        node=node,
        config=config,
        state=ConfigState.FAILED,
        conditions=(
            Condition(
                type=ConditionType.READY,
                status=False,
                reason=error.reason.value,
                message=str(error),
            ),
        ),
    )


def degraded_status(node: str, error: VgpuStateError) -> NodeStatus:
    """The status of a node whose config does not load: degraded, and not ready because
    the host is left as it is."""
    reason = error.reason.value
    return NodeStatus(
        node=node,
        config=None,
        state=ConfigState.FAILED,
        conditions=(
            Condition(type=ConditionType.DEGRADED, status=True, reason=reason, message=str(error)),
            Condition(
                type=ConditionType.READY,
                status=False,
                reason=reason,
                message="the config does not load; the host is left as it is",
            ),
        ),
    )


def unselected_status(node: str, error: VgpuStateError) -> NodeStatus:
    """The status of a node that no config selects: left as it is, with no state label."""
    reason = Reason.NO_CONFIG_SELECTED.value
    return NodeStatus(
        node=node,
        config=None,
        state=None,
        conditions=(
            Condition(
                type=ConditionType.SYNCED,
                status=True,
                reason=reason,
                message="no config selects this node; it is left as it is",
            ),
            Condition(type=ConditionType.READY, status=True, reason=reason, message=str(error)),
        ),
        switches=(),
    )


def applied_events(report: Report) -> tuple[NodeEvent, ...]:
    """Events worth telling an operator after a reconcile: what changed, what is blocked,
    which entries of the config select no GPU of the node and were skipped."""
    events: list[NodeEvent] = []
    result = report.applied
    if result is not None and result.steps:
        counts = result.counts
        events.append(
            NodeEvent(
                type=EventType.NORMAL,
                reason="Applied",
                message=f'configuration "{report.plan.selection.config}": '
                f"{counts['ok']} change(s) made, {counts['skipped']} already done",
            )
        )
    events.extend(blocked_events(report.plan.blocked))
    if report.plan.skipped:
        events.append(
            NodeEvent(
                type=EventType.WARNING,
                reason="EntriesSkipped",
                message=f'configuration "{report.plan.selection.config}": '
                + _skipped_text(report.plan.skipped),
            )
        )
    return tuple(events)


BLOCKED_NAMED = 2
"""How many of a reason's blocked items an Event names; the rest are counted."""


def blocked_events(blocked: Iterable[Blocked]) -> tuple[NodeEvent, ...]:
    """One Warning per blocked code (in the order the plan first names it), not one per
    item: a node with hundreds of blocked steps writes one Event per reason each
    reconcile, and the Event's ``count`` counts reconciles, not items."""
    by_code: dict[str, list[Blocked]] = {}
    for b in blocked:
        by_code.setdefault(b.code.value, []).append(b)
    events: list[NodeEvent] = []
    for code, items in by_code.items():
        named = "; ".join(f"{b.address}: {b.reason}" for b in items[:BLOCKED_NAMED])
        if len(items) == 1:
            message = named
        else:
            message = f"{len(items)} plan items blocked: {named}"
            if len(items) > BLOCKED_NAMED:
                message += f"; and {len(items) - BLOCKED_NAMED} more"
        events.append(NodeEvent(type=EventType.WARNING, reason=code, message=message))
    return tuple(events)


def failed_event(error: VgpuStateError) -> NodeEvent:
    reason = error.reason if isinstance(error.reason, Reason) else Reason.TRANSIENT
    return NodeEvent(type=EventType.WARNING, reason=reason.value, message=str(error))
