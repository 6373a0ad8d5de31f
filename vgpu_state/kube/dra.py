"""Dynamic Resource Allocation on the Kubernetes API: ResourceSlices, ResourceClaims.

* :func:`resource_api_version`: ``v1`` when the API server serves it, else ``v1beta2``
  (same object shape); neither is an error that names the Kubernetes versions.
* :class:`SlicePublisher`: keeps the node's ResourceSlices equal to a
  :class:`~vgpu_state.dra.slices.PoolSpec`. Any change (a vGPU created or
  destroyed, a slice someone deleted) bumps the pool generation in every slice,
  deletes obsolete slices, replaces changed ones and creates missing ones. The
  kubelet deletes a node's slices when it starts and 30 s after a driver
  disconnects: :meth:`SlicePublisher.sync` (run periodically by
  :class:`SliceResync`, and at once when the kubelet registers the plugin)
  recreates them. The agent leaves them in place when it stops (a restart or a
  rollout); :func:`remove_driver_slices` deletes them for an uninstall.
* :class:`KubeClaims`: the plugin's :class:`~vgpu_state.dra.claims.ClaimSource`.
* :func:`claims_in_use`: vGPUs allocated to claims in this node's pool, as the
  planner's in-use mapping (key -> "ResourceClaim ns/name (pod ns/p)").

Every request goes through :class:`~vgpu_state.kube.api.KubeApi`, so DRA
requests fail with the same errors as every other cluster request
(:mod:`vgpu_state.kube.errors`): unreachable or overloaded servers are
transient, refusals name the request and the status.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from vgpu_state.background import BackgroundLoop
from vgpu_state.dra.claims import Claim, claim_holders
from vgpu_state.dra.names import DRIVER
from vgpu_state.kube.api import KubeApi, path_of
from vgpu_state.kube.errors import ClusterError, NotFoundError
from vgpu_state.kube.node import read_node
from vgpu_state.model.errors import UserError

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2")
SLICES = "resourceslices"
CLAIMS = "resourceclaims"
CONTENT_ANNOTATION = "vgpu-state.io/slice-content"
"""sha256 of the slice's spec without the generation: what we last wrote, so a
server that fills in defaults never makes an unchanged pool look changed."""


class SlicePool(Protocol):
    """A node's pool as :class:`vgpu_state.dra.slices.PoolSpec` builds it."""

    @property
    def driver(self) -> str: ...

    @property
    def node(self) -> str: ...

    def manifests(self, generation: int, api_version: str) -> list[dict[str, Any]]: ...


class DraUnsupportedError(UserError):
    """The cluster serves no ResourceSlice version vgpu-state can write."""


def resource_api_version(api: KubeApi) -> str:
    """``v1`` or ``v1beta2``: the newest ``resource.k8s.io`` version the server serves."""
    try:
        group = api.get(f"/apis/{GROUP}")
    except NotFoundError:
        group = {}
    served = {
        str(v.get("version"))
        for v in group.get("versions") or []
        if isinstance(v, dict) and v.get("version")
    }
    for version in VERSIONS:
        if version in served:
            return version
    raise DraUnsupportedError(
        f"the API server serves no {GROUP} v1 or v1beta2 (it serves "
        f"{', '.join(sorted(served)) or 'none'}): publishing vGPUs through Dynamic Resource "
        "Allocation needs Kubernetes 1.33 or later (1.34 or later for v1)"
    )


@dataclass(frozen=True)
class PublishResult:
    generation: int
    created: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.created or self.replaced or self.deleted)


