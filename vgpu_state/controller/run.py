"""The controller loop: leader election, then one guarded KubeVirt CR write per change.

Every replica runs this loop; only the one holding the Lease
``vgpu-state-controller`` (in the controller's namespace) acts. A pass lists
every ``VGPUNodeState`` page by page (each object decoded as it arrives, only what a
report is read from kept), reads each node's checked report
(:mod:`vgpu_state.controller.reports`), reads the KubeVirt CR and sends at most
one JSON Patch guarded by ``test`` ops (:mod:`vgpu_state.controller.desired`).
A steady fleet costs a list, a read and a Lease renewal per pass, no CR write.

What the CR may permit is bounded by the layouts document (the agents' ConfigMap,
mounted; the one the fleet view plans with): without one, the controller adds and
removes nothing and says so every pass. A report it refuses, whole or in part, is
named once per change in a Warning Event on that node's ``VGPUNodeState``.

Fencing (:mod:`vgpu_state.kube.fencing`): every CR write carries the token of
the leader's term and tests the CR's ``vgpu-state.io/writer-term`` annotation,
so the first write of a new term (sent on its first pass, whether or not
anything else changes) makes every later write of an older term fail at the
API server. A pass renews the Lease again right before it writes, writes only
while its term has at least one request timeout left before the renew
deadline, and a replica that finds a newer term's token in the CR, or its term
gone from the Lease, stops: it writes nothing until it leads again. A leader
whose renewals fail for longer than the renew deadline steps down.

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

from vgpu_state.catalog import Catalog
from vgpu_state.config.selection import DEFAULT_LABEL_KEY
from vgpu_state.controller import informers
from vgpu_state.controller.bounds import LayoutBounds
from vgpu_state.controller.desired import Decision, Missing, decide
from vgpu_state.controller.evacuation import NodeStatus, read_node
from vgpu_state.controller.evacuator import Evacuator
from vgpu_state.controller.fleetcache import FleetCache, fanout
from vgpu_state.controller.fleetview import fleet_totals
from vgpu_state.controller.metrics import ControllerMetrics
from vgpu_state.controller.reports import NodeReport, read_report
from vgpu_state.kube import events, fencing, kubevirt, lease, nodestate
from vgpu_state.kube.api import JsonObject, KubeApi, path_of
from vgpu_state.kube.apihealth import Answer
from vgpu_state.kube.errors import ClusterError
from vgpu_state.kube.fencing import DeposedError, Standing, Term
from vgpu_state.kube.informer import CollectionWatch, WatchHealth
from vgpu_state.kube.kubevirt import KubeVirtPlan, KubeVirtRef, WriteResult
from vgpu_state.kube.permitted import PermittedEntry
from vgpu_state.model.errors import ConfigError, TransientError, VgpuStateError
from vgpu_state.model.status import EventType
from vgpu_state.ports.config import ConfigSource
from vgpu_state.reconcile.fleet import Totals
from vgpu_state.reconcile.settings import Settings

log = logging.getLogger(__name__)

LEASE_NAME = lease.LEASE_NAME
WATCH_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
"""``Accept`` of the Nodes' watch: their metadata only (the labels select a layout)."""
DEFAULT_GRACE = 300.0
"""Seconds an owned entry stays after the last node stopped reporting its resource."""
DEFAULT_INTERVAL = 10.0
DEFAULT_LEASE_SECONDS = 30
DEFAULT_RENEW_DEADLINE = 20.0
"""Seconds after its last successful Lease renewal a leader steps down (< the Lease)."""
DEFAULT_REQUEST_TIMEOUT = 10.0
"""Seconds one API request may take (connect and answer); a CR write is sent only with
at least this much of the renew deadline left."""
DEFAULT_RESYNC = 300.0
"""Seconds between two passes while nothing changes (from the watched caches: no list)."""
DEFAULT_FLEET_INTERVAL = 60.0
"""Seconds between fleet views (each is a plan of every node)."""
REFUSED_REASON = "ReportRefused"
"""The reason of the Warning Event naming a refused report on its ``VGPUNodeState``."""
EVENT_COMPONENT = "vgpu-state-controller"
MAX_EVENTS_PER_PASS = 50
"""Refusal Events one pass writes at most (a document edit can refuse many nodes at once)."""
MAX_EVENT_MESSAGE = 1024
"""An Event's message is cut here (the API server refuses longer ones)."""


