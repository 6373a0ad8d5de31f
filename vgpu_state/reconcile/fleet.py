"""The fleet-wide dry run: every node's plan against what its agent last reported (pure).

For each :class:`~vgpu_state.model.fleet.ReportedNode` the plan is made by
:func:`~vgpu_state.reconcile.once.read_and_plan`, the first half of
:func:`~vgpu_state.reconcile.reconcile_once` (the same path the node's agent takes),
over ports that hold the report: the Node's live labels select the config, the
reported scan stands for the host
(it refuses every write) and the reported holders are the in-use vGPUs. So a
fleet plan shows what each agent will plan once it reads the new config, as
long as its host is still as it last reported.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from vgpu_state.config import StaticConfigSource
from vgpu_state.config.document import ConfigDocument
from vgpu_state.model.errors import HostError, Reason, VgpuStateError
from vgpu_state.model.fleet import ReportedNode, Unknown, UnknownReason
from vgpu_state.model.plan import Disruption, Plan
from vgpu_state.model.policy import Publish
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.timestamps import rfc3339
from vgpu_state.planner.evacuation import NodeEvacuation, evacuates, node_evacuation
from vgpu_state.ports import MemoryCluster
from vgpu_state.reconcile.evacuation import (
    EvacuationSummary,
    FleetEvacuation,
    evacuation_document,
)
from vgpu_state.reconcile.once import Ports, read_and_plan
from vgpu_state.reconcile.report import QuietReporter
from vgpu_state.reconcile.settings import Settings

FLEET_PLAN_KIND = "vgpu-state-fleet-plan"
FLEET_FORMAT_VERSION = "1.1"
_QUIET = QuietReporter()


class NodeOutcome(StrEnum):
    """What a fleet plan says about one node (its ``outcome``); not the
    :class:`~vgpu_state.executor.Outcome` of one apply step."""

    CHANGES = "changes"
    """The node does not match its config: steps to take, or blocked items."""
    NO_CHANGES = "no-changes"
    """The node, as last reported, matches its config."""
    UNKNOWN = "unknown"
    """Nothing can be planned: the cluster holds no usable report of the node."""
    ERROR = "error"
    """Planning failed (no config selected, a layout the node cannot hold, …)."""


class ReportedHostWriteError(HostError):
    """A fleet plan's host is a report: it can be read, never changed."""

    default_reason = Reason.HOST_UNREADABLE


class ReportedHost:
    """A :class:`~vgpu_state.ports.HostPort` that is one given scan (in a fleet plan, the
    node's reported one); writes raise."""

    def __init__(self, snapshot: NodeSnapshot) -> None:
        self.snapshot = snapshot

    def scan(self) -> NodeSnapshot:
        return self.snapshot

    def scan_gpu(self, address: str) -> NodeSnapshot:
        return self.snapshot.only_gpu(address)

    def _refuse(self, *args: object) -> None:
        raise ReportedHostWriteError(
            f"node {self.snapshot.node}: a reported scan cannot be changed "
            "(fleet plan is read-only)"
        )

    def enable_sriov(self, pf: str) -> None:
        self._refuse(pf)

    def disable_sriov(self, pf: str) -> None:
        self._refuse(pf)

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None:
        self._refuse(parent, type_id, uuid)

    def remove_mdev(self, uuid: str) -> None:
        self._refuse(uuid)

    def set_vf_type(self, vf: str, type_id: int) -> None:
        self._refuse(vf, type_id)

    def clear_vf_type(self, vf: str) -> None:
        self._refuse(vf)

    def set_mig_mode(self, pf: str, enabled: bool) -> None:
        self._refuse(pf, enabled)

    def create_gpu_instance(self, pf: str, profile: str) -> int:
        self._refuse(pf, profile)
        return 0

    def destroy_gpu_instance(self, pf: str, gi_id: int) -> None:
        self._refuse(pf, gi_id)

    def set_heterogeneous_mode(self, pf: str, enabled: bool) -> None:
        self._refuse(pf, enabled)