class SlicePublisher:
    """Publishes one node's pool of ResourceSlices and keeps it current."""

    def __init__(
        self,
        api: KubeApi,
        node: str,
        *,
        driver: str = DRIVER,
        version: str | None = None,
    ) -> None:
        self.api = api
        self.node = node
        self.driver = driver
        self.version = version or resource_api_version(api)
        self._lock = threading.Lock()
        self._pool: SlicePool | None = None
        self._owner: dict[str, Any] | None = None
        self._generation = 0

    # reading ------------------------------------------------------------------
    def current(self) -> list[dict[str, Any]]:
        """This node's slices of our driver, as the API server has them now."""
        selector = f"spec.nodeName={self.node},spec.driver={self.driver}"
        items = self.api.list(self._path(), field_selector=selector)
        # The field selector is the server's job; filter again so a lax server is harmless.
        return [
            i
            for i in items
            if (i.get("spec") or {}).get("nodeName") == self.node
            and (i.get("spec") or {}).get("driver") == self.driver
        ]

    def _node_owner(self) -> dict[str, Any] | None:
        """The Node as controller owner, so deleting the Node garbage-collects its slices."""
        if self._owner is None:
            try:
                node = read_node(self.api, self.node)
            except ClusterError as e:
                log.warning("node %s not readable (%s); slices get no owner", self.node, e)
                return None
            uid = (node.get("metadata") or {}).get("uid")
            if not uid:
                return None
            self._owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": uid,
                "controller": True,
            }
        return self._owner

    # writing ------------------------------------------------------------------
    def publish(self, pool: SlicePool) -> PublishResult:
        """Make the node's slices equal ``pool``; bump the generation when anything differs."""
        if pool.node != self.node or pool.driver != self.driver:
            raise ValueError(f"pool {pool.driver}/{pool.node} is not this publisher's")
        with self._lock:
            self._pool = pool
            return self._publish(pool)

    def sync(self) -> PublishResult | None:
        """Publish the last pool again: recreates slices that were deleted meanwhile."""
        with self._lock:
            return self._publish(self._pool) if self._pool is not None else None

    def _publish(self, pool: SlicePool) -> PublishResult:
        existing = {i["metadata"]["name"]: i for i in self.current()}
        generations = [
            int(((i.get("spec") or {}).get("pool") or {}).get("generation") or 0)
            for i in existing.values()
        ]
        # Never go back: after a wipe the pool continues from the generation we last wrote.
        top = max([*generations, self._generation])
        want = {m["metadata"]["name"]: m for m in pool.manifests(top, self.version)}
        for m in want.values():
            m["metadata"]["annotations"] = {CONTENT_ANNOTATION: _content(m["spec"])}
        same = set(want) == set(existing) and all(
            _annotation(existing[n]) == want[n]["metadata"]["annotations"][CONTENT_ANNOTATION]
            for n in want
        )
        if same:
            self._generation = top
            return PublishResult(generation=top)
        generation = self._generation = top + 1
        owner = self._node_owner()
        deleted: list[str] = []
        replaced: list[str] = []
        created: list[str] = []
        for name in sorted(set(existing) - set(want)):
            self._write("delete", name)
            deleted.append(name)
        for name, manifest in sorted(want.items()):
            manifest["spec"]["pool"]["generation"] = generation
            if owner is not None:
                manifest["metadata"]["ownerReferences"] = [owner]
            if name in existing:
                version = existing[name]["metadata"].get("resourceVersion")
                manifest["metadata"]["resourceVersion"] = version
                self._write("replace", name, manifest)
                replaced.append(name)
            else:
                self._write("create", name, manifest)
                created.append(name)
        log.info(
            "ResourceSlices of %s at generation %d: %d created, %d replaced, %d deleted",
            self.node,
            generation,
            len(created),
            len(replaced),
            len(deleted),
        )
        return PublishResult(generation, tuple(created), tuple(replaced), tuple(deleted))

    def _path(self, name: str | None = None) -> str:
        return path_of(GROUP, self.version, SLICES, name)

    def _write(self, verb: str, name: str, body: dict[str, Any] | None = None) -> None:
        if verb == "delete":
            with contextlib.suppress(NotFoundError):  # gone already: what a delete wants
                self.api.delete(self._path(name))
        elif verb == "replace":
            self.api.replace(self._path(name), body or {})
        else:
            self.api.create(self._path(), body or {})

    def remove_all(self) -> tuple[str, ...]:
        """Delete every slice of this node and driver (an uninstall); their names."""
        with self._lock:
            self._pool = None
            names = sorted(i["metadata"]["name"] for i in self.current())
            for name in names:
                self._write("delete", name)
            log.info("deleted %d ResourceSlices of %s", len(names), self.node)
            return tuple(names)


def remove_driver_slices(
    api: KubeApi, node: str | None = None, *, driver: str = DRIVER, version: str | None = None
) -> tuple[str, ...]:
    """Delete the driver's ResourceSlices (of ``node``, or of every node); their names.

    A fresh list afterwards must show none left, or this raises: the caller's
    "removed" is then a fact, not a hope.
    """
    version = version or resource_api_version(api)
    path = path_of(GROUP, version, SLICES)
    selector = f"spec.driver={driver}" + (f",spec.nodeName={node}" if node else "")

    def ours() -> list[str]:
        items = api.list(path, field_selector=selector)
        return sorted(
            i["metadata"]["name"]
            for i in items
            if (i.get("spec") or {}).get("driver") == driver
            and (node is None or (i.get("spec") or {}).get("nodeName") == node)
        )

    names = ours()
    for name in names:
        with contextlib.suppress(NotFoundError):
            api.delete(path_of(GROUP, version, SLICES, name))
    left = ours()
    if left:
        raise ClusterError(
            f"ResourceSlices of driver {driver} still present after deleting them: "
            + ", ".join(left)
        )
    log.info("deleted %d ResourceSlices of driver %s", len(names), driver)
    return tuple(names)


def _content(spec: dict[str, Any]) -> str:
    """A digest of a slice spec apart from the pool generation (which is ours to bump)."""
    plain = {**spec, "pool": {**spec["pool"], "generation": 0}}
    blob = json.dumps(plain, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()[:32]


def _annotation(obj: dict[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(CONTENT_ANNOTATION)


class SliceResync(BackgroundLoop):
    """Runs :meth:`SlicePublisher.sync` every ``interval`` seconds and on :meth:`wake`."""

    def __init__(self, publisher: SlicePublisher, interval: float = 10.0) -> None:
        super().__init__("dra-slice-resync", first=interval)
        self.publisher = publisher
        self.interval = interval

    def step(self) -> float:
        try:
            self.publisher.sync()
        except Exception as e:  # keep resyncing; the next round may reach the server
            log.warning("ResourceSlice resync failed: %s", e)
        return self.interval


class KubeClaims:
    """Reads ResourceClaims from the API server (a :class:`~vgpu_state.dra.claims.ClaimSource`)."""

    def __init__(self, api: KubeApi, version: str | None = None) -> None:
        self.api = api
        self.version = version or resource_api_version(api)

    def get_claim(self, namespace: str, name: str) -> Claim | None:
        try:
            obj = self.api.get(path_of(GROUP, self.version, CLAIMS, name, namespace))
        except NotFoundError:
            return None
        return Claim.from_api(obj)

    def list_claims(self) -> list[Claim]:
        return [Claim.from_api(i) for i in self.api.list(path_of(GROUP, self.version, CLAIMS))]


def claims_in_use(claims: KubeClaims, node: str, driver: str = DRIVER) -> dict[str, str]:
    """vGPU key -> holder for every claim allocated a device of ``driver`` in ``node``'s pool."""
    return claim_holders(claims.list_claims(), driver, node)
