"""Rollout slots: at most N nodes reconfigure disruptively at once, coordinated by Leases.

One ConfigMap edit reaches every agent within seconds. A plan that destroys
vGPUs (or disables SR-IOV) is disruptive, so before it applies, the agent
takes one of ``N`` slots: ``coordination.k8s.io/v1`` Leases named
``vgpu-state-rollout-0`` … ``vgpu-state-rollout-<N-1>`` in the agent's
namespace (``N`` is the config's ``policy.max-unavailable``, default 1). A plan
that only creates needs no slot.

A slot is free when its Lease has no holder or its holder stopped renewing
it (``renewTime + leaseDurationSeconds`` in the past: the holder died). The
agent renews its slot while it applies and releases it when the node reports
success. After a failure it keeps the slot without renewing it, so a change
that breaks nodes stops at the first ``N`` of them until the Lease expires.

Every write is guarded by the ``resourceVersion`` the agent read (optimistic
concurrency): of two agents that see the same free slot, one wins and the
other gets 409 Conflict and tries the next slot.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

log = logging.getLogger(__name__)

SLOT_PREFIX = "vgpu-state-rollout-"
DEFAULT_LEASE_SECONDS = 120
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaseApiError(Exception):
    """The API server refused a Lease request (``status`` is the HTTP status; 0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


@dataclass(frozen=True)
class Slot:
    """A rollout slot this agent holds."""

    name: str
    resource_version: str


class RolloutSlots:
    """Take, renew and release rollout slots for one holder (the node name)."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        holder: str,
        slots: int = 1,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
        clock: Clock = utc_now,
        timeout: tuple[float, float] = (5.0, 30.0),
    ) -> None:
        if slots < 1:
            raise ValueError(f"max-unavailable must be at least 1, got {slots}")
        self._client = api_client
        self.namespace = namespace
        self.holder = holder
        self.slots = slots
        self.lease_seconds = lease_seconds
        self._clock = clock
        self._timeout = timeout

    def names(self) -> list[str]:
        return [f"{SLOT_PREFIX}{i}" for i in range(self.slots)]

    def acquire(self) -> Slot | None:
        """Take a slot (or keep the one this holder already has); ``None`` when all are taken."""
        leases: dict[str, dict[str, Any] | None] = {n: self._get(n) for n in self.names()}
        # One this holder already has first (a restart in the middle of an apply).
        for name, lease in leases.items():
            if lease is not None and _holder(lease) == self.holder:
                return self._take(name, lease)
        for name, lease in leases.items():
            if lease is None:
                slot = self._create(name)
            elif self._free(lease):
                slot = self._take(name, lease)
            else:
                continue
            if slot is not None:
                return slot
        return None

    def renew(self, slot: Slot) -> Slot | None:
        """Extend the slot; ``None`` when this holder lost it meanwhile."""
        lease = self._get(slot.name)
        if lease is None or _holder(lease) != self.holder:
            return None
        return self._write(slot.name, lease, renew_only=True)

    def release(self, slot: Slot) -> bool:
        """Give the slot back (after the node reported success). False if it was not ours."""
        lease = self._get(slot.name)
        if lease is None or _holder(lease) != self.holder:
            return False
        body = _with_spec(lease, {"holderIdentity": None, "acquireTime": None, "renewTime": None})
        try:
            self._request("PUT", self._path(slot.name), body)
        except LeaseApiError as exc:
            if exc.status == 409:
                return False
            raise
        log.info("released rollout slot %s", slot.name)
        return True

    def holders(self) -> dict[str, str | None]:
        """Each slot's live holder (``None``: free or expired)."""
        result: dict[str, str | None] = {}
        for name in self.names():
            lease = self._get(name)
            result[name] = None if lease is None or self._free(lease) else _holder(lease)
        return result

    @contextmanager
    def held(self, slot: Slot, every: float | None = None) -> Iterator[threading.Event]:
        """Renew ``slot`` in a thread while the block runs; the event is set if it is lost."""
        lost = threading.Event()
        done = threading.Event()
        interval = every if every is not None else max(1.0, self.lease_seconds / 3)

        def renew_loop() -> None:
            current: Slot | None = slot
            while not done.wait(interval):
                try:
                    current = self.renew(current) if current is not None else None
                except LeaseApiError as exc:
                    log.warning("cannot renew rollout slot %s: %s", slot.name, exc)
                    continue
                if current is None:
                    log.warning("rollout slot %s was taken over", slot.name)
                    lost.set()
                    return

        thread = threading.Thread(target=renew_loop, name="vgpu-state-rollout", daemon=True)
        thread.start()
        try:
            yield lost
        finally:
            done.set()
            thread.join(5)

    # Lease documents ------------------------------------------------------------------
    def _free(self, lease: Mapping[str, Any]) -> bool:
        spec = lease.get("spec") or {}
        if not spec.get("holderIdentity"):
            return True
        renewed = _parse_time(spec.get("renewTime") or spec.get("acquireTime"))
        if renewed is None:
            return True
        seconds = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
        return renewed + dt.timedelta(seconds=seconds) < self._clock()

    def _create(self, name: str) -> Slot | None:
        now = _format_time(self._clock())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": "vgpu-state"},
            },
            "spec": {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            created = self._request("POST", self._path(None), body)
        except LeaseApiError as exc:
            if exc.status == 409:
                return None  # another agent created it first
            raise
        log.info("took rollout slot %s (new)", name)
        return Slot(name, _version(created))

    def _take(self, name: str, lease: Mapping[str, Any]) -> Slot | None:
        return self._write(name, lease, renew_only=_holder(lease) == self.holder)

    def _write(self, name: str, lease: Mapping[str, Any], renew_only: bool) -> Slot | None:
        now = _format_time(self._clock())
        spec: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": now,
        }
        if not renew_only:
            old = lease.get("spec") or {}
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(old.get("leaseTransitions") or 0) + (
                1 if old.get("holderIdentity") else 0
            )
        try:
            written = self._request("PUT", self._path(name), _with_spec(lease, spec))
        except LeaseApiError as exc:
            if exc.status == 409:
                return None  # someone else wrote it since we read it
            raise
        if not renew_only:
            log.info("took rollout slot %s", name)
        return Slot(name, _version(written))

    # HTTP -----------------------------------------------------------------------------
    def _path(self, name: str | None) -> str:
        path = LEASES.format(namespace=quote(self.namespace, safe=""))
        return path if name is None else f"{path}/{quote(name, safe='')}"

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self._request("GET", self._path(name), None)
        except LeaseApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _request(self, method: str, path: str, body: Any) -> dict[str, Any]:
        try:
            serialized = self._client.param_serialize(
                method=method,
                resource_path=path,
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(*serialized, _request_timeout=self._timeout)
            raw = response.read()
        except Exception as exc:  # urllib3 and socket errors: the server did not answer
            raise LeaseApiError(0, f"{method} {path}: no answer: {exc}") from exc
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw[:200].decode("utf-8", "replace")}
        status = int(response.status)
        if not 200 <= status < 300:
            raise LeaseApiError(status, f"{method} {path}: HTTP {status}: {data.get('message')}")
        return data if isinstance(data, dict) else {}


def _holder(lease: Mapping[str, Any]) -> str | None:
    holder = (lease.get("spec") or {}).get("holderIdentity")
    return str(holder) if holder else None


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _with_spec(lease: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(lease.get("metadata") or {})
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {**(lease.get("spec") or {}), **spec},
    }


def _format_time(when: dt.datetime) -> str:
    """A Lease MicroTime: RFC 3339 with microseconds, UTC."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: object) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
