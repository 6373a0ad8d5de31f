"""The controller loop: leader election, then one guarded KubeVirt CR write per change.

Every replica runs this loop; only the one holding the Lease
``vgpu-state-controller`` (in the controller's namespace) acts. A pass lists
every ``VGPUNodeState``, reads each node's checked report
(:mod:`vgpu_state.controller.reports`), reads the KubeVirt CR and sends at most
one JSON Patch guarded by ``test`` ops (:mod:`vgpu_state.controller.desired`).
A steady fleet costs a list, a read and a Lease renewal per pass, no CR write.

What the CR may permit is bounded by the layouts document (the agents' ConfigMap,
mounted; the one the fleet view plans with): without one, the controller adds and
removes nothing and says so every pass. A report it refuses, whole or in part, is
named once per change in a Warning Event on that node's ``VGPUNodeState``.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vgpu_state.catalog import Catalog
from vgpu_state.controller.bounds import LayoutBounds
from vgpu_state.controller.desired import Decision, Missing, decide
from vgpu_state.controller.fleetview import fleet_totals
from vgpu_state.controller.metrics import ControllerMetrics
from vgpu_state.controller.reports import NodeReport, read_report
from vgpu_state.kube import events, kubevirt, lease, nodestate
from vgpu_state.kube.api import JsonObject, KubeApi
from vgpu_state.kube.errors import ClusterError
from vgpu_state.kube.kubevirt import KubeVirtPlan, KubeVirtRef, WriteResult
from vgpu_state.model.errors import ConfigError, TransientError, VgpuStateError
from vgpu_state.model.status import EventType
from vgpu_state.ports.config import ConfigSource
from vgpu_state.reconcile.settings import Settings

log = logging.getLogger(__name__)

LEASE_NAME = lease.LEASE_NAME
DEFAULT_GRACE = 300.0
"""Seconds an owned entry stays after the last node stopped reporting its resource."""
DEFAULT_INTERVAL = 10.0
DEFAULT_LEASE_SECONDS = 30
DEFAULT_FLEET_INTERVAL = 60.0
"""Seconds between fleet views (each is a plan of every node)."""
REFUSED_REASON = "ReportRefused"
"""The reason of the Warning Event naming a refused report on its ``VGPUNodeState``."""
EVENT_COMPONENT = "vgpu-state-controller"
MAX_EVENTS_PER_PASS = 50
"""Refusal Events one pass writes at most (a document edit can refuse many nodes at once)."""
MAX_EVENT_MESSAGE = 1024
"""An Event's message is cut here (the API server refuses longer ones)."""


@dataclass(frozen=True)
class FleetViewSettings:
    """The layouts the fleet view plans with, as ``fleet plan -f`` would."""

    layouts: ConfigSource
    settings: Settings
    max_age: datetime.timedelta | None = datetime.timedelta(minutes=30)
    interval: float = DEFAULT_FLEET_INTERVAL


@dataclass(frozen=True)
class ControllerSettings:
    identity: str
    """This replica's name in the Lease (the pod's name)."""
    namespace: str = lease.DEFAULT_NAMESPACE
    kubevirt: KubeVirtRef | None = None
    """The KubeVirt CR; ``None``: the only one in the cluster."""
    grace: float = DEFAULT_GRACE
    interval: float = DEFAULT_INTERVAL
    lease_seconds: int = DEFAULT_LEASE_SECONDS
    lease_name: str = LEASE_NAME
    fleet: FleetViewSettings | None = None
    """Make the fleet view (metrics) while leading; ``None``: no fleet view."""
    layouts: ConfigSource | None = None
    """The layouts document that bounds the KubeVirt CR; ``None``: the fleet view's. With
    neither, the controller adds and removes no entry."""
    catalog: Catalog | None = None
    """The catalog the bounds check models and types against; ``None``: the fleet view's."""

    @property
    def bounding_layouts(self) -> ConfigSource | None:
        return self.layouts or (self.fleet.layouts if self.fleet is not None else None)

    @property
    def bounding_catalog(self) -> Catalog | None:
        return self.catalog or (self.fleet.settings.catalog if self.fleet is not None else None)


@dataclass
class PassResult:
    """What one pass saw and did."""

    reports: tuple[NodeReport, ...]
    decision: Decision
    write: WriteResult