@dataclass(frozen=True)
class NodePlan:
    """One node's line of a fleet plan."""

    node: str
    outcome: NodeOutcome
    plan: Plan | None = None
    """The node's plan (outcomes ``changes`` and ``no-changes``)."""
    reason: str = ""
    """For ``unknown`` and ``error``: a stable CamelCase code."""
    message: str = ""
    """For ``unknown`` and ``error``: what is wrong, in words."""
    warnings: tuple[str, ...] = ()
    scanned_at: datetime.datetime | None = None
    reported_config: str | None = None
    """The config the node's agent last selected (before this config file)."""
    reported_state: str | None = None
    evacuation: NodeEvacuation | None = None
    """Under ``in-use: evacuate``: the plan's moves and room, read with its scan."""


@dataclass(frozen=True)
class FleetCapacity:
    """One resource (and channel) summed over the planned nodes: vGPUs now and after."""

    resource: str | None
    type_name: str
    publish: Publish
    before: int
    after: int
    held: int
    nodes: int
    """Planned nodes that offer it now or after the plan."""


@dataclass(frozen=True)
class Totals:
    nodes: int = 0
    changed: int = 0
    unchanged: int = 0
    unknown: int = 0
    errors: int = 0
    create: int = 0
    destroy: int = 0
    sriov: int = 0
    blocked: int = 0
    capacity: tuple[FleetCapacity, ...] = ()
    disruption: tuple[tuple[Disruption, int], ...] = ()
    """Planned nodes per disruption level, every level listed (``none`` first)."""
    evacuation: FleetEvacuation | None = None
    """The moves (``in-use: evacuate``); ``None`` when no config of the file evacuates."""


class FleetSummary:
    """The totals of a fleet plan, added up one node at a time (a node's plan is not kept)."""

    def __init__(self, evacuation: bool = False) -> None:
        """``evacuation``: some config uses ``in-use: evacuate``: also add up the moves."""
        self.evacuation = EvacuationSummary() if evacuation else None
        self.nodes = 0
        self.count = {o: 0 for o in NodeOutcome}
        self.create = self.destroy = self.sriov = self.blocked = 0
        self.levels = {level: 0 for level in Disruption}
        self.capacity: dict[tuple[str, str, Publish], list[int]] = {}

    def add(self, n: NodePlan) -> None:
        self.nodes += 1
        self.count[n.outcome] += 1
        if self.evacuation is not None:
            self.evacuation.add(n)
        p = n.plan
        if p is None:
            return
        self.levels[p.disruption.level] += 1
        s = p.summary
        self.create += s.create
        self.destroy += s.destroy
        self.sriov += s.sriov
        self.blocked += s.blocked
        for c in p.capacity:
            if not c.before and not c.after:
                continue  # wanted, not created (a deferred switch): the node offers none
            key = (c.resource or "", c.type_name, c.publish)
            row = self.capacity.get(key)
            if row is None:
                row = self.capacity[key] = [0, 0, 0, 0]
            row[0] += c.before
            row[1] += c.after
            row[2] += c.held
            row[3] += 1

    def merge(self, other: FleetSummary) -> None:
        """Add what ``other`` counted (another part of the same fleet)."""
        self.nodes += other.nodes
        if other.evacuation is not None:
            if self.evacuation is None:
                self.evacuation = EvacuationSummary()
            self.evacuation.merge(other.evacuation)
        for o, n in other.count.items():
            self.count[o] += n
        self.create += other.create
        self.destroy += other.destroy
        self.sriov += other.sriov
        self.blocked += other.blocked
        for level, n in other.levels.items():
            self.levels[level] += n
        for key, row in other.capacity.items():
            mine = self.capacity.setdefault(key, [0, 0, 0, 0])
            for i, value in enumerate(row):
                mine[i] += value

    def totals(self) -> Totals:
        ordered = sorted(
            self.capacity.items(), key=lambda kv: (kv[0][0] or "~", kv[0][1], kv[0][2])
        )
        return Totals(
            nodes=self.nodes,
            changed=self.count[NodeOutcome.CHANGES],
            unchanged=self.count[NodeOutcome.NO_CHANGES],
            unknown=self.count[NodeOutcome.UNKNOWN],
            errors=self.count[NodeOutcome.ERROR],
            create=self.create,
            destroy=self.destroy,
            sriov=self.sriov,
            blocked=self.blocked,
            capacity=tuple(FleetCapacity(k[0] or None, k[1], k[2], *row) for k, row in ordered),
            disruption=tuple(self.levels.items()),
            evacuation=self.evacuation.result() if self.evacuation is not None else None,
        )


