"""A fleet plan's moves under ``in-use: evacuate``: which VMs would move, where there is
room for them, which moves cannot happen and why, and what is withheld meanwhile.

A pure function of the nodes' plans, added up one node at a time (a fleet plan keeps
no node's plan): each node gives its moves and its room after its own plan
(:func:`~vgpu_state.planner.evacuation.node_evacuation`); once every node is in, each
move gets the other nodes with a free, unwithheld vGPU of the resource it holds. The
output is bounded: at most :data:`MAX_MOVES` moves and :data:`MAX_TARGETS` nodes per
move are listed, the rest counted. None of this is made when no config of the file
uses ``in-use: evacuate`` (:func:`document_evacuates`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vgpu_state.config.document import ConfigDocument
from vgpu_state.model.plan import Plan
from vgpu_state.model.policy import InUsePolicy, Publish
from vgpu_state.planner.evacuation import NodeEvacuation, evacuates, node_evacuation

if TYPE_CHECKING:
    from vgpu_state.reconcile.fleet import NodePlan

MAX_MOVES = 200
"""Moves listed (by node, then VM); the rest are counted."""
MAX_TARGETS = 5
"""Nodes with room listed per move; the rest are counted."""

_Room = tuple[str, Publish]
"""(resource, channel)."""


def document_evacuates(document: ConfigDocument) -> bool:
    """Some config of ``document`` has ``in-use: evacuate`` (its own or the top level's)."""
    top = document.spec.policy.in_use if document.spec.policy is not None else None
    for config in document.spec.vgpu_configs.values():
        own = config.policy.in_use if config.policy is not None else None
        if (own or top) is InUsePolicy.EVACUATE:
            return True
    return False


@dataclass(frozen=True, order=True)
class _Pending:
    """A move as a node gave it, before the fleet's room is known (ordered for output)."""

    node: str
    who: str
    vgpu: str
    gpu: str
    holder: str
    vm: str | None
    type_name: str | None
    resource: str | None
    publish: Publish


@dataclass(frozen=True)
class FleetMove:
    """A VM (or another holder) in the way of a node's switch, and where it could go."""

    node: str
    """The node it leaves."""
    gpu: str
    vgpu: str
    holder: str
    vm: str | None
    """``namespace/name``; ``None`` when the holder is not a KubeVirt VM."""
    type_name: str | None
    resource: str | None
    publish: Publish
    targets: tuple[str, ...] = ()
    """Other nodes with a free, unwithheld vGPU of ``resource`` after their plans (the
    first :data:`MAX_TARGETS`, by name)."""
    more_targets: int = 0
    reason: str = ""
    """Why the move cannot happen; empty when it can."""

    @property
    def possible(self) -> bool:
        return not self.reason

    @property
    def type_label(self) -> str:
        return self.type_name or self.resource or "a vGPU of unknown type"


@dataclass(frozen=True)
class ResourceMoves:
    """One resource the moving VMs hold: how many move, how many are free elsewhere."""

    resource: str
    publish: Publish
    type_name: str
    moving: int
    free: int
    """Free, unwithheld vGPUs of it on the planned nodes after their plans (those of
    nodes that VMs leave included)."""


@dataclass(frozen=True)
class FleetWithheld:
    """One resource withheld during the change: vGPUs and nodes."""

    resource: str | None
    type_name: str
    withheld: int
    nodes: int


@dataclass(frozen=True)
class FleetEvacuation:
    """The moves section of a fleet plan."""

    moves: tuple[FleetMove, ...] = ()
    """The first :data:`MAX_MOVES`, by node and VM."""
    total: int = 0
    possible: int = 0
    left_out: int = 0
    """Moves not listed (past :data:`MAX_MOVES`)."""
    resources: tuple[ResourceMoves, ...] = ()
    withheld: tuple[FleetWithheld, ...] = ()
    max_in_flight: int | None = None
    """The top-level ``evacuation.max-in-flight`` (``None`` when no node's plan evacuates)."""

    @property
    def impossible(self) -> int:
        return self.total - self.possible


@dataclass
class EvacuationSummary:
    """Adds up the nodes' moves and room, a node at a time; mergeable across processes."""

    pending: list[_Pending] = field(default_factory=list)
    dropped: int = 0
    """Moves dropped from ``pending`` past :data:`MAX_MOVES` (their counts are kept)."""
    room: dict[_Room, list[tuple[str, int]]] = field(default_factory=dict)
    """(resource, channel) -> (node, free vGPUs) of every planned node with room."""
    moving: Counter[tuple[str, Publish, str]] = field(default_factory=Counter)
    """(resource, channel, node it leaves) -> VMs (every move of a VM whose resource is
    known, listed or not)."""
    names: dict[_Room, str] = field(default_factory=dict)
    """A type name of each resource that VMs hold (for the output)."""
    unmovable: int = 0
    """Moves of holders that are not VMs, or of a vGPU whose resource is not known."""
    withheld: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    """(resource or "", type name) -> [vGPUs, nodes]."""
    max_in_flight: int | None = None

    def add(self, n: NodePlan) -> None:
        plan = n.plan
        if plan is None:
            return
        ev = n.evacuation if n.evacuation is not None else _node(plan)
        if evacuates(plan) and self.max_in_flight is None:
            self.max_in_flight = plan.policy.evacuation.max_in_flight
        for resource, publish, free in ev.room:
            self.room.setdefault((resource, publish), []).append((n.node, free))
        for resource_or_none, type_name, count in ev.withheld:
            row = self.withheld.setdefault((resource_or_none, type_name), [0, 0])
            row[0] += count
            row[1] += 1
        for nm in ev.moves:
            m = nm.move
            if m.vm is not None and m.resource is not None:
                self.moving[(m.resource, nm.publish, n.node)] += 1
                self.names.setdefault((m.resource, nm.publish), m.type_name or m.resource)
            else:
                self.unmovable += 1
            self.pending.append(
                _Pending(
                    n.node,
                    m.vm or m.holder,
                    m.vgpu,
                    nm.gpu,
                    m.holder,
                    m.vm,
                    m.type_name,
                    m.resource,
                    nm.publish,
                )
            )
        self._bound()

    def merge(self, other: EvacuationSummary) -> None:
        self.pending.extend(other.pending)
        self.dropped += other.dropped
        for key, rows in other.room.items():
            self.room.setdefault(key, []).extend(rows)
        self.moving.update(other.moving)
        for key, name in other.names.items():
            self.names.setdefault(key, name)
        self.unmovable += other.unmovable
        for wkey, row in other.withheld.items():
            mine = self.withheld.setdefault(wkey, [0, 0])
            mine[0] += row[0]
            mine[1] += row[1]
        if self.max_in_flight is None:
            self.max_in_flight = other.max_in_flight
        self._bound()

    def _bound(self) -> None:
        """Keep the first :data:`MAX_MOVES` moves (in output order), count the rest."""
        if len(self.pending) > 2 * MAX_MOVES:
            self.pending.sort()
            self.dropped += len(self.pending) - MAX_MOVES
            del self.pending[MAX_MOVES:]

    def result(self) -> FleetEvacuation:
        self._bound()
        pending = sorted(self.pending)
        listed = pending[:MAX_MOVES]
        dropped = self.dropped + len(pending) - len(listed)
        room = {key: sorted(rows) for key, rows in self.room.items()}
        members = {key: {node for node, _ in rows} for key, rows in room.items()}
        moves = tuple(_placed(p, room, members) for p in listed)
        # Counted over every move, listed or not: a VM whose resource is known can move
        # when a node other than its own has room for it.
        possible = 0
        by_resource: Counter[_Room] = Counter()
        for (resource, publish, source), n in self.moving.items():
            by_resource[(resource, publish)] += n
            if any(node != source for node, _ in room.get((resource, publish), ())):
                possible += n
        resources = tuple(
            ResourceMoves(
                resource=key[0],
                publish=key[1],
                type_name=self.names.get(key, key[0]),
                moving=n,
                free=sum(free for _, free in room.get(key, ())),
            )
            for key, n in sorted(by_resource.items())
        )
        withheld = tuple(
            FleetWithheld(resource or None, type_name, row[0], row[1])
            for (resource, type_name), row in sorted(
                self.withheld.items(), key=lambda kv: (kv[0][0] or "~", kv[0][1])
            )
        )
        return FleetEvacuation(
            moves=moves,
            total=sum(self.moving.values()) + self.unmovable,
            possible=possible,
            left_out=dropped,
            resources=resources,
            withheld=withheld,
            max_in_flight=self.max_in_flight,
        )


def _node(plan: Plan) -> NodeEvacuation:
    """A node's part from its plan alone: a plan not made under ``evacuate`` withholds
    nothing, so its room follows from its capacity."""
    return node_evacuation(plan)


def _placed(
    p: _Pending, room: dict[_Room, list[tuple[str, int]]], members: dict[_Room, set[str]]
) -> FleetMove:
    """``p`` with the nodes that have room for it, or why it cannot move."""
    base: dict[str, Any] = {
        "node": p.node,
        "gpu": p.gpu,
        "vgpu": p.vgpu,
        "holder": p.holder,
        "vm": p.vm,
        "type_name": p.type_name,
        "resource": p.resource,
        "publish": p.publish,
    }
    if p.vm is None:
        return FleetMove(**base, reason="not a KubeVirt VM")
    if p.resource is None:
        return FleetMove(
            **base, reason="the resource of its vGPU is not known: no node can be chosen"
        )
    rows = room.get((p.resource, p.publish), ())
    # The first few other nodes, and how many there are (a node has one row per resource).
    targets = list(itertools.islice((node for node, _ in rows if node != p.node), MAX_TARGETS))
    others = len(rows) - (p.node in members.get((p.resource, p.publish), ())) if targets else 0
    if not targets:
        channel = " through DRA" if p.publish is Publish.DRA else ""
        return FleetMove(
            **base,
            reason=f"no room elsewhere: no other node offers a free {p.type_name or p.resource}"
            f"{channel} after its plan",
        )
    return FleetMove(**base, targets=tuple(targets), more_targets=others - len(targets))


# output ---------------------------------------------------------------------------------------
def evacuation_document(ev: FleetEvacuation) -> dict[str, Any]:
    """The ``evacuation`` part of ``fleet plan -o json`` (docs/cluster.md)."""
    return {
        "max_in_flight": ev.max_in_flight,
        "totals": {"moves": ev.total, "possible": ev.possible, "impossible": ev.impossible},
        "moves": [
            {
                "node": m.node,
                "gpu": m.gpu,
                "vgpu": m.vgpu,
                "holder": m.holder,
                "vm": m.vm,
                "type_name": m.type_name,
                "resource": m.resource,
                "publish": m.publish.value,
                "possible": m.possible,
                "targets": list(m.targets),
                "more_targets": m.more_targets,
                "reason": m.reason or None,
            }
            for m in ev.moves
        ],
        "moves_left_out": ev.left_out,
        "resources": [
            {
                "resource": r.resource,
                "publish": r.publish.value,
                "type_name": r.type_name,
                "moving": r.moving,
                "free": r.free,
            }
            for r in ev.resources
        ],
        "withheld": [
            {
                "resource": w.resource,
                "type_name": w.type_name,
                "withheld": w.withheld,
                "nodes": w.nodes,
            }
            for w in ev.withheld
        ],
    }


def _targets(m: FleetMove) -> str:
    more = f" and {m.more_targets} more" if m.more_targets else ""
    return ", ".join(m.targets) + more


def move_text(m: FleetMove) -> str:
    """``vms/win-7 leaves node-a: A2-4Q free on node-b, node-c``, or why it cannot."""
    if m.vm is None:
        return (
            f"{m.holder} on {m.node} cannot be moved: {m.reason}; GPU {m.gpu} switches "
            "once it lets go"
        )
    if not m.possible:
        return f"{m.vm} cannot leave {m.node}: {m.reason}"
    return f"{m.vm} leaves {m.node}: {m.type_label} free on {_targets(m)}"


def budget_text(ev: FleetEvacuation) -> str:
    """How many move at once (``max-in-flight``)."""
    if ev.max_in_flight == 0:
        return (
            "max-in-flight is 0: no VM is moved; the capacity stays withheld until the holders go"
        )
    if ev.max_in_flight is None:
        return ""
    return f"at most {ev.max_in_flight} at a time fleet-wide (max-in-flight)"


def summary_text(ev: FleetEvacuation) -> str:
    vms = "1 VM" if ev.possible == 1 else f"{ev.possible} VMs"
    cannot = ev.impossible
    parts = [f"{vms} would move"]
    if cannot:
        parts.append(f"{cannot} {'move cannot' if cannot == 1 else 'moves cannot'} happen")
    budget = budget_text(ev)
    return ", ".join(parts) + (f"; {budget}" if budget else "") + "."


def short_text(ev: FleetEvacuation) -> list[str]:
    """Resource lines worth a warning: more VMs moving than free vGPUs elsewhere."""
    lines = []
    for r in ev.resources:
        if r.moving > r.free:
            lines.append(
                f"{r.type_name}: {r.moving} VM(s) would move but {r.free} free vGPU(s) of "
                f"{r.resource} exist after the plans: some wait until more is free"
            )
    return lines


def withheld_text(w: FleetWithheld) -> str:
    name = w.resource or f"{w.type_name} (resource name not known yet)"
    return f"{name}: {w.withheld} on {w.nodes} node(s)"


def evacuation_lines(ev: FleetEvacuation) -> list[str]:
    """``fleet plan``'s text section (after the capacity)."""
    if not ev.total and not ev.withheld:
        return []
    lines = [f"Moves (in-use: evacuate): {summary_text(ev)}"]
    lines += [f"  {move_text(m)}" for m in ev.moves]
    if ev.left_out:
        lines.append(
            f"  … and {ev.left_out} more move(s) (the first {MAX_MOVES} are listed, by node)"
        )
    lines += [f"  warning: {line}" for line in short_text(ev)]
    if ev.withheld:
        lines.append(
            "Withheld during the change (free vGPUs not offered while a switch is pending):"
        )
        lines += [f"  {withheld_text(w)}" for w in ev.withheld]
    return lines
