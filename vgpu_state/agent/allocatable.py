"""The agent checks that the kubelet offers what its device plugin advertised, and repairs a
lost registration.

:class:`AllocatableMonitor` keeps the Node's ``status.allocatable`` and
``status.capacity`` as the Node watch delivers them (a heartbeat that changes
neither costs nothing: no evaluation, no reconcile, no write), reads the
device plugin's healthy devices per resource, and judges them with
:func:`vgpu_state.model.allocatable.check`. The verdict is the
``KubeletAllocatable`` condition of the node's ``VGPUNodeState`` status: every
status the agent writes carries it, and between reconciles the monitor writes
the status again only when the condition changes (the watched allocatable
changed, the grace period ended, the plugin's list changed).

Self-heal: when the kubelet shows 0 (or nothing) for a resource the plugin
advertises, and that lasts the grace period, the plugin registers the resource
again (the path a kubelet restart takes), a Warning Event says so, and the
next check shows whether it helped. A resource is re-registered at most once
per grace period, with the interval doubling while it stays lost (up to
:data:`MAX_HEAL_INTERVAL`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from vgpu_state.agent.triggers import Service, Stop
from vgpu_state.background import BackgroundLoop, Backoff, positive
from vgpu_state.model.allocatable import (
    DEFAULT_GRACE,
    AllocatableCheck,
    AllocatableReason,
    check,
    extended_counts,
)
from vgpu_state.model.status import EventType

if TYPE_CHECKING:
    from vgpu_state.agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

MAX_HEAL_INTERVAL = 600.0
"""Seconds between re-registrations of a resource that stays lost, at most."""
RETRY_PUBLISH = 10.0
"""Seconds before a status write that failed is tried again (at most the grace period)."""


class AdvertisingPlugin(Protocol):
    """What the monitor needs of the device plugin (:class:`DevicePluginManager`)."""

    def advertised(self) -> Mapping[str, int]: ...

    def registrations(self) -> Mapping[str, int]: ...

    def reregister(self, resource: str) -> bool: ...


EventSink = Callable[[str, str, EventType], None]


class AllocatableMonitor(BackgroundLoop):
    """Judge the kubelet's allocatable against the plugin's list; publish and self-heal.

    ``grace``: seconds the kubelet gets after the advertised list (or a
    registration) changes. ``clock``: monotonic seconds (tests pass their own).
    ``publish``: writes the status again (returns ``False`` when no status was
    written yet, so there is nothing to update); ``event``: records an Event.
    """

    def __init__(
        self,
        plugin: AdvertisingPlugin,
        *,
        grace: float = DEFAULT_GRACE,
        clock: Callable[[], float] = time.monotonic,
        max_heal_interval: float = MAX_HEAL_INTERVAL,
    ) -> None:
        super().__init__(
            "vgpu-state-allocatable",
            first=None,
            after_error=min(positive("the allocatable grace period", grace), 10.0),
        )
        self.plugin = plugin
        self.grace = grace
        self._heal_backoff = Backoff(grace, max(max_heal_interval, grace), jitter=False)
        self._clock = clock
        self.publish: Callable[[], bool] | None = None
        self.event: EventSink | None = None
        self.metrics: AgentMetrics | None = None
        self._lock = threading.Lock()
        self._allocatable: dict[str, int] | None = None
        self._capacity: dict[str, int] | None = None
        self._seen: tuple[dict[str, int], dict[str, int]] | None = None
        self._changed_at: float | None = None
        self._ever: set[str] = set()
        self._lost_since: dict[str, float] = {}
        self._heals: dict[str, int] = {}
        self._next_heal: dict[str, float] = {}
        self._written: tuple[bool | None, str, str] | None = None
        self._warned: str | None = None
        self.nodes_seen = 0
        """Node objects the watch delivered (heartbeats included)."""
        self.node_version: str | None = None
        """The ``resourceVersion`` of the last Node object delivered."""
        self.evaluations = 0
        """Checks run (at status writes and on the monitor's own wake-ups)."""
        self.reregistered: list[str] = []
        """Every resource the monitor asked the plugin to register again, in order."""

    # inputs --------------------------------------------------------------------------
    def node_seen(self, node: Mapping[str, Any]) -> None:
        """A Node object from the watch. Wakes the monitor only when our numbers changed."""
        status = node.get("status") or {}
        allocatable = extended_counts(status.get("allocatable"))
        capacity = extended_counts(status.get("capacity"))
        with self._lock:
            changed = (allocatable, capacity) != (self._allocatable, self._capacity)
            self._allocatable, self._capacity = allocatable, capacity
            self.nodes_seen += 1
            version = (node.get("metadata") or {}).get("resourceVersion")
            self.node_version = str(version) if version is not None else None
        if changed:
            self.wake()

    # the verdict ---------------------------------------------------------------------
    def condition(self) -> AllocatableCheck:
        """The condition now (what a status written now carries)."""
        with self._lock:
            return self._check(self._clock())

    def written(self, verdict: AllocatableCheck) -> None:
        """A status carrying ``verdict`` is stored (the status writer says so)."""
        with self._lock:
            self._written = (verdict.status, verdict.reason.value, verdict.message)

    def _check(self, now: float) -> AllocatableCheck:
        advertised = dict(self.plugin.advertised())
        registrations = dict(self.plugin.registrations())
        if (advertised, registrations) != self._seen:
            self._seen = (advertised, registrations)
            self._changed_at = now
            self._ever |= set(advertised)
        settled = self._changed_at is None or now - self._changed_at >= self.grace
        self.evaluations += 1
        return check(
            advertised,
            self._ever - advertised.keys(),
            self._allocatable,
            self._capacity,
            settled=settled,
            grace=self.grace,
        )

    # one round -----------------------------------------------------------------------
    def tick(self) -> float | None:
        """Check, publish a changed condition, re-register lost resources that are due.

        Returns the seconds until the next deadline (grace end, next
        re-registration), or ``None`` when only a change can alter the verdict.
        """
        now = self._clock()
        due: list[str] = []
        with self._lock:
            verdict = self._check(now)
            # A resource stays "lost" (and its backoff grows) until it matches again, also
            # through the Unknown spell that follows each re-registration.
            lost = {c.resource for c in verdict.lost}
            for resource in list(self._lost_since):
                if resource not in lost:
                    del self._lost_since[resource]
                    self._heals.pop(resource, None)
                    self._next_heal.pop(resource, None)
            for resource in sorted(lost):
                since = self._lost_since.setdefault(resource, now)
                if (
                    verdict.status is False
                    and now - since >= self.grace
                    and now >= self._next_heal.get(resource, 0.0)
                ):
                    heals = self._heals.get(resource, 0) + 1
                    self._heals[resource] = heals
                    self._next_heal[resource] = now + self._heal_backoff.delay(heals)
                    due.append(resource)
            unpublished = (verdict.status, verdict.reason.value, verdict.message) != self._written
            deadlines = [self._lost_since[r] + self.grace for r in lost]
            deadlines += [self._next_heal[r] for r in lost if r in self._next_heal]
            if verdict.status is None and self._changed_at is not None:
                deadlines.append(self._changed_at + self.grace)
        if self.metrics is not None:
            mismatched = len(verdict.mismatched) if verdict.status is False else 0
            self.metrics.allocatable_mismatched.set(mismatched)
        ahead = [t - now for t in deadlines if t > now]
        if unpublished and self.publish is not None:
            try:
                self.publish()
            except Exception as e:  # the API server is away: try again, heal meanwhile
                log.warning("could not write the KubeletAllocatable condition: %s; retrying", e)
                ahead.append(min(self.grace, RETRY_PUBLISH))
        self._warn(verdict)
        for resource in due:
            self._heal(resource, verdict)
        return min(ahead) if ahead else None

    def _record(self, reason: AllocatableReason, message: str) -> None:
        if self.event is None:
            return
        try:
            self.event(reason.value, message[:1000], EventType.WARNING)
        except Exception as e:  # an Event lost is a log line, never a stopped monitor
            log.warning("could not record the %s Event: %s", reason.value, e)

    def _warn(self, verdict: AllocatableCheck) -> None:
        if verdict.status is not False:
            if verdict.status is True:
                self._warned = None
            return
        if verdict.message == self._warned:
            return
        self._warned = verdict.message
        log.warning(
            "the kubelet does not offer what the device plugin advertises: %s", verdict.message
        )
        self._record(
            AllocatableReason.MISMATCH,
            f"the kubelet's allocatable differs from the device plugin's list: {verdict.message}",
        )

    def _heal(self, resource: str, verdict: AllocatableCheck) -> None:
        count = next((c for c in verdict.counts if c.resource == resource), None)
        if not self.plugin.reregister(resource):
            return
        self.reregistered.append(resource)
        shown = count.describe() if count is not None else resource
        message = (
            f"{shown} for {self.grace:g} s or more: the kubelet seems to have lost the "
            "device plugin's registration; registering the resource again"
        )
        log.warning("%s", message)
        if self.metrics is not None:
            self.metrics.plugin_reregistrations.labels(resource=resource).inc()
        self._record(AllocatableReason.REREGISTERED, message)

    # the thread (a BackgroundLoop: start, stop, wake) ---------------------------------
    def step(self) -> float | None:
        """The thread's round: :meth:`tick` (woken early by :meth:`wake`)."""
        return self.tick()

    def service(self) -> Service:
        """A service of the agent (it asks for no reconcile): starts the monitor with the
        agent, stops it before the plugin."""

        def start() -> Stop:
            self.start()
            return lambda: self.stop(5)

        return start