def summary(report: NodeReport, shared: dict[PermittedEntry, PermittedEntry]) -> NodeReport:
    """What is kept of ``report`` between passes: its entries (the instances in ``shared``,
    so that nodes reporting the same entries hold one copy) and the bounded summaries of
    what it left out (:class:`~vgpu_state.controller.reports.NodeReport`). A report
    justifying more entries than a status may count resources is refused."""
    if len(report.entries) > nodestate.MAX_RESOURCES:
        return NodeReport(
            report.node,
            refused=f"its scan justifies {len(report.entries)} resources; a node reports at "
            f"most {nodestate.MAX_RESOURCES}",
        )
    entries = tuple(shared.setdefault(e, e) for e in report.entries)
    return replace(report, entries=entries)


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
    layouts: ConfigSource | None = None
    """The layouts document that bounds the KubeVirt CR; ``None``: the fleet view's. With
    neither, the controller adds and removes no entry."""
    catalog: Catalog | None = None
    """The catalog the bounds check models and types against; ``None``: the fleet view's."""
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    """The API client's limit per request (its timeouts are set from it)."""
    resync: float = DEFAULT_RESYNC
    """While watching (:meth:`Controller.run`): seconds between passes when nothing
    changed; a change runs a pass within ``max_delay``."""
    quiet: float = informers.DEFAULT_QUIET
    max_delay: float = informers.DEFAULT_MAX_DELAY

    @property
    def bounding_layouts(self) -> ConfigSource | None:
        return self.layouts or (self.fleet.layouts if self.fleet is not None else None)

    @property
    def bounding_catalog(self) -> Catalog | None:
        return self.catalog or (self.fleet.settings.catalog if self.fleet is not None else None)

    def timing_problem(self) -> str | None:
        """Why these timings could let a request outlive the Lease it was sent under, or
        let the Lease lapse between passes; ``None`` when they cannot."""
        return timing_problem(
            self.lease_seconds, self.renew_deadline, self.request_timeout, self.interval
        )


