"""What the controller keeps of the cluster between passes, kept current by watches.

The leader's first pass lists every ``VGPUNodeState`` (page by page, as before); from
that list's ``resourceVersion`` a :class:`~vgpu_state.kube.informer.CollectionWatch`
streams every change after it. Each event is bounded before it is believed (the watch
refuses a line past its size and nesting bounds) and becomes, at once, what a pass
needs of that node: its :func:`~vgpu_state.controller.run.summary` report, read with
the layouts' bounds of the list. No object is kept whole. Every change wakes the
controller (:attr:`NodeStateCache.on_change`), which runs one pass for a burst of
changes (:class:`Trigger`).

The cache is used only with the bounds it was read with: a changed layouts document,
an expired watch (410 Gone) or a refused event make the next pass list again, and the
watch resumes from that list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vgpu_state.controller import evacuation
from vgpu_state.controller.bounds import LayoutBounds
from vgpu_state.controller.reports import NodeReport
from vgpu_state.kube.api import JsonObject
from vgpu_state.kube.permitted import PermittedEntry

log = logging.getLogger(__name__)

Kept = tuple[str, LayoutBounds, NodeReport]
"""A node's ``resourceVersion``, the bounds its report was read with, and the report."""

DEFAULT_QUIET = 0.2
"""Seconds without a further change before a pass runs."""
DEFAULT_MAX_DELAY = 1.0
"""Seconds after the first change of a burst by which its pass runs, however long the
burst goes on."""


class Trigger:
    """Changes seen, coalesced: :meth:`due` once ``quiet`` seconds passed since the last
    change, or ``max_delay`` since the first of the burst."""

    def __init__(
        self,
        quiet: float = DEFAULT_QUIET,
        max_delay: float = DEFAULT_MAX_DELAY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quiet = quiet
        self.max_delay = max_delay
        self._clock = clock
        self._lock = threading.Lock()
        self._first: float | None = None
        self._last = 0.0
        self.event = threading.Event()
        """Set on every change (the run loop waits on it)."""

    def changed(self) -> None:
        with self._lock:
            now = self._clock()
            if self._first is None:
                self._first = now
            self._last = now
        self.event.set()

    def when(self) -> float | None:
        """The clock time the pending burst's pass is due; ``None``: nothing pending."""
        with self._lock:
            if self._first is None:
                return None
            return min(self._last + self.quiet, self._first + self.max_delay)

    def take(self) -> bool:
        """``True`` (and the burst consumed) when its pass is due now."""
        when = self.when()
        if when is None or when > self._clock():
            return False
        with self._lock:
            self._first = None
            self.event.clear()
        return True


@dataclass
class NodeStateCache:
    """Every node's kept report, current while :attr:`ready`; thread-safe (the watch's
    thread writes, the pass reads).

    ``read(obj, bounds, shared)``: the kept report of one object (the pass's own reader).
    """

    read: Callable[[JsonObject, LayoutBounds, dict[PermittedEntry, PermittedEntry]], NodeReport]
    on_change: Callable[[], None]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _kept: dict[str, Kept] = field(default_factory=dict)
    _uids: dict[str, str] = field(default_factory=dict)
    _shared: dict[PermittedEntry, PermittedEntry] = field(default_factory=dict)
    _bounds: LayoutBounds | None = None
    _ready: bool = False
    _statuses: dict[str, evacuation.NodeStatus] = field(default_factory=dict)
    """Each node's status as the evacuation believes it (:func:`evacuation.read_node`)."""
    relists: int = 0
    """Lists the cache was (re)built from."""

    def current(self, bounds: LayoutBounds) -> tuple[dict[str, Kept], dict[str, str]] | None:
        """Every node's kept report and uid, when the cache holds them for ``bounds``."""
        with self._lock:
            if not self._ready or self._bounds is not bounds:
                return None
            return dict(self._kept), dict(self._uids)

    def statuses(self) -> dict[str, evacuation.NodeStatus] | None:
        """Every node's status for the evacuation, while the cache is current."""
        with self._lock:
            return dict(self._statuses) if self._ready else None

    def holds(self, bounds: LayoutBounds) -> bool:
        """Whether the cache holds every node's report for ``bounds``."""
        with self._lock:
            return self._ready and self._bounds is bounds

    def invalidate(self, why: str) -> None:
        """The next pass lists again (the watch stopped, or the bounds changed)."""
        with self._lock:
            was = self._ready
            self._ready = False
        if was:
            log.info("the VGPUNodeState cache is rebuilt from a list: %s", why)
            self.on_change()

    def listed(
        self,
        kept: dict[str, Kept],
        uids: dict[str, str],
        bounds: LayoutBounds,
        statuses: dict[str, evacuation.NodeStatus] | None = None,
    ) -> None:
        """A pass listed every ``VGPUNodeState``: the cache starts over from what it kept."""
        with self._lock:
            self._kept = dict(kept)
            self._statuses = {n: st for n, st in (statuses or {}).items() if n in kept}
            self._uids = {n: uid for n, uid in uids.items() if n in kept}
            self._shared = {}
            for _, _, report in self._kept.values():
                for entry in report.entries:
                    self._shared.setdefault(entry, entry)
            self._bounds = bounds
            self._ready = True
            self.relists += 1

    def event(self, kind: str, obj: JsonObject) -> None:
        """One watched change (on the watch's thread)."""
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return
        name, version = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        if not name:
            return
        with self._lock:
            bounds, ready = self._bounds, self._ready
            old = self._kept.get(name)
            shared = self._shared
        if not ready or bounds is None:
            return  # the next list reads it
        if kind == "DELETED":
            with self._lock:
                if self._bounds is bounds:
                    self._kept.pop(name, None)
                    self._uids.pop(name, None)
                    self._statuses.pop(name, None)
            self.on_change()
            return
        if old is not None and old[0] == version:
            return
        report = self.read(obj, bounds, shared)  # outside the lock: decoding takes time
        status = evacuation.read_node(obj)
        uid = meta.get("uid")
        with self._lock:
            if self._bounds is not bounds or not self._ready:
                return
            self._kept[name] = (version, bounds, report)
            self._statuses[name] = status
            if isinstance(uid, str) and uid:
                self._uids[name] = uid
        self.on_change()

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)
