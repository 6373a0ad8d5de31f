"""A Lease one identity holds at a time: the cluster controller's leader election.

Every controller replica calls :func:`try_acquire` each pass; the holder renews
the Lease, the others see it held. A holder that stops renewing (a deleted
pod, a dead node) loses it after ``leaseDurationSeconds``, and the next
replica to look takes it over. Every write is guarded by the Lease's
``resourceVersion``, so two replicas can never both believe they took it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from vgpu_state.kube.api import ConflictError, JsonObject, KubeApi, path_of
from vgpu_state.kube.errors import NotFoundError

LEASE_NAME = "vgpu-state-controller"
DEFAULT_NAMESPACE = "vgpu-state"
DEFAULT_DURATION = 30


@dataclass(frozen=True)
class LeaseState:
    held: bool
    holder: str | None
    expires: datetime.datetime | None


def _micro(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: Any) -> datetime.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def expiry(lease: JsonObject) -> datetime.datetime | None:
    spec = lease.get("spec") or {}
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return None
    return renewed + datetime.timedelta(seconds=duration)


def try_acquire(
    api: KubeApi,
    identity: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    name: str = LEASE_NAME,
    duration: int = DEFAULT_DURATION,
    now: datetime.datetime | None = None,
) -> LeaseState:
    """Take or renew the Lease for ``identity``; ``held`` says whether it is ours now."""
    moment = now or datetime.datetime.now(tz=datetime.UTC)
    path = path_of("coordination.k8s.io", "v1", "leases", name, namespace)
    try:
        lease = api.get(path)
    except NotFoundError:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "holderIdentity": identity,
                "leaseDurationSeconds": duration,
                "acquireTime": _micro(moment),
                "renewTime": _micro(moment),
                "leaseTransitions": 0,
            },
        }
        try:
            api.create(path_of("coordination.k8s.io", "v1", "leases", None, namespace), body)
        except ConflictError:
            return _state(api.get(path), identity)
        return LeaseState(True, identity, moment + datetime.timedelta(seconds=duration))
    spec = dict(lease.get("spec") or {})
    holder = spec.get("holderIdentity")
    ends = expiry(lease)
    if holder != identity and holder and ends is not None and ends > moment:
        return LeaseState(False, str(holder), ends)
    if holder != identity:
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["acquireTime"] = _micro(moment)
    spec.update(holderIdentity=identity, leaseDurationSeconds=duration, renewTime=_micro(moment))
    lease["spec"] = spec
    try:
        api.replace(path, lease)  # carries metadata.resourceVersion: a stale view is a 409
    except ConflictError:
        return _state(api.get(path), identity)
    return LeaseState(True, identity, moment + datetime.timedelta(seconds=duration))


def _state(lease: JsonObject, identity: str) -> LeaseState:
    holder = (lease.get("spec") or {}).get("holderIdentity")
    return LeaseState(holder == identity, str(holder) if holder else None, expiry(lease))


def release(
    api: KubeApi, identity: str, *, namespace: str = DEFAULT_NAMESPACE, name: str = LEASE_NAME
) -> None:
    """Give the Lease up (if ``identity`` holds it) so another agent need not wait it out."""
    path = path_of("coordination.k8s.io", "v1", "leases", name, namespace)
    try:
        lease = api.get(path)
    except NotFoundError:
        return
    spec = dict(lease.get("spec") or {})
    if spec.get("holderIdentity") != identity:
        return
    spec.pop("holderIdentity", None)
    spec.pop("renewTime", None)
    lease["spec"] = spec
    try:
        api.replace(path, lease)
    except ConflictError:
        return
