"""``coordination.k8s.io/v1`` Leases: one identity holds one at a time.

This module is the one home of a Lease: its path, its time format (a
``MicroTime``), when a hold ends, and the guarded writes that take, renew and
release it. Two features stand on it:

* the cluster controller's leader election (:func:`hold_term` and
  :func:`release` here): every replica calls :func:`hold_term` each pass;
  the holder renews the Lease in its term, the others see it held;
* the agent's rollout slots (:mod:`vgpu_state.kube.rollout`): ``N`` Leases a
  disruptive apply must hold one of.

A holder that stops renewing (a deleted pod, a dead node) loses the Lease
``leaseDurationSeconds`` after its last ``renewTime``, and the next identity
to look takes it over. A ``renewTime`` more than :data:`CLOCK_SKEW` in the
future of the reader's clock is not believed: no honest holder writes one
(clocks differ by less), so such a Lease is free at once rather than held
until that time. Every write carries the ``resourceVersion`` that was
read, so of two identities that saw the same free Lease one wins and the
other gets a :class:`~vgpu_state.kube.api.ConflictError` (HTTP 409): both can
never believe they took it.

Every take-over starts a new *term* (:mod:`vgpu_state.kube.fencing`): one more
``leaseTransitions`` and a new ``acquireTime``, also when an identity takes
again a Lease whose hold of its own had ended. The controller's writes carry
their term's token (:func:`hold_term`).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu_state.kube.api import ConflictError, JsonObject, KubeApi, path_of
from vgpu_state.kube.errors import NotFoundError
from vgpu_state.kube.fencing import Term, term_of

LEASE_NAME = "vgpu-state-controller"
DEFAULT_NAMESPACE = "vgpu-state"
DEFAULT_DURATION = 30
LABELS = {"app.kubernetes.io/name": "vgpu-state"}
"""The labels of every Lease vgpu-state creates."""
CLOCK_SKEW = datetime.timedelta(seconds=60)
"""How far a holder's clock may run ahead of a reader's: a ``renewTime`` later than the
reader's now plus this is false, and the Lease free."""


@dataclass(frozen=True)
class LeaseState:
    held: bool
    holder: str | None
    expires: datetime.datetime | None
    term: Term | None = None
    """The term the Lease shows after the call (see :func:`hold_term`)."""
    lease: JsonObject | None = field(default=None, compare=False, repr=False)
    """The Lease as this call wrote it (``None`` when it wrote nothing): the next renewal
    may start from it (``known``) instead of reading it again."""


def format_time(moment: datetime.datetime) -> str:
    """A Lease ``MicroTime``: RFC 3339 with microseconds, in UTC."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: Any) -> datetime.datetime | None:
    """A ``MicroTime`` (or ``Time``) the API server wrote; ``None`` when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def holder(lease: Mapping[str, Any]) -> str | None:
    """The identity that holds (or last held) the Lease; ``None`` when released."""
    name = (lease.get("spec") or {}).get("holderIdentity")
    return str(name) if name else None


def expiry(lease: Mapping[str, Any]) -> datetime.datetime | None:
    """When the hold ends unless renewed (``None``: the Lease says no time)."""
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return None
    return renewed + datetime.timedelta(seconds=duration)


def live_holder(
    lease: Mapping[str, Any], now: datetime.datetime, *, max_duration: int | None = None
) -> str | None:
    """The identity whose hold has not ended at ``now``; ``None``: the Lease is free.

    Free, too, is a Lease that claims a renewal more than :data:`CLOCK_SKEW` after
    ``now``, a duration under 1 s, or (given ``max_duration``) a longer one: a hold
    that no honest holder writes is not one."""
    current = holder(lease)
    ends = expiry(lease)
    if current is None or ends is None or ends <= now:
        return None
    spec = lease.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    if not isinstance(duration, int) or duration < 1:
        return None
    if max_duration is not None and duration > max_duration:
        return None
    if ends - datetime.timedelta(seconds=duration) > now + CLOCK_SKEW:
        return None  # renewed "in the future"
    return current


def held_by_another(lease: Mapping[str, Any], identity: str, now: datetime.datetime) -> bool:
    """Another identity holds the Lease and its hold has not ended at ``now``."""
    return live_holder(lease, now) not in (None, identity)


def version(lease: Mapping[str, Any]) -> str:
    """The ``resourceVersion`` a guarded write of this Lease carries."""
    return str((lease.get("metadata") or {}).get("resourceVersion") or "")