@dataclass
class Controller:
    api: KubeApi
    settings: ControllerSettings
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime.datetime] = field(
        default=lambda: datetime.datetime.now(tz=datetime.UTC)
    )
    missing: Missing = field(default_factory=Missing)
    leading: bool = False
    writes: int = 0
    """Accepted KubeVirt CR writes since start."""
    metrics: ControllerMetrics = field(default_factory=ControllerMetrics)
    _last_view: float | None = None
    _reports: dict[str, tuple[str, LayoutBounds, NodeReport]] = field(default_factory=dict)
    """Each node's last report, with the ``resourceVersion`` and bounds it was read with: an
    unchanged status is not decoded and checked again while the document is unchanged."""
    _bounds: LayoutBounds | None = None
    _uids: dict[str, str] = field(default_factory=dict)
    """Each ``VGPUNodeState``'s uid, for the Events about it (``kubectl describe`` matches
    Events by the object's uid)."""
    _named: dict[str, str] = field(default_factory=dict)
    """What the last Warning Event on each node's ``VGPUNodeState`` said (one Event per
    change, not per pass)."""

    def lead(self) -> bool:
        """Take or renew the Lease; ``True`` while this replica leads."""
        s = self.settings
        state = lease.try_acquire(
            self.api,
            s.identity,
            namespace=s.namespace,
            name=s.lease_name,
            duration=s.lease_seconds,
            now=self.wall(),
        )
        if state.held != self.leading:
            if state.held:
                log.info("%s leads (Lease %s/%s)", s.identity, s.namespace, s.lease_name)
            else:
                log.info("%s follows %s", s.identity, state.holder)
            # A new term starts every grace clock afresh: what the last leader saw is unknown.
            self.missing = Missing()
        self.leading = state.held
        self.metrics.leader.set(1 if state.held else 0)
        return state.held

    def sync(self) -> PassResult:
        """One pass (whether or not this replica leads: the caller decides)."""
        ref = kubevirt.find(self.api, self.settings.kubevirt)
        bounds, no_layouts = self._layout_bounds()
        listed = nodestate.list_all(self.api)
        reports = tuple(self._report(obj, bounds) for obj in listed)
        names = {str((obj.get("metadata") or {}).get("name") or "") for obj in listed}
        self._reports = {name: kept for name, kept in self._reports.items() if name in names}
        decisions: list[Decision] = []

        def compute(cr: JsonObject) -> KubeVirtPlan:
            decisions.append(
                decide(cr, reports, self.missing, self.clock(), self.settings.grace, no_layouts)
            )
            return decisions[-1].plan

        try:
            result = kubevirt.write(self.api, ref, compute)
        except (ClusterError, TransientError):
            self.metrics.kubevirt_in_step.set(0)
            raise
        decision = decisions[-1]
        self.missing = decision.missing
        self.writes += result.writes
        m = self.metrics
        if result.writes:
            m.kubevirt_writes.labels("ok").inc(result.writes)
        m.kubevirt_in_step.set(1)
        m.removals_waiting.set(len(decision.waiting))
        m.reports_refused.set(len(decision.refused))
        m.last_pass.set(time.time())
        if decision.held and no_layouts is None:
            log.warning("KubeVirt CR %s: removals suspended: %s", ref, decision.held)
        for resource, left in decision.waiting:
            log.debug("%s: reported by no node; removed in %.0f s", resource, left)
        for r in reports:
            if r.skipped:
                log.info("node %s: %d vGPU(s) left out: %s", r.node, r.skipped.count, r.skipped)
        self._name_refusals(reports, decision)
        return PassResult(reports, decision, result)

    def _layout_bounds(self) -> tuple[LayoutBounds | None, str | None]:
        """This pass's bounds, or why there are none (then the CR is left as it is)."""
        source, catalog = self.settings.bounding_layouts, self.settings.bounding_catalog
        if source is None or catalog is None:
            why = "the controller has no layouts document (--config-file)"
        else:
            try:
                document = source.document()
            except ConfigError as e:
                why = f"the layouts document cannot be read: {str(e).splitlines()[0]}"
            else:
                if source.error is not None:
                    log.warning(
                        "layouts document: the newest read is not used, the last good one "
                        "bounds the KubeVirt CR: %s",
                        str(source.error).splitlines()[0],
                    )
                bounds = LayoutBounds.of(document, catalog)
                if bounds != self._bounds:
                    self._bounds = bounds
                self.metrics.layouts_loaded.set(1)
                return self._bounds, None
        self.metrics.layouts_loaded.set(0)
        why += "; no KubeVirt CR entry is added or removed until one can be read"
        log.error("%s", why)
        return None, why

    def _report(self, obj: JsonObject, bounds: LayoutBounds | None) -> NodeReport:
        meta = obj.get("metadata") or {}
        name, version = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        if meta.get("uid"):
            self._uids[name] = str(meta["uid"])
        if bounds is None:
            return NodeReport(name, unreadable="no layouts document bounds the KubeVirt CR")
        kept = self._reports.get(name)
        if kept is not None and version and kept[0] == version and kept[1] is bounds:
            return kept[2]
        report = read_report(obj, bounds)
        self._reports[name] = (version, bounds, report)
        return report

    def _name_refusals(self, reports: tuple[NodeReport, ...], decision: Decision) -> None:
        """Count what this pass refused; name each node whose refusal changed in a Warning
        Event on its ``VGPUNodeState`` and a log line."""
        said: dict[str, list[str]] = {}
        for r in reports:
            if r.refused is not None:
                said.setdefault(r.node, []).append(f"its status is refused: {r.refused}")
            if r.outside:
                said.setdefault(r.node, []).append(
                    f"{r.outside.count} vGPU(s) outside what the layouts document and the "
                    f"catalog allow, not permitted: {r.outside}"
                )
        for c in decision.conflicts:
            said.setdefault(c.node, []).append(c.message)
        m = self.metrics
        m.claims_refused.labels("layouts").set(sum(r.outside.count for r in reports))
        m.claims_refused.labels("conflict").set(len(decision.conflicts))
        self._named = {n: text for n, text in self._named.items() if n in said}
        present = {r.node for r in reports}
        self._uids = {n: uid for n, uid in self._uids.items() if n in present}
        budget = MAX_EVENTS_PER_PASS
        for node in sorted(said):
            text = "; ".join(said[node])
            if len(text) > MAX_EVENT_MESSAGE:
                text = text[: MAX_EVENT_MESSAGE - 1] + "…"
            if self._named.get(node) == text:
                continue
            if budget == 0:
                break  # the rest on the next passes: a pass never floods the API server
            budget -= 1
            log.warning("VGPUNodeState %s refused: %s", node, text)
            try:
                events.record(
                    self.api,
                    node,
                    REFUSED_REASON,
                    text,
                    EventType.WARNING,
                    involved={
                        "apiVersion": nodestate.API_VERSION,
                        "kind": nodestate.KIND,
                        "name": node,
                    }
                    | ({"uid": self._uids[node]} if node in self._uids else {}),
                    instance=self.settings.identity,
                    component=EVENT_COMPONENT,
                    now=self.wall(),
                )
            except (ClusterError, TransientError) as e:
                log.warning("Event on VGPUNodeState %s not written (retried): %s", node, e)
                continue
            m.refusal_events.inc()
            self._named[node] = text

    def run_once(self) -> PassResult | None:
        """Lead, then one pass; ``None`` when another replica leads."""
        return self.sync() if self.lead() else None

    def fleet_view(self, force: bool = False) -> bool:
        """Make the fleet view when it is due (every ``fleet.interval`` s); ``True`` if made."""
        view = self.settings.fleet
        if view is None:
            return False
        now = self.clock()
        if not force and self._last_view is not None and now - self._last_view < view.interval:
            return False
        self._last_view = now
        try:
            totals = fleet_totals(self.api, view.layouts, view.settings, self.wall(), view.max_age)
        except (VgpuStateError, ClusterError, TransientError) as e:
            self.metrics.fleet_view_errors.inc()
            log.warning("fleet view failed (retried in %.0f s): %s", view.interval, e)
            return False
        self.metrics.fleet(totals, time.time())
        return True

    def run(self, stop: threading.Event) -> None:
        """Pass every ``interval`` seconds until ``stop``; errors are logged and retried."""
        while not stop.is_set():
            try:
                self.run_once()
                self.metrics.passes.labels("ok").inc()
            except (TransientError, ClusterError) as e:
                self.metrics.passes.labels("error").inc()
                log.warning("pass failed, retried in %.0f s: %s", self.settings.interval, e)
            if self.leading:
                self.fleet_view()
            stop.wait(self.settings.interval)
        if self.leading:
            lease.release(
                self.api,
                self.settings.identity,
                namespace=self.settings.namespace,
                name=self.settings.lease_name,
            )