@dataclass(frozen=True)
class FleetTotals:
    """What a fleet plan says as a whole, without its nodes (a streamed fleet plan's end)."""

    totals: Totals
    now: datetime.datetime
    max_age: datetime.timedelta | None = None

    @property
    def complete(self) -> bool:
        """Every node was planned: none unknown, none failed."""
        return not (self.totals.unknown or self.totals.errors)

    @property
    def has_changes(self) -> bool:
        """Some node has a step to take or a blocked item."""
        return self.totals.changed > 0


@dataclass(frozen=True)
class FleetPlan:
    """Every node's plan, kept (small fleets and tests; ``fleet plan`` streams)."""

    nodes: tuple[NodePlan, ...]
    now: datetime.datetime
    max_age: datetime.timedelta | None = None
    totals: Totals = field(init=False)

    def __post_init__(self) -> None:
        summary = FleetSummary(any(n.plan is not None and evacuates(n.plan) for n in self.nodes))
        for n in self.nodes:
            summary.add(n)
        object.__setattr__(self, "totals", summary.totals())

    @property
    def summary(self) -> FleetTotals:
        return FleetTotals(self.totals, self.now, self.max_age)

    @property
    def complete(self) -> bool:
        """Every node was planned: none unknown, none failed."""
        return self.summary.complete

    @property
    def has_changes(self) -> bool:
        """Some node has a step to take or a blocked item."""
        return self.summary.has_changes