class Leases:
    """The Leases of one namespace, read and written through ``api`` for ``identity``.

    :meth:`create` and :meth:`take` answer ``None`` when another writer got
    there first (HTTP 409); every other refusal is the API's error
    (:class:`~vgpu_state.kube.errors.ClusterError`, or
    :class:`~vgpu_state.kube.errors.ClusterUnreachableError` with no answer).
    """

    def __init__(
        self, api: KubeApi, namespace: str, identity: str, field_manager: str | None = None
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.field_manager = field_manager
        """Sent as ``?fieldManager=`` with every write: the name under which the server
        records (and times) the write in ``metadata.managedFields``."""

    def path(self, name: str | None = None) -> str:
        return path_of("coordination.k8s.io", "v1", "leases", name, self.namespace)

    def get(self, name: str) -> JsonObject | None:
        """The Lease, or ``None`` when it does not exist."""
        try:
            return self.api.get(self.path(name))
        except NotFoundError:
            return None

    def create(
        self, name: str, duration: int, now: datetime.datetime, number: int = 0
    ) -> JsonObject | None:
        """Create the Lease held by this identity from ``now`` (its first term: ``number``)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": self.namespace, "labels": dict(LABELS)},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": duration,
                "acquireTime": format_time(now),
                "renewTime": format_time(now),
                "leaseTransitions": number,
            },
        }
        try:
            return self.api.request("POST", self.path(), body, query=self._query())
        except ConflictError:
            return None

    def take(
        self,
        lease: JsonObject,
        duration: int,
        now: datetime.datetime,
        *,
        new_term: bool = False,
        number: int = 0,
    ) -> JsonObject | None:
        """Write this identity as the holder from ``now``: a renewal while its hold has not
        ended, else a take-over, which starts a new term (a new ``acquireTime``, one more
        ``leaseTransitions``, at least ``number``). ``new_term`` starts one in any case."""
        spec = dict(lease.get("spec") or {})
        if new_term or live_holder(lease, now) != self.identity:
            spec["leaseTransitions"] = max(int(spec.get("leaseTransitions") or 0) + 1, number)
            spec["acquireTime"] = format_time(now)
        spec.update(
            holderIdentity=self.identity, leaseDurationSeconds=duration, renewTime=format_time(now)
        )
        return self._replace(lease, spec)

    def release(self, lease: JsonObject) -> bool:
        """Give the Lease up, if this identity holds it, so the next need not wait it out."""
        if holder(lease) != self.identity:
            return False
        spec = {
            key: value
            for key, value in (lease.get("spec") or {}).items()
            if key not in ("holderIdentity", "acquireTime", "renewTime")
        }
        return self._replace(lease, spec) is not None

    def _replace(self, lease: JsonObject, spec: JsonObject) -> JsonObject | None:
        name = str((lease.get("metadata") or {}).get("name") or "")
        try:
            # The body carries metadata.resourceVersion: a stale view is a 409.
            return self.api.request(
                "PUT", self.path(name), {**lease, "spec": spec}, query=self._query()
            )
        except ConflictError:
            return None

    def _query(self) -> dict[str, str] | None:
        return {"fieldManager": self.field_manager} if self.field_manager else None


def _state(lease: JsonObject, identity: str) -> LeaseState:
    current = holder(lease)
    return LeaseState(current == identity, current, expiry(lease), term_of(lease))


def hold_term(
    api: KubeApi,
    identity: str,
    term: Term | None,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    name: str = LEASE_NAME,
    duration: int = DEFAULT_DURATION,
    now: datetime.datetime | None = None,
    after: int | None = None,
    take_own: bool = True,
    known: JsonObject | None = None,
) -> LeaseState:
    """Renew the Lease in ``term`` (the one this process holds), or start a new term.

    ``term`` ``None`` (this process holds none) starts a new one, also over a live
    hold of its own identity (unless ``take_own`` is false: then it waits until that
    hold ends): a restarted process must not carry on the term of the one before it.
    When the Lease shows a term of this identity other than ``term``, another
    process of the same identity began it: not held. ``after``: a term number (a
    newer term's, read in the KubeVirt CR) the held term must be past; a term that
    is not is followed by a new one numbered past it. ``held`` is ``False`` while
    another identity's hold has not ended, and after a lost race (a term is only
    ever this process's when its own write began it).

    ``known``: the Lease as this process last wrote it (:attr:`LeaseState.lease`): the
    renewal is decided on it and written with its ``resourceVersion``, without reading
    the Lease first; when the Lease changed since (HTTP 409) or is gone, it is read and
    decided on as without ``known``.
    """
    if known is not None and term is not None:
        try:
            return _hold(
                api, identity, term, namespace, name, duration, now, after, take_own, known
            )
        except NotFoundError:
            pass  # deleted since: read it (and create it) below
        except _Stale:
            pass
    return _hold(api, identity, term, namespace, name, duration, now, after, take_own, None)


class _Stale(Exception):
    """The Lease this process last wrote is not the one the server has."""


def _hold(
    api: KubeApi,
    identity: str,
    term: Term | None,
    namespace: str,
    name: str,
    duration: int,
    now: datetime.datetime | None,
    after: int | None,
    take_own: bool,
    known: JsonObject | None,
) -> LeaseState:
    moment = now or datetime.datetime.now(tz=datetime.UTC)
    leases = Leases(api, namespace, identity)
    lease = known if known is not None else leases.get(name)
    number = 0 if after is None else after + 1
    if lease is None:
        written = leases.create(name, duration, moment, number)
    elif held_by_another(lease, identity, moment):
        return LeaseState(False, holder(lease), expiry(lease), term_of(lease))
    else:
        shown = term_of(lease)
        ours = live_holder(lease, moment) == identity
        if ours and (shown != term if term is not None else not take_own):
            return LeaseState(False, identity, expiry(lease), shown)
        renewal = ours and term is not None and (after is None or term.number > after)
        written = leases.take(lease, duration, moment, new_term=not renewal, number=number)
    if written is None and known is not None:
        raise _Stale  # it changed since this process wrote it: read it
    if written is None:  # another replica wrote it since we read it
        state = _state(leases.get(name) or {}, identity)
        return LeaseState(False, state.holder, state.expires, state.term)
    return LeaseState(True, identity, expiry(written), term_of(written), written)


def release(
    api: KubeApi, identity: str, *, namespace: str = DEFAULT_NAMESPACE, name: str = LEASE_NAME
) -> None:
    """Give the Lease up (if ``identity`` holds it) so another replica need not wait it out."""
    leases = Leases(api, namespace, identity)
    lease = leases.get(name)
    if lease is not None:
        leases.release(lease)
