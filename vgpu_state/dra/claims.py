"""ResourceClaims as frozen values, the lookup protocol, and "claims hold vGPUs".

The kubelet's prepare call names a claim by namespace, name and UID only; the
plugin reads the claim through a :class:`ClaimSource` (the Kubernetes API in
production, :mod:`vgpu_state.kube.dra`; an emulator or a dict in tests). A
claim allocated to a device of this node's pool holds that vGPU: the planner
must not destroy it, and names the claim and its pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from vgpu_state.dra.names import device_key

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


@dataclass(frozen=True)
class AllocatedDevice:
    """One entry of ``status.allocation.devices.results``."""

    request: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class Consumer:
    """One entry of ``status.reservedFor`` (usually a pod)."""

    resource: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class Claim:
    """What the plugin needs of a ResourceClaim."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str] | None = None
    allocated: bool = False
    results: tuple[AllocatedDevice, ...] = ()
    reserved_for: tuple[Consumer, ...] = ()

    @property
    def pod_claim_name(self) -> str | None:
        """The pod's name for a claim generated from a template (Kubernetes 1.36+)."""
        return (self.annotations or {}).get(POD_CLAIM_NAME)

    def ours(self, driver: str, pool: str) -> tuple[AllocatedDevice, ...]:
        """The allocation results of ``driver`` in ``pool``."""
        return tuple(r for r in self.results if r.driver == driver and r.pool == pool)

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> Claim:
        """Parse a ResourceClaim object (``resource.k8s.io`` v1 or v1beta2, as a dict)."""
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        allocation = status.get("allocation")
        results = ((allocation or {}).get("devices") or {}).get("results") or []
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            annotations=dict(meta.get("annotations") or {}),
            allocated=allocation is not None,
            results=tuple(
                AllocatedDevice(
                    request=str(r.get("request", "")),
                    driver=str(r.get("driver", "")),
                    pool=str(r.get("pool", "")),
                    device=str(r.get("device", "")),
                )
                for r in results
            ),
            reserved_for=tuple(
                Consumer(
                    resource=str(c.get("resource", "")),
                    name=str(c.get("name", "")),
                    uid=str(c.get("uid", "")),
                )
                for c in status.get("reservedFor") or []
            ),
        )


class ClaimSource(Protocol):
    """Reads ResourceClaims; ``None`` when the claim does not exist."""

    def get_claim(self, namespace: str, name: str) -> Claim | None: ...


def holder_text(claim: Claim) -> str:
    """``ResourceClaim ns/name (pod ns/a, pod ns/b)``: who holds a vGPU, as the plan names it."""
    text = f"ResourceClaim {claim.namespace}/{claim.name}"
    consumers = [
        f"{c.resource.rstrip('s') or 'consumer'} {claim.namespace}/{c.name}"
        for c in claim.reserved_for
    ]
    return f"{text} ({', '.join(consumers)})" if consumers else text


def claim_holders(claims: Iterable[Claim], driver: str, pool: str) -> dict[str, str]:
    """vGPU key (mdev UUID or VF address) -> holder text, for every claim allocated in our pool.

    The result is the planner's in-use mapping: a vGPU allocated to a claim is
    held whether or not a pod has started with it yet.
    """
    held: dict[str, str] = {}
    for claim in sorted(claims, key=lambda c: (c.namespace, c.name)):
        if not claim.allocated:
            continue
        for result in claim.ours(driver, pool):
            key = device_key(result.device)
            if key is not None:
                held.setdefault(key, holder_text(claim))
    return held