def _age(delta: datetime.timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d"


def plan_node(
    document: ConfigDocument,
    node: ReportedNode,
    settings: Settings,
    now: datetime.datetime,
    max_age: datetime.timedelta | None = None,
) -> NodePlan:
    """``node``'s plan under ``document``, made as its agent would make it from its report."""
    common: dict[str, Any] = {
        "scanned_at": node.scanned_at,
        "reported_config": node.reported_config,
        "reported_state": node.reported_state,
    }
    unknown = node.unknown
    snapshot = node.snapshot
    if unknown is None and (snapshot is None or node.labels is None):
        unknown = Unknown(UnknownReason.NO_SNAPSHOT, "the node reported no scan of its host")
    if unknown is None and snapshot is not None and snapshot.error is not None:
        unknown = Unknown(
            UnknownReason.HOST_UNREADABLE,
            f"the last scan could not read the host: {snapshot.error}",
        )
    if unknown is None and max_age is not None and node.scanned_at is not None:
        age = now - node.scanned_at
        if age > max_age:
            unknown = Unknown(
                UnknownReason.STALE,
                f"the last scan is {_age(age)} old ({node.scanned_at:%Y-%m-%dT%H:%M:%SZ}), "
                f"more than the {_age(max_age)} accepted; is the node's agent running?",
            )
    if unknown is not None or snapshot is None or node.labels is None:
        assert unknown is not None
        return NodePlan(
            node.name,
            NodeOutcome.UNKNOWN,
            reason=unknown.reason.value,
            message=unknown.message,
            **common,
        )
    ports = Ports(
        ReportedHost(snapshot),
        MemoryCluster(node.name, node.labels, node.in_use),
        StaticConfigSource(document),
    )
    try:
        # What reconcile_once computes before it compares or applies anything.
        inputs, plan = read_and_plan(ports, settings, _QUIET)
    except VgpuStateError as e:
        return NodePlan(
            node.name, NodeOutcome.ERROR, reason=e.reason.value, message=str(e), **common
        )
    warnings = list(inputs.warnings)
    if not node.in_use_known:
        warnings.append(
            "when the node last reported, which vGPUs pods hold was unknown: a vGPU shown "
            "here as destroyed may be held, and its agent will then block that destroy"
        )
    outcome = NodeOutcome.NO_CHANGES if plan.is_converged else NodeOutcome.CHANGES
    if evacuates(plan):
        common["evacuation"] = node_evacuation(plan, snapshot)
    return NodePlan(node.name, outcome, plan=plan, warnings=tuple(warnings), **common)


def plan_fleet(
    document: ConfigDocument,
    nodes: Iterable[ReportedNode],
    settings: Settings,
    now: datetime.datetime,
    max_age: datetime.timedelta | None = None,
) -> FleetPlan:
    """Every node's plan under ``document`` (see :func:`plan_node`), in the order given."""
    planned = tuple(plan_node(document, n, settings, now, max_age) for n in nodes)
    return FleetPlan(planned, now, max_age)


def _time(moment: datetime.datetime | None) -> str | None:
    if moment is None:
        return None
    return rfc3339(moment)


def fleet_document(fleet: FleetPlan, config_file: str) -> dict[str, Any]:
    """The fleet plan as JSON (``fleet plan -o json``); the shape is in docs/cluster.md."""
    return {
        **fleet_header(fleet.summary, config_file),
        "nodes": [node_document(n) for n in fleet.nodes],
    }


def fleet_header(fleet: FleetTotals, config_file: str) -> dict[str, Any]:
    """The fleet plan's JSON document up to its ``nodes`` (which come last)."""
    t = fleet.totals
    header: dict[str, Any] = {
        "kind": FLEET_PLAN_KIND,
        "format_version": FLEET_FORMAT_VERSION,
        "config_file": config_file,
        "generated_at": _time(fleet.now),
        "max_age_seconds": (
            int(fleet.max_age.total_seconds()) if fleet.max_age is not None else None
        ),
        "complete": fleet.complete,
        "totals": {
            "nodes": t.nodes,
            "changed": t.changed,
            "unchanged": t.unchanged,
            "unknown": t.unknown,
            "errors": t.errors,
            "create": t.create,
            "destroy": t.destroy,
            "sriov": t.sriov,
            "blocked": t.blocked,
            "disruption": {level.value: n for level, n in t.disruption},
            "capacity": [
                {
                    "resource": c.resource,
                    "type_name": c.type_name,
                    "publish": c.publish.value,
                    "before": c.before,
                    "after": c.after,
                    "held": c.held,
                    "nodes": c.nodes,
                }
                for c in t.capacity
            ],
        },
    }
    if t.evacuation is not None:
        header["evacuation"] = evacuation_document(t.evacuation)
    return header


def node_document(n: NodePlan, *, plan_as_model: bool = False) -> dict[str, Any]:
    """One node of the fleet plan's JSON ``nodes``.

    ``plan_as_model``: ``plan`` is the :class:`~vgpu_state.model.plan.Plan` itself, for a
    serializer that writes models (``pydantic_core.to_json``) in one pass; the JSON is
    the same."""
    plan: Any = n.plan if plan_as_model or n.plan is None else n.plan.model_dump(mode="json")
    return {
        "node": n.node,
        "outcome": n.outcome.value,
        "config": n.plan.selection.config if n.plan is not None else None,
        "selected_by": n.plan.selection.source if n.plan is not None else None,
        "reported_config": n.reported_config,
        "reported_state": n.reported_state,
        "scanned_at": _time(n.scanned_at),
        "reason": n.reason or None,
        "message": n.message or None,
        "warnings": list(n.warnings),
        "plan": plan,
    }
