"""Rollout slots: at most N nodes reconfigure disruptively at once, coordinated by Leases.

One ConfigMap edit reaches every agent within seconds. A plan that destroys
vGPUs (or disables SR-IOV) is disruptive, so before it applies, the agent
takes one of ``N`` slots: ``coordination.k8s.io/v1`` Leases named
``vgpu-state-rollout-0`` … ``vgpu-state-rollout-<N-1>`` in the agent's
namespace (``N`` is the config's ``policy.max-unavailable``, default 1). A plan
that only creates needs no slot.

A slot is free when its Lease has no holder or its holder stopped renewing
it (``renewTime + leaseDurationSeconds`` in the past: the holder died). A
Lease no honest agent writes is free as well, so that one node cannot hold
the fleet's slots for ever: one renewed more than a minute in the future of
the reader's clock (:data:`~vgpu_state.kube.lease.CLOCK_SKEW`), one that lasts
longer than :data:`MAX_LEASE_SECONDS`, and one whose holder has no Node (a
deleted node's). Only the slots ``0`` … ``N-1`` count (at most
:data:`MAX_SLOTS`); other ``vgpu-state-rollout-*`` Leases are ignored. The
agent renews its slot while it applies and releases it when the node reports
success. After a failure it keeps the slot without renewing it, so a change
that breaks nodes stops at the first ``N`` of them until the Lease expires.

Every write is guarded by the ``resourceVersion`` the agent read (optimistic
concurrency): of two agents that see the same free slot, one wins and the
other gets 409 Conflict and tries the next slot. Every write names the field
manager :data:`FIELD_MANAGER`: the admission policy of ``deploy/policies.yaml``
reads the API server's time of the write from it (``docs/security.md``).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from vgpu_state.background import BackgroundLoop
from vgpu_state.kube.api import InvalidError, JsonObject, KubeApi
from vgpu_state.kube.errors import ClusterError, ClusterUnreachableError, NotFoundError
from vgpu_state.kube.lease import Leases, holder, live_holder, version
from vgpu_state.kube.node import read_node

log = logging.getLogger(__name__)

SLOT_PREFIX = "vgpu-state-rollout-"
DEFAULT_LEASE_SECONDS = 120
MAX_SLOTS = 64
"""Slots ``0`` … ``63`` at most, whatever ``max-unavailable`` says (the admission policy
refuses other names)."""
MAX_LEASE_SECONDS = 600
"""The longest hold a slot may claim (the admission policy's bound); a longer one is free."""
FIELD_MANAGER = "vgpu-state-rollout"
"""The field manager of every slot write (the admission policy requires it)."""
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Slot:
    """A rollout slot this agent holds."""

    name: str
    resource_version: str


class RolloutSlots:
    """Take, renew and release rollout slots for one holder (the node name).

    Each method raises the API's errors (:class:`~vgpu_state.kube.errors.ClusterError`,
    :class:`~vgpu_state.kube.errors.ClusterUnreachableError`) when the server refuses or
    does not answer; losing a race to another node is an answer (``None``, ``False``).
    """

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        holder: str,
        slots: int = 1,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
        clock: Clock = utc_now,
    ) -> None:
        if slots < 1:
            raise ValueError(f"max-unavailable must be at least 1, got {slots}")
        if not 1 <= lease_seconds <= MAX_LEASE_SECONDS:
            raise ValueError(
                f"a rollout slot lasts 1 to {MAX_LEASE_SECONDS} s, got {lease_seconds}"
            )
        self.api = api
        self.leases = Leases(api, namespace, holder, field_manager=FIELD_MANAGER)
        self.holder = holder
        self.slots = slots
        self.lease_seconds = lease_seconds
        self._clock = clock

    def names(self) -> list[str]:
        return [f"{SLOT_PREFIX}{i}" for i in range(min(self.slots, MAX_SLOTS))]

    def acquire(self) -> Slot | None:
        """Take a slot (or keep the one this holder already has); ``None`` when all are taken.

        A take-over the API server refuses (422: the slot has not expired by the server's
        clock, which may lag this node's) moves on to the next slot; when no slot was
        taken, the first refusal is raised."""
        leases = {n: self.leases.get(n) for n in self.names()}
        # One this holder already has first (a restart in the middle of an apply).
        for name, lease in leases.items():
            if lease is not None and holder(lease) == self.holder:
                return self._take(name, lease)
        now = self._clock()
        refused: InvalidError | None = None
        for name, lease in leases.items():
            if lease is None:
                slot = self._slot(name, self.leases.create(name, self.lease_seconds, now), "new")
            elif self._live_holder(lease, now) is None:
                try:
                    slot = self._take(name, lease)
                except InvalidError as e:
                    refused = refused or e
                    continue
            else:
                continue
            if slot is not None:
                return slot
        if refused is not None:
            raise refused
        return None

    def renew(self, slot: Slot) -> Slot | None:
        """Extend the slot; ``None`` when this holder lost it meanwhile."""
        lease = self.leases.get(slot.name)
        if lease is None or holder(lease) != self.holder:
            return None
        return self._take(slot.name, lease)

    def release(self, slot: Slot) -> bool:
        """Give the slot back (after the node reported success). False if it was not ours."""
        lease = self.leases.get(slot.name)
        if lease is None or not self.leases.release(lease):
            return False
        log.info("released rollout slot %s", slot.name)
        return True

    def holders(self) -> dict[str, str | None]:
        """Each slot's live holder (``None``: free or expired)."""
        now = self._clock()
        result: dict[str, str | None] = {}
        for name in self.names():
            lease = self.leases.get(name)
            result[name] = None if lease is None else self._live_holder(lease, now)
        return result

    def _live_holder(self, lease: JsonObject, now: dt.datetime) -> str | None:
        """The node that holds the slot at ``now``; ``None``: free (never renewed, expired,
        dated in the future, too long, or its holder's Node is gone)."""
        current = live_holder(lease, now, max_duration=MAX_LEASE_SECONDS)
        if current is None or current == self.holder or self._node_exists(current):
            return current
        log.info("rollout slot holder %s has no Node: the slot is free", current)
        return None

    def _node_exists(self, name: str) -> bool:
        """Whether a Node ``name`` exists (a name no Node can have: no)."""
        if _NODE_NAME.fullmatch(name) is None:
            return False
        try:
            read_node(self.api, name)
        except NotFoundError:
            return False
        return True

    @contextmanager
    def held(self, slot: Slot, every: float | None = None) -> Iterator[threading.Event]:
        """Renew ``slot`` in a thread while the block runs; the event is set if it is lost."""
        interval = every if every is not None else max(1.0, self.lease_seconds / 3)
        renewal = _Renewal(self, slot, interval).start()
        try:
            yield renewal.lost
        finally:
            renewal.stop(5)

    def _take(self, name: str, lease: JsonObject) -> Slot | None:
        renewal = holder(lease) == self.holder
        written = self.leases.take(lease, self.lease_seconds, self._clock())
        return self._slot(name, written, "" if renewal else "taken")

    def _slot(self, name: str, written: JsonObject | None, how: str) -> Slot | None:
        if written is None:
            return None  # another node wrote it since we read it
        if how:
            log.info("took rollout slot %s (%s)", name, how)
        return Slot(name, version(written))


class _Renewal(BackgroundLoop):
    """Renews a slot every ``interval`` seconds; sets :attr:`lost` when another node has it."""

    def __init__(self, slots: RolloutSlots, slot: Slot, interval: float) -> None:
        super().__init__("vgpu-state-rollout", first=interval)
        self.slots = slots
        self.slot = slot
        self.interval = interval
        self.lost = threading.Event()

    def step(self) -> float | None:
        try:
            renewed = self.slots.renew(self.slot)
        except (ClusterError, ClusterUnreachableError) as exc:
            log.warning("cannot renew rollout slot %s: %s", self.slot.name, exc)
            return self.interval
        if renewed is None:
            log.warning("rollout slot %s was taken over", self.slot.name)
            self.lost.set()
            self.stopping.set()
            return None
        self.slot = renewed
        return self.interval