def timing_problem(
    lease_seconds: float, renew_deadline: float, request_timeout: float, interval: float
) -> str | None:
    """``None`` when ``request timeout < renew deadline < Lease duration`` and ``interval <
    renew deadline`` (see docs/cluster.md, "Leader election and fencing"), else why not."""
    if not renew_deadline < lease_seconds:
        return (
            f"the renew deadline ({renew_deadline:g} s) must be shorter than the Lease "
            f"({lease_seconds:g} s): a leader must step down before another may take over"
        )
    if not request_timeout < renew_deadline:
        return (
            f"the request timeout ({request_timeout:g} s) must be shorter than the renew "
            f"deadline ({renew_deadline:g} s): no write could be sent in time"
        )
    if not interval < renew_deadline:
        return (
            f"the interval ({interval:g} s) must be shorter than the renew deadline "
            f"({renew_deadline:g} s): the leader renews the Lease once per pass"
        )
    return None


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
    term: Term | None = None
    """The term of the Lease this process holds (or held, while it renews late)."""
    writes: int = 0
    """Accepted KubeVirt CR writes since start."""
    metrics: ControllerMetrics = field(default_factory=ControllerMetrics)
    _last_view: float | None = None
    _reports: dict[str, tuple[str, LayoutBounds, NodeReport]] = field(default_factory=dict)
    """Each node's last report (a :func:`summary`), with the ``resourceVersion`` and bounds it
    was read with: an unchanged status is not decoded and checked again while the document
    is unchanged."""
    _bounds: LayoutBounds | None = None
    _uids: dict[str, str] = field(default_factory=dict)
    """Each ``VGPUNodeState``'s uid, for the Events about it (``kubectl describe`` matches
    Events by the object's uid)."""
    _named: dict[str, str] = field(default_factory=dict)
    """What the last Warning Event on each node's ``VGPUNodeState`` said (one Event per
    change, not per pass)."""
    _renewed: float | None = None
    """When (``clock``) the last successful renewal of the Lease was sent."""
    _twin: bool = False
    """Another process of this identity took the Lease from this one: wait until its hold
    ends rather than take it back at once (no two processes taking it in turn)."""
    _lease: JsonObject | None = None
    """The Lease as this process last wrote it: the next renewal starts from it."""
    _cache: informers.NodeStateCache | None = None
    """While watching (:meth:`run`): every node's kept report, kept current by a watch."""
    _watches: dict[str, CollectionWatch] = field(default_factory=dict)
    _trigger: informers.Trigger | None = None
    _ref: KubeVirtRef | None = None
    """The KubeVirt CR found (while watching: found once, again after an error)."""
    _fleet: FleetCache | None = None
    """While watching with a fleet view: each node's part of its totals."""
    _cr_version: str = ""
    _evacuator: Evacuator | None = None
    _statuses: dict[str, NodeStatus] | None = None
    """Each node's status as the evacuation believes it, from the pass's list (``None``
    when the pass read the watched cache: it holds them)."""
    _listing: dict[str, NodeStatus] = field(default_factory=dict)

    def lead(self, after: int | None = None) -> bool:
        """Take or renew the Lease; ``True`` while this replica leads. ``after``: a term
        number the held term must be past (see :func:`vgpu_state.kube.lease.hold_term`).

        A renewal that fails is raised; once no renewal has succeeded for the renew
        deadline, this replica steps down first."""
        s = self.settings
        sent = self.clock()
        try:
            state = lease.hold_term(
                self.api,
                s.identity,
                self.term,
                namespace=s.namespace,
                name=s.lease_name,
                duration=s.lease_seconds,
                now=self.wall(),
                after=after,
                take_own=not self._twin,
                known=self._lease if self._cache is not None else None,
            )
        except (ClusterError, TransientError):
            self._lease = None
            if self.leading and (
                self._renewed is None or self.clock() - self._renewed > s.renew_deadline
            ):
                log.warning(
                    "%s steps down: no Lease renewal for %g s", s.identity, s.renew_deadline
                )
                self._follow()
            raise
        if state.held and state.term != self.term:
            log.info(
                "%s leads (Lease %s/%s, %s)",
                s.identity,
                s.namespace,
                s.lease_name,
                state.term or "term unknown",
            )
            # A new term starts every grace clock afresh: what the last leader saw is unknown.
            self.missing = Missing()
        elif not state.held and state.holder == s.identity and self.term is not None:
            log.warning(
                "%s: another process of this identity holds the Lease (%s); this one follows",
                s.identity,
                state.term,
            )
            self._twin = True
        elif not state.held and self.leading:
            log.info("%s follows %s", s.identity, state.holder)
        self._lease = state.lease
        if state.held:
            self.leading, self.term, self._renewed, self._twin = True, state.term, sent, False
            self.metrics.leader.set(1)
        else:
            self._follow()
            self.term = None
        return state.held

    def _follow(self) -> None:
        if self.leading:
            self.missing = Missing()
        self.leading = False
        self.metrics.leader.set(0)

    def _confirm(self, term: Term, ref: KubeVirtRef) -> None:
        """Renew the Lease right before a CR write: the write goes out only in ``term``, with
        at least one request timeout left before the renew deadline."""
        s = self.settings
        if not self.lead() or self.term != term:
            raise DeposedError(f"{s.identity}: {term} ended before its write of KubeVirt CR {ref}")
        assert self._renewed is not None
        left = s.renew_deadline - (self.clock() - self._renewed)
        if left < s.request_timeout:
            raise TransientError(
                f"KubeVirt CR {ref}: not written, the Lease renewal took too long ({left:.1f} s "
                f"of the {s.renew_deadline:g} s renew deadline left, a request may take "
                f"{s.request_timeout:g} s)"
            )

    def _deposed(self, error: DeposedError, term: Term) -> None:
        """Another term's token in the CR: re-check the Lease. Stop (follow) unless it still
        shows ``term``: then the Lease was reset, and a term numbered past the CR's begins."""
        s = self.settings
        if error.seen is None or not self.lead() or self.term != term:
            log.warning("%s writes nothing: %s", s.identity, error)
            return
        number = fencing.next_number(error.seen, term.number) - 1
        log.warning(
            "%s: the KubeVirt CR's writer term %r is not older than this replica's %s, which "
            "the Lease still shows (was the Lease deleted?): a new term past it begins",
            s.identity,
            error.seen,
            term,
        )
        self.lead(after=number)

    def sync(self) -> PassResult:
        """One pass of the leader (:meth:`run_once` takes or renews the Lease first); a
        replica that holds no term raises :class:`DeposedError` and writes nothing."""
        term = self.term
        if term is None or not self.leading:
            raise DeposedError(f"{self.settings.identity} does not lead: it writes nothing")
        return self._sync(term, self._layout_bounds())

    def _sync(self, term: Term, layout: tuple[LayoutBounds | None, str | None]) -> PassResult:
        ref = self._ref or kubevirt.find(self.api, self.settings.kubevirt)
        bounds, no_layouts = layout
        reports: tuple[NodeReport, ...] = ()
        if bounds is not None:  # without bounds no report can justify or stop anything
            reports = self._current(bounds)
        decisions: list[Decision] = []

        def compute(cr: JsonObject) -> KubeVirtPlan:
            self._cr_version = str((cr.get("metadata") or {}).get("resourceVersion") or "")
            seen = fencing.seen_token(cr)
            if fencing.standing(seen, term) is Standing.NEWER:
                raise DeposedError(
                    f"KubeVirt CR {ref} was written in writer term {seen!r}, not older than "
                    f"this replica's {term}",
                    seen,
                )
            now = self.clock()
            decision = decide(
                cr,
                reports,
                self.missing,
                now,
                self.settings.grace,
                no_layouts,
                fence=term.token,
            )
            decisions.append(decision)
            if decision.plan.patch:
                self._confirm(term, ref)
            return decision.plan

        try:
            result = kubevirt.write(self.api, ref, compute)
        except DeposedError as e:
            self.metrics.kubevirt_in_step.set(0)
            self._deposed(e, term)
            raise
        except (ClusterError, TransientError):
            self.metrics.kubevirt_in_step.set(0)
            self._ref = None
            raise
        if self._cache is not None:
            self._ref = ref
            self._watch_kubevirt(ref)
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
        if no_layouts is None:
            self._evacuate(term)
        return PassResult(reports, decision, result)

    @property
    def evacuating(self) -> bool:
        """The last pass found moves in flight or waiting: passes come every interval."""
        return self._evacuator is not None and self._evacuator.active

    def _evacuate(self, term: Term) -> None:
        """The leader's evacuation step (:mod:`vgpu_state.controller.evacuator`): its writes
        go out only in ``term``, renewed right before them."""
        source = self.settings.bounding_layouts
        if source is None:
            return
        try:
            document = source.document()
        except ConfigError:
            return  # the pass named it already (its bounds)
        evacuator = self._evacuator
        if evacuator is None:
            fleet = self.settings.fleet
            label_key = fleet.settings.label_key if fleet is not None else DEFAULT_LABEL_KEY
            default = fleet.settings.default_config if fleet is not None else None
            evacuator = self._evacuator = Evacuator(
                self.api, self.settings.identity, self.metrics, label_key, default
            )

        def confirm() -> None:
            s = self.settings
            if not self.lead() or self.term != term:
                raise DeposedError(f"{s.identity}: {term} ended before its evacuation writes")
            assert self._renewed is not None
            if s.renew_deadline - (self.clock() - self._renewed) < s.request_timeout:
                raise TransientError("evacuation: nothing written, the Lease renewal took too long")

        statuses = self._statuses
        if statuses is None and self._cache is not None:
            statuses = self._cache.statuses()
        try:
            evacuator.step(document, self.wall(), confirm, term.token, statuses)
        except (ClusterError, TransientError) as e:
            # The KubeVirt CR's part of the pass stands; the evacuation is tried again on
            # the next pass (KubeVirt's CRDs missing, a refused request, a lost term).
            self.metrics.evacuation_errors.inc()
            log.warning("evacuation step failed (retried next pass): %s", e)

    def _current(self, bounds: LayoutBounds) -> tuple[NodeReport, ...]:
        """Every node's report: from the watched cache when it holds them for ``bounds``,
        else listed (and, while watching, the cache rebuilt and watched from the list)."""
        cache = self._cache
        current = cache.current(bounds) if cache is not None and self._watch_live() else None
        if current is not None:
            kept, self._uids = current
            self._reports = kept
            self._statuses = None
            return tuple(kept[name][2] for name in sorted(kept))
        versions: list[str] = []
        self._listing = {}
        listed = nodestate.list_pages(
            self.api, lambda obj: self._listed(obj, bounds), on_version=versions.append
        )
        reports = tuple(self._reports_of(listed, bounds))
        self._statuses, self._listing = self._listing, {}
        if cache is not None and versions and versions[0]:
            cache.listed(self._reports, self._uids, bounds, self._statuses)
            self._watch_nodestates().resume(versions[0])
            self.metrics.relists.inc()
        return reports

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

    def _listed(
        self, obj: JsonObject, bounds: LayoutBounds
    ) -> tuple[str, str, NodeReport | JsonObject]:
        """A listed object as its name, ``resourceVersion`` and kept report, or, when the
        status (or the document) changed since, what a report is read from."""
        meta = obj.get("metadata") or {}
        name, version = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        if meta.get("uid"):
            self._uids[name] = str(meta["uid"])
        self._listing[name] = read_node(obj)
        kept = self._reports.get(name)
        if kept is not None and version and kept[0] == version and kept[1] is bounds:
            return name, version, kept[2]
        return name, version, _for_report(obj)

    def _reports_of(
        self,
        pages: Iterable[list[tuple[str, str, NodeReport | JsonObject]]],
        bounds: LayoutBounds,
    ) -> list[NodeReport]:
        """Every listed node's report, page by page; what is kept is the listed nodes'."""
        reports: list[NodeReport] = []
        kept: dict[str, tuple[str, LayoutBounds, NodeReport]] = {}
        shared: dict[PermittedEntry, PermittedEntry] = {}
        for page in pages:
            for name, version, listed in page:
                if isinstance(listed, NodeReport):
                    report = listed  # a summary already: its entries join this pass's
                    for entry in report.entries:
                        shared.setdefault(entry, entry)
                else:
                    report = summary(read_report(listed, bounds), shared)
                kept[name] = (version, bounds, report)
                reports.append(report)
        self._reports = kept
        return reports

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
            totals = self._fleet_totals(view)
        except (VgpuStateError, ClusterError, TransientError) as e:
            self.metrics.fleet_view_errors.inc()
            log.warning("fleet view failed (retried in %.0f s): %s", view.interval, e)
            return False
        self.metrics.fleet(totals, time.time())
        return True

    def _fleet_totals(self, view: FleetViewSettings) -> Totals:
        """The fleet view's totals: from the kept parts while the ``VGPUNodeState`` watch
        streams (listed again when the document changed or a watch expired), else listed."""
        fleet = self._fleet
        if fleet is None or not self._watch_live():
            return fleet_totals(self.api, view.layouts, view.settings, self.wall(), view.max_age)
        document = view.layouts.document()
        if not fleet.ready_for(document):
            nodes, _ = fleet.rebuild(self.api, document)
            self._watch_nodes().resume(nodes)
        return fleet.totals(self.api)

    def _watch_nodes(self) -> CollectionWatch:
        watch = self._watches.get("nodes")
        if watch is None:
            fleet = self._fleet
            assert fleet is not None
            watch = self._watches["nodes"] = CollectionWatch(
                self.api,
                path_of("", "v1", "nodes"),
                fleet.node_event,
                fleet.invalidate,
                what="nodes",
                accept=WATCH_METADATA,
                connect_timeout=self.api.timeout[0],
                health=self._health("nodes"),
            )
        return watch

    # watching ------------------------------------------------------------------------
    def _health(self, resource: str) -> WatchHealth:
        m = self.metrics
        m.watch_ok.labels(resource).set(1)

        def changed(ok: bool) -> None:
            m.watch_ok.labels(resource).set(1 if ok else 0)

        return WatchHealth(
            resource, on_change=changed, on_failure=m.watch_failures.labels(resource).inc
        )

    def _watch_nodestates(self) -> CollectionWatch:
        watch = self._watches.get(nodestate.PLURAL)
        if watch is None:
            cache = self._cache
            assert cache is not None
            fleet = self._fleet
            on_event = cache.event if fleet is None else fanout(cache.event, fleet.state_event)

            def expired(why: str) -> None:
                cache.invalidate(why)
                if fleet is not None:
                    fleet.invalidate(why)

            watch = self._watches[nodestate.PLURAL] = CollectionWatch(
                self.api,
                nodestate.object_path(),
                on_event,
                expired,
                what=nodestate.PLURAL,
                connect_timeout=self.api.timeout[0],
                health=self._health(nodestate.PLURAL),
            )
        return watch

    def _watch_kubevirt(self, ref: KubeVirtRef) -> None:
        """Watch the KubeVirt CR from the version this pass read (once; again after its
        watch expired): a change by anyone runs a pass."""
        trigger = self._trigger
        if trigger is None or not self._cr_version:
            return
        watch = self._watches.get("kubevirts")
        if watch is None:
            watch = self._watches["kubevirts"] = CollectionWatch(
                self.api,
                path_of("kubevirt.io", "v1", "kubevirts", None, ref.namespace),
                lambda kind, obj: trigger.changed(),
                lambda why: trigger.changed(),
                what="kubevirts",
                field_selector=f"metadata.name={ref.name}",
                connect_timeout=self.api.timeout[0],
                health=self._health("kubevirts"),
            )
        if watch.version is None:
            watch.resume(self._cr_version)

    def _read_kept(
        self,
        obj: JsonObject,
        bounds: LayoutBounds,
        shared: dict[PermittedEntry, PermittedEntry],
    ) -> NodeReport:
        return summary(read_report(_for_report(obj), bounds), shared)

    def _watch_live(self) -> bool:
        """Whether the ``VGPUNodeState`` watch streams (an answer that a proxy holds
        back until it ends, or a watch that keeps failing, does not): while it does not,
        every interval's pass lists, as without a watch."""
        watch = self._watches.get(nodestate.PLURAL)
        return watch is not None and watch.live()

    def watch_check(self) -> Answer:
        """For ``/readyz``: not ready while a watch has failed for its bound."""
        for watch in list(self._watches.values()):
            answer = watch.health.check()
            if not answer.ok:
                return answer
        return Answer(True, "ok")

    def stop_watching(self) -> None:
        for watch in list(self._watches.values()):
            watch.stop(5)
        self._watches.clear()
        self._cache = None
        self._fleet = None
        self._trigger = None

    def run(self, stop: threading.Event) -> None:
        """Lead and pass until ``stop``: the Lease is renewed (or looked at, by a
        follower) every ``interval`` seconds; the leader's first pass lists every
        ``VGPUNodeState`` and watches them from that list (and the KubeVirt CR from its
        read); after it, a pass runs when something changed (within ``max_delay`` of a
        burst's first change), when a waiting removal's grace period ends, and every
        ``resync`` seconds. Errors are logged and retried every ``interval``."""
        s = self.settings
        trigger = self._trigger = informers.Trigger(s.quiet, s.max_delay, self.clock)
        cache = self._cache = informers.NodeStateCache(self._read_kept, trigger.changed)
        if s.fleet is not None:
            self._fleet = FleetCache(s.fleet.settings, s.fleet.max_age, self.wall)
        next_lead = self.clock()
        next_pass: float | None = self.clock()  # None: only when something changes
        try:
            while not stop.is_set():
                now = self.clock()
                changed = trigger.take()
                leading_before = self.leading
                try:
                    layout = None
                    if now >= next_lead:
                        next_lead = now + s.interval
                        self.lead()
                        if not self.leading:
                            self.metrics.passes.labels("ok").inc()
                        else:
                            if not leading_before:
                                next_pass = now  # a new term: its first pass at once
                            # The layouts document is read every interval (a mounted file):
                            # a change makes the cached reports unusable, and a pass lists.
                            layout = self._layout_bounds()
                            if layout[0] is not None and not cache.holds(layout[0]):
                                changed = True
                            if not self._watch_live():
                                changed = True  # no change can be seen: a pass lists
                    if self.leading and (changed or (next_pass is not None and now >= next_pass)):
                        next_pass = None
                        result = self._pass_now(layout)
                        self.metrics.passes.labels("ok").inc()
                        # The next one at the resync, or when the first waiting removal's
                        # grace period ends (no change need come for it).
                        due = min((left for _, left in result.decision.waiting), default=None)
                        after = s.resync if due is None else min(s.resync, max(due, 0.0) + 0.1)
                        if self.evacuating:
                            after = min(after, s.interval)  # moves in flight: look again soon
                        next_pass = self.clock() + after
                except (TransientError, ClusterError) as e:
                    self.metrics.passes.labels("error").inc()
                    next_pass = self.clock() + s.interval
                    log.warning("pass failed, retried in %.0f s: %s", s.interval, e)
                if self.leading:
                    self.fleet_view()
                now = self.clock()
                wake = min(next_lead, next_pass if next_pass is not None else next_lead)
                due = trigger.when()
                if due is not None:
                    wake = min(wake, due)
                wait = max(wake - now, 0.0)
                if due is None:
                    trigger.event.wait(min(wait, 1.0))  # a change wakes the loop at once
                elif wait > 0:
                    stop.wait(min(wait, 1.0))
        finally:
            self.stop_watching()
            if self.leading:
                lease.release(
                    self.api,
                    self.settings.identity,
                    namespace=self.settings.namespace,
                    name=self.settings.lease_name,
                )

    def _pass_now(self, layout: tuple[LayoutBounds | None, str | None] | None) -> PassResult:
        """One pass of the leader with ``layout`` (read now when ``None``): a changed
        document makes the cached reports unusable (the pass lists again)."""
        term = self.term
        if term is None:
            raise DeposedError(f"{self.settings.identity} does not lead: it writes nothing")
        return self._sync(term, layout or self._layout_bounds())
