"""The controller loop: leader election, then one guarded KubeVirt CR write per change.

Every replica runs this loop; only the one holding the Lease
``vgpu-state-controller`` (in the controller's namespace) acts. A pass lists
every ``VGPUNodeState`` page by page (each object decoded as it arrives, only what a
report is read from kept), reads each node's checked report
(:mod:`vgpu_state.controller.reports`), reads the KubeVirt CR and sends at most
one JSON Patch guarded by ``test`` ops (:mod:`vgpu_state.controller.desired`).
A steady fleet costs a list, a read and a Lease renewal per pass, no CR write.

Memory is bounded per node, whatever nodes report: a status's size is bounded by the
CRD (:mod:`vgpu_state.kube.nodestate`), a scan's decoding by
:data:`~vgpu_state.kube.nodestate.MAX_SNAPSHOT_BYTES`, and what is kept of a node
between passes is a summary (:func:`summary`): its entries (at most
:data:`~vgpu_state.kube.nodestate.MAX_RESOURCES`, shared between nodes) and the first
few skipped vGPUs.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from vgpu_state.controller.desired import Decision, Missing, decide
from vgpu_state.controller.fleetview import fleet_totals
from vgpu_state.controller.metrics import ControllerMetrics
from vgpu_state.controller.reports import NodeReport, read_report
from vgpu_state.kube import kubevirt, lease, nodestate
from vgpu_state.kube.api import JsonObject, KubeApi
from vgpu_state.kube.errors import ClusterError
from vgpu_state.kube.kubevirt import KubeVirtPlan, KubeVirtRef, WriteResult
from vgpu_state.kube.permitted import PermittedEntry
from vgpu_state.model.errors import TransientError, VgpuStateError
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
MAX_SKIPPED = 5
"""Skipped vGPUs kept (and logged) per node; the rest are counted."""


def summary(report: NodeReport, shared: dict[PermittedEntry, PermittedEntry]) -> NodeReport:
    """What is kept of ``report`` between passes: its entries (the instances in ``shared``,
    so that nodes reporting the same entries hold one copy), the first
    :data:`MAX_SKIPPED` skipped vGPUs and how many more there were. A report justifying
    more entries than a status may count resources is refused."""
    if len(report.entries) > nodestate.MAX_RESOURCES:
        return NodeReport(
            report.node,
            refused=f"its scan justifies {len(report.entries)} resources; a node reports at "
            f"most {nodestate.MAX_RESOURCES}",
        )
    skipped = report.skipped
    if len(skipped) > MAX_SKIPPED:
        more = f"and {len(skipped) - MAX_SKIPPED} more vGPU(s) left out"
        skipped = (*skipped[:MAX_SKIPPED], more)
    entries = tuple(shared.setdefault(e, e) for e in report.entries)
    return replace(report, entries=entries, skipped=skipped)


def _for_report(obj: JsonObject) -> JsonObject:
    """Of a listed ``VGPUNodeState``, what :func:`read_report` reads (its name, node and
    reported scan, the scan's data cut one character past what a status may hold)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status")
    snapshot = status.get("snapshot") if isinstance(status, dict) else None
    kept: JsonObject = {"metadata": {"name": meta.get("name")}, "spec": obj.get("spec")}
    if isinstance(snapshot, dict):
        data = snapshot.get("data")
        if isinstance(data, str) and len(data) > nodestate.MAX_SNAPSHOT_DATA:
            snapshot = {**snapshot, "data": data[: nodestate.MAX_SNAPSHOT_DATA + 1]}
        kept["status"] = {"snapshot": snapshot}
    elif status is not None:
        kept["status"] = {}
    return kept


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
    _reports: dict[str, tuple[str, NodeReport]] = field(default_factory=dict)
    """Each node's last report (a :func:`summary`), with the ``resourceVersion`` it was read
    from: an unchanged status is not decoded and checked again."""

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
        listed = nodestate.list_pages(self.api, self._listed)
        reports = tuple(self._reports_of(listed))
        decisions: list[Decision] = []

        def compute(cr: JsonObject) -> KubeVirtPlan:
            decisions.append(decide(cr, reports, self.missing, self.clock(), self.settings.grace))
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
        if decision.held:
            log.warning("KubeVirt CR %s: removals suspended: %s", ref, decision.held)
        for why in decision.refused:
            log.warning("VGPUNodeState refused: %s", why)
        for resource, left in decision.waiting:
            log.debug("%s: reported by no node; removed in %.0f s", resource, left)
        for r in reports:
            for skipped in r.skipped:
                log.info("node %s: %s", r.node, skipped)
        return PassResult(reports, decision, result)

    def _listed(self, obj: JsonObject) -> tuple[str, str, NodeReport | JsonObject]:
        """A listed object as its name, ``resourceVersion`` and kept report, or, when the
        status changed since, what a report is read from."""
        meta = obj.get("metadata") or {}
        name, version = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        kept = self._reports.get(name)
        if kept is not None and version and kept[0] == version:
            return name, version, kept[1]
        return name, version, _for_report(obj)

    def _reports_of(
        self, pages: Iterable[list[tuple[str, str, NodeReport | JsonObject]]]
    ) -> list[NodeReport]:
        """Every listed node's report, page by page; what is kept is the listed nodes'."""
        reports: list[NodeReport] = []
        kept: dict[str, tuple[str, NodeReport]] = {}
        shared: dict[PermittedEntry, PermittedEntry] = {}
        for page in pages:
            for name, version, listed in page:
                if isinstance(listed, NodeReport):
                    report = listed  # a summary already: its entries join this pass's
                    for entry in report.entries:
                        shared.setdefault(entry, entry)
                else:
                    report = summary(read_report(listed), shared)
                kept[name] = (version, report)
                reports.append(report)
        self._reports = kept
        return reports

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
