"""The fleet view kept incrementally: each node's part of the totals, updated per change.

:func:`vgpu_state.controller.fleetview.fleet_totals` plans every node from a fresh list
(every ``VGPUNodeState`` and every Node's labels). While the controller watches, the
leader makes that list once (:meth:`FleetCache.rebuild`) and then keeps, per node, only
its *part* of the totals (:class:`Part`: its outcome, disruption level, action counts
and capacity rows; identical parts are one object) with the time its scan grows older
than the view's ``max_age``. A watched ``VGPUNodeState`` event plans that node again at
once; a changed Node label marks it, and the next view reads that one object again. A
view then adds the parts up, a node whose scan grew too old counting as ``unknown``, as
the plan would; it sends no request unless a node's labels changed. A changed layouts
document, an expired Node watch, an expired ``VGPUNodeState`` watch or more marked
nodes than :data:`MAX_REREAD` make the next view list again.

Each node's part is replaced only by one planned from a newer ``resourceVersion`` of its
object, so a list and the watch running at the same time agree.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from vgpu_state.config.document import ConfigDocument
from vgpu_state.kube import nodestate
from vgpu_state.kube.api import JsonObject, KubeApi, path_of
from vgpu_state.kube.errors import NotFoundError
from vgpu_state.kube.fleet import DEFAULT_CHUNK_SIZE, METADATA_ONLY, reported_node
from vgpu_state.kube.liststream import stream_pages
from vgpu_state.kube.node import labels_of
from vgpu_state.kube.nodestate import SnapshotDecoder
from vgpu_state.model.plan import Disruption
from vgpu_state.model.policy import Publish
from vgpu_state.reconcile.fleet import FleetSummary, NodeOutcome, NodePlan, Totals, plan_node
from vgpu_state.reconcile.settings import Settings

log = logging.getLogger(__name__)

MAX_REREAD = 200
"""Nodes whose labels changed that a view reads again one by one; more: it lists."""
VIEW_CHUNK = 50
DECODER_BUDGET = 1024 * 1024
NODES = path_of("", "v1", "nodes")


@dataclass(frozen=True, slots=True)
class Part:
    """One node's part of the fleet totals."""

    outcome: NodeOutcome
    level: Disruption | None
    counts: tuple[int, int, int, int]
    """Create, destroy, SR-IOV and blocked actions."""
    capacity: tuple[tuple[tuple[str, str, Publish], tuple[int, ...]], ...]


def part_of(plan: NodePlan) -> Part:
    one = FleetSummary()
    one.add(plan)
    level = next((level for level, n in one.levels.items() if n), None)
    return Part(
        plan.outcome,
        level,
        (one.create, one.destroy, one.sriov, one.blocked),
        tuple(sorted((key, tuple(row)) for key, row in one.capacity.items())),
    )


def add_part(total: FleetSummary, part: Part, stale: bool) -> None:
    """Count ``part`` in ``total`` (a node whose scan grew too old: ``unknown``)."""
    total.nodes += 1
    if stale:
        total.count[NodeOutcome.UNKNOWN] += 1
        return
    total.count[part.outcome] += 1
    if part.level is not None:
        total.levels[part.level] += 1
    create, destroy, sriov, blocked = part.counts
    total.create += create
    total.destroy += destroy
    total.sriov += sriov
    total.blocked += blocked
    for key, row in part.capacity:
        mine = total.capacity.setdefault(key, [0, 0, 0, 0])
        for i, value in enumerate(row):
            mine[i] += value


def _newer(version: str, than: str) -> bool:
    """Whether ``version`` is past ``than`` (etcd revisions; any other text: assumed)."""
    if version.isdigit() and than.isdigit():
        return int(version) > int(than)
    return version != than


@dataclass
class _Kept:
    version: str
    part: Part
    stale_at: dt.datetime | None


def selection_keys(document: ConfigDocument, label_key: str) -> frozenset[str]:
    """The label keys a node's config is selected by: the config label (and its state
    label) and every key the document's node-selectors name. A Node's other labels are
    not kept: whoever writes a Node's labels (its kubelet among them) cannot grow the
    controller's memory with them."""
    keys = {label_key, f"{label_key}.state"}
    for selector in document.spec.node_selectors:
        keys.update(selector.match_labels)
        keys.update(expr.key for expr in selector.match_expressions)
    return frozenset(keys)


