"""The KubeVirt CR the fleet needs, from every node's report, with a grace period (pure).

* **Add** every entry some node's checked report justifies (the first node in
  name order wins a resource).
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


def wanted_entries(reports: Iterable[NodeReport]) -> tuple[PermittedEntry, ...]:
    """Every entry some report justifies, one per resource (first node by name wins)."""
    found: dict[str, PermittedEntry] = {}
    for report in sorted(reports, key=lambda r: r.node):
        if report.unreadable is None and report.refused is None:
            for entry in report.entries:
                found.setdefault(entry.resource, entry)
    return tuple(found.values())


def decide(
    cr: Mapping[str, Any],
    reports: Iterable[NodeReport],
    missing: Missing,
    now: float,
    grace: float,
) -> Decision:
    """The guarded change that brings ``cr`` to what ``reports`` need (see the module)."""
    reports = list(reports)
    wanted = wanted_entries(reports)
    reported = {e.resource for e in wanted}
    unreadable = [r for r in reports if r.unreadable is not None]
    refused = tuple(f"{r.node}: {r.refused}" for r in reports if r.refused is not None)
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
    waiting = tuple(
        (r, max(0.0, grace - (now - s))) for r, s in sorted(since.items()) if r in keep
    )
    return Decision(plan_write(cr, wanted, keep), Missing(since), waiting, held, refused)
