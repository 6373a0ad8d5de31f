"""The test API server (``tests/apiserver.py``) serving ``resource.k8s.io``, in any versions.

:class:`RunningDraApiServer` serves Nodes and the ResourceSlices and
ResourceClaims of the versions a test asks for (a Kubernetes 1.33 server with
``v1beta2`` only, an older one with neither: what one real API server cannot
be). Everything else is :class:`tests.apiserver.ApiServer`'s (resource
versions, ``POST`` and ``PUT`` with conflicts, patches, field selectors such as
``spec.nodeName`` and ``spec.driver``, group discovery). ResourceSlices are
validated as the API server does (name and driver rules, exactly one node
selection, pool fields, at most 128 devices, device names DNS labels and
unique, at most 32 attributes plus capacities, qualified attribute names, one
typed value each, strings at most 64 characters); a refused write is ``422
Invalid`` and recorded in :attr:`tests.apiserver.ApiServer.rejected`.
"""

from __future__ import annotations

import re
from typing import Any

from kmock import ResourceInfo

from tests.apiserver import NODES, ApiServer, RunningApiServer

__all__ = ["NODES", "RunningDraApiServer", "claims", "slice_problems", "slices"]
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")


def slices(version: str) -> str:
    return f"resource.k8s.io/{version}/resourceslices"


def claims(version: str) -> str:
    return f"resource.k8s.io/{version}/resourceclaims"


def slice_problems(obj: dict[str, Any]) -> list[str]:
    """What the API server would refuse in a ResourceSlice (v1 / v1beta2 shape)."""
    bad: list[str] = []
    name = (obj.get("metadata") or {}).get("name", "")
    if not _DNS_SUBDOMAIN.match(name):
        bad.append(f"metadata.name {name!r} is not a DNS subdomain")
    spec = obj.get("spec") or {}
    driver = spec.get("driver", "")
    if not _DNS_SUBDOMAIN.match(driver) or len(driver) > 63:
        bad.append(f"spec.driver {driver!r} is not a DNS subdomain of at most 63 characters")
    if (
        sum(
            1
            for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
            if spec.get(k)
        )
        != 1
    ):
        bad.append("spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection")
    pool = spec.get("pool") or {}
    if not pool.get("name") or int(pool.get("resourceSliceCount") or 0) < 1:
        bad.append("spec.pool: name and resourceSliceCount > 0 are required")
    if int(pool.get("generation", -1)) < 0:
        bad.append("spec.pool.generation must be >= 0")
    devices = spec.get("devices") or []
    if len(devices) > 128:
        bad.append(f"spec.devices: {len(devices)} devices, at most 128")
    names = [d.get("name", "") for d in devices]
    if len(set(names)) != len(names):
        bad.append("spec.devices: duplicate device names")
    for d in devices:
        dn = d.get("name", "")
        if not _DNS_LABEL.match(dn):
            bad.append(f"device {dn!r}: name is not a DNS label")
        attrs_ = d.get("attributes") or {}
        caps = d.get("capacity") or {}
        if len(attrs_) + len(caps) > 32:
            bad.append(f"device {dn}: {len(attrs_) + len(caps)} attributes and capacities (>32)")
        for key in list(attrs_) + list(caps):
            prefix, _, local = key.rpartition("/")
            if not _C_IDENT.match(local) or (prefix and not _DNS_SUBDOMAIN.match(prefix)):
                bad.append(f"device {dn}: {key!r} is not a qualified name")
        for key, value in attrs_.items():
            if (
                not isinstance(value, dict)
                or len(value) != 1
                or next(iter(value)) not in ("int", "bool", "string", "version")
            ):
                bad.append(f"device {dn}: attribute {key} needs exactly one typed value")
            elif "string" in value and len(value["string"]) > 64:
                bad.append(f"device {dn}: attribute {key} longer than 64 characters")
        for key, value in caps.items():
            if not isinstance(value, dict) or "value" not in value:
                bad.append(f"device {dn}: capacity {key} has no value")
    return bad


def check_slice(obj: dict[str, Any]) -> None:
    """Refuse a ResourceSlice as the API server would (a validator of the test server)."""
    bad = slice_problems(obj)
    if bad:
        raise ValueError("; ".join(bad))


class RunningDraApiServer(RunningApiServer):
    """The test API server with Nodes and the given ``resource.k8s.io`` versions."""

    def __init__(self, versions: tuple[str, ...] = ("v1",)) -> None:
        super().__init__()
        self.versions = versions

    def configure(self, server: ApiServer) -> None:
        server.resources[NODES] = ResourceInfo(kind="Node", namespaced=False)
        for v in self.versions:
            server.resources[slices(v)] = ResourceInfo(kind="ResourceSlice", namespaced=False)
            server.resources[claims(v)] = ResourceInfo(kind="ResourceClaim", namespaced=True)
            server.validators[slices(v)] = check_slice