def _kept_labels(labels: dict[str, str], keys: frozenset[str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k in keys}


@dataclass
class FleetCache:
    """Each node's :class:`Part` and every Node's labels; thread-safe."""

    settings: Settings
    max_age: dt.timedelta | None
    wall: Callable[[], dt.datetime]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _labels: dict[str, dict[str, str]] = field(default_factory=dict)
    _kept: dict[str, _Kept] = field(default_factory=dict)
    _parts: dict[Part, Part] = field(default_factory=dict)
    _marked: set[str] = field(default_factory=set)
    _document: ConfigDocument | None = None
    _keys: frozenset[str] = frozenset()
    """The label keys kept of each Node (:func:`selection_keys` of ``_document``)."""
    _ready: bool = False
    _decoder: SnapshotDecoder = field(default_factory=lambda: SnapshotDecoder(DECODER_BUDGET))

    # what a view asks ------------------------------------------------------------------
    def ready_for(self, document: ConfigDocument) -> bool:
        """Whether a view may add up the kept parts for ``document`` (no more than
        :data:`MAX_REREAD` nodes to read again first)."""
        with self._lock:
            return self._ready and self._document == document and len(self._marked) <= MAX_REREAD

    def invalidate(self, why: str) -> None:
        with self._lock:
            was, self._ready = self._ready, False
        if was:
            log.info("the fleet view lists again at its next view: %s", why)

    def totals(self, api: KubeApi) -> Totals:
        """The fleet's totals from the kept parts (marked nodes read again first)."""
        with self._lock:
            marked, self._marked = self._marked, set()
        for name in sorted(marked):
            try:
                obj = api.get(nodestate.object_path(name))
            except NotFoundError:
                continue  # deleted: its DELETED event removes it
            self.state_event("MODIFIED", obj, force=True)
        now = self.wall()
        total = FleetSummary()
        with self._lock:
            kept = list(self._kept.values())
        for k in kept:
            add_part(total, k.part, k.stale_at is not None and now - k.stale_at > dt.timedelta(0))
        return total.totals()

    # a fresh list ----------------------------------------------------------------------
    def rebuild(self, api: KubeApi, document: ConfigDocument) -> tuple[str, str]:
        """List every Node's labels and every ``VGPUNodeState`` and plan each node: the
        ``resourceVersion`` of the Nodes' list (their watch starts there) and of the
        ``VGPUNodeState`` list."""
        versions: list[str] = []
        labels: dict[str, dict[str, str]] = {}
        keys = selection_keys(document, self.settings.label_key)
        for page in stream_pages(
            api,
            NODES,
            DEFAULT_CHUNK_SIZE,
            lambda n: (
                str((n.get("metadata") or {}).get("name") or ""),
                _kept_labels(labels_of(n), keys),
            ),
            accept=METADATA_ONLY,
            on_version=versions.append,
        ):
            labels.update(page)
        with self._lock:
            self._labels = labels
            self._document = document
            self._keys = keys
            self._kept = {}
            self._parts = {}
            self._marked = set()
            self._decoder = SnapshotDecoder(DECODER_BUDGET)
            self._ready = True
        for planned in stream_pages(
            api,
            nodestate.object_path(),
            VIEW_CHUNK,
            lambda obj: self.state_event("ADDED", obj),
            on_version=versions.append,
        ):
            del planned
        return versions[0] if versions else "", versions[1] if len(versions) > 1 else ""

    # watched changes -------------------------------------------------------------------
    def node_event(self, kind: str, obj: JsonObject) -> None:
        """A Node's change (its metadata): its labels kept; a change marks its node."""
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return
        name = str(meta.get("name") or "")
        with self._lock:
            if self._document is None:
                return  # nothing is kept before the first list, which reads every Node
            labels = _kept_labels(labels_of(obj), self._keys)
            if kind == "DELETED":
                changed = self._labels.pop(name, None) is not None
            else:
                changed = self._labels.get(name) != labels
                self._labels[name] = labels
            if changed and name in self._kept:
                self._marked.add(name)

    def state_event(self, kind: str, obj: JsonObject, *, force: bool = False) -> None:
        """A ``VGPUNodeState``'s change: its node planned again from it."""
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return
        name, version = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        if not name:
            return
        with self._lock:
            if not self._ready or self._document is None:
                return
            document, labels, decoder = self._document, self._labels.get(name), self._decoder
            old = self._kept.get(name)
            if kind == "DELETED":
                if old is None or _newer(version, old.version) or not version:
                    self._kept.pop(name, None)
                return
        if old is not None and not force and not _newer(version, old.version):
            return
        now = self.wall()
        plan = plan_node(
            document, reported_node(name, obj, labels, decoder), self.settings, now, self.max_age
        )
        part = part_of(plan)
        stale_at = (
            plan.scanned_at + self.max_age
            if plan.scanned_at is not None and self.max_age is not None
            else None
        )
        with self._lock:
            if self._document is not document:
                return  # rebuilt meanwhile
            current = self._kept.get(name)
            if current is not None and not force and not _newer(version, current.version):
                return
            part = self._parts.setdefault(part, part)
            self._kept[name] = _Kept(version, part, stale_at)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


def fanout(*handlers: Callable[[str, JsonObject], None]) -> Callable[[str, JsonObject], None]:
    """One watch event to every handler."""

    def handle(kind: str, obj: JsonObject) -> None:
        for handler in handlers:
            handler(kind, obj)

    return handle
