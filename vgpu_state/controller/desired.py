"""The KubeVirt CR the fleet needs, from every node's report, with a grace period (pure).

* **Add** every entry some node's checked report justifies, within what the
  layouts document can produce (:mod:`vgpu_state.controller.bounds`).
* **Agree or refuse.** Nodes that report one resource with different entries
  (an mdev here, a VF there, or another selector) are settled by the majority
  of the nodes reporting it; the others' entries are refused and named
  (:class:`Conflict`), never written. With no majority the CR's entry for that
  resource is left exactly as it is (none is added to a CR that has none), so
  one hostile node can neither move an entry nor have its own written. The
  order of node names decides nothing.
* **No layouts document, no change.** Without a document that bounds the CR,
  nothing is added and nothing is removed.
* **Remove** an entry vgpu-state owns only when no node has reported its
  resource for ``grace`` seconds. The clock of a resource starts when the
  controller first sees it missing (a new leader starts every clock afresh);
  a report naming it again stops it.
* **Never remove while unsure.** While any node's status is unreadable (no
  scan yet, a scan this version cannot decode), nothing is removed and every
  clock starts again: that node may need anything. A report that is read but
  refused (another node's scan, repeated PCI addresses) justifies nothing and
  stops nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu_state.controller.reports import NodeReport
from vgpu_state.kube.permitted import (
    KubeVirtPlan,
    PermittedEntry,
    managed_resources,
    plan_write,
)


@dataclass(frozen=True)
class Missing:
    """Since when (controller clock, seconds) each owned resource has gone unreported."""

    since: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Conflict:
    """A node's entry for a resource other nodes report otherwise: refused, never written."""

    node: str
    entry: PermittedEntry
    agreed: PermittedEntry | None
    """The entry the majority reports (``None``: no majority; the CR is left as it is)."""
    others: int
    """How many nodes report the resource with another entry."""

    @property
    def message(self) -> str:
        theirs = (
            f"{self.others} other node(s) report it as {describe(self.agreed)}"
            if self.agreed is not None
            else f"{self.others} other node(s) report it otherwise and no entry has a "
            "majority, so the KubeVirt CR's entry is left as it is"
        )
        return (
            f"node {self.node} reports {self.entry.resource} as {describe(self.entry)}; "
            f"{theirs}: refused"
        )


def describe(entry: PermittedEntry) -> str:
    """``mediatedDevices (mdevNameSelector NVIDIA A2-4Q)``."""
    key = "mdevNameSelector" if entry.list == "mediatedDevices" else "pciVendorSelector"
    return f"{entry.list} ({key} {entry.selector})"


@dataclass(frozen=True)
class Resolution:
    """The entries the fleet agrees on, the resources it does not, and who disagreed."""

    entries: tuple[PermittedEntry, ...] = ()
    unsettled: frozenset[str] = frozenset()
    """Resources whose reports tie: their CR entry stays as it is."""
    conflicts: tuple[Conflict, ...] = ()


@dataclass(frozen=True)
class Decision:
    """One pass: the CR change, what waits for its grace period, and why nothing was removed."""

    plan: KubeVirtPlan
    missing: Missing
    waiting: tuple[tuple[str, float], ...] = ()
    """Owned resources nobody reports, with the seconds left before they are removed."""
    held: str | None = None
    """Why removals are suspended this pass (an unreadable status), if they are."""
    refused: tuple[str, ...] = ()
    """Nodes whose reports were refused, with the reason."""
    conflicts: tuple[Conflict, ...] = ()
    """Entries refused because other nodes report their resource otherwise."""


def wanted_entries(reports: Iterable[NodeReport]) -> Resolution:
    """One entry per resource some report justifies, the majority's where nodes disagree
    (see the module)."""
    claims: dict[str, dict[PermittedEntry, list[str]]] = {}
    for report in reports:
        if report.unreadable is None and report.refused is None:
            for entry in report.entries:
                claims.setdefault(entry.resource, {}).setdefault(entry, []).append(report.node)
    entries: list[PermittedEntry] = []
    unsettled: set[str] = set()
    conflicts: list[Conflict] = []
    for resource in sorted(claims):
        by_entry = claims[resource]
        total = sum(len(nodes) for nodes in by_entry.values())
        top = max(len(nodes) for nodes in by_entry.values())
        leaders = [e for e, nodes in by_entry.items() if len(nodes) == top]
        agreed = leaders[0] if len(leaders) == 1 else None
        if agreed is not None:
            entries.append(agreed)
        else:
            unsettled.add(resource)
        for entry in sorted(by_entry):
            if entry != agreed:
                nodes = by_entry[entry]
                conflicts.extend(
                    Conflict(node, entry, agreed, total - len(nodes)) for node in sorted(nodes)
                )
    return Resolution(tuple(entries), frozenset(unsettled), tuple(conflicts))


def decide(
    cr: Mapping[str, Any],
    reports: Iterable[NodeReport],
    missing: Missing,
    now: float,
    grace: float,
    no_layouts: str | None = None,
    *,
    fence: str | None = None,
) -> Decision:
    """The guarded change that brings ``cr`` to what ``reports`` need (see the module).

    ``no_layouts``: why no layouts document bounds the CR; then nothing changes but the
    writer's term token. ``fence``: the writer's term token the patch carries
    (:func:`plan_write`).
    """
    reports = list(reports)
    refused = tuple(f"{r.node}: {r.refused}" for r in reports if r.refused is not None)
    if no_layouts is not None:
        plan = plan_write(cr, (), None, fence=fence)
        return Decision(plan, Missing(), held=no_layouts, refused=refused)
    resolution = wanted_entries(reports)
    wanted = resolution.entries
    reported = {e.resource for e in wanted} | resolution.unsettled
    unreadable = [r for r in reports if r.unreadable is not None]
    owned = managed_resources(cr)
    since: dict[str, float] = {}
    held: str | None = None
    if unreadable:
        first = unreadable[0]
        held = (
            f"node {first.node}'s status cannot be read ({first.unreadable})"
            + (f", and {len(unreadable) - 1} more" if len(unreadable) > 1 else "")
            + "; no entry is removed until every status can be read"
        )
        keep = set(owned)
    else:
        keep = set(reported)
        for resource in sorted(owned - reported):
            start = missing.since.get(resource, now)
            since[resource] = start
            if now - start < grace:
                keep.add(resource)
    waiting = tuple((r, max(0.0, grace - (now - s))) for r, s in sorted(since.items()) if r in keep)
    return Decision(
        plan_write(cr, wanted, keep, fence=fence),
        Missing(since),
        waiting,
        held,
        refused,
        resolution.conflicts,
    )
