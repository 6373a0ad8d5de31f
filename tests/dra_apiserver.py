"""kmock's KubernetesEmulator with the ``resource.k8s.io`` semantics the DRA code relies on.

kmock serves real HTTP to the official ``kubernetes`` client and stores objects,
but it knows nothing of DRA and treats writes as dict merges. Each extension
here is a test-only stand-in for documented API-server behaviour:

* API group discovery answers ``/apis/<group>/`` (the official client's path);
* ``POST`` fills ``metadata.uid``, ``resourceVersion`` and ``generation``, and
  refuses an existing name with ``409 AlreadyExists``;
* ``PUT`` replaces the whole object (kmock has no replace), ``404`` when absent,
  ``409 Conflict`` on a stale ``resourceVersion``;
* ``LIST`` honours the ``fieldSelector`` terms ``spec.nodeName`` and
  ``spec.driver`` (ResourceSlice's selectable fields);
* ResourceSlices are validated as the API server does (name and driver rules,
  exactly one node selection, pool fields, at most 128 devices, device names
  DNS labels and unique, at most 32 attributes plus capacities, qualified
  attribute names, one typed value each, strings at most 64 characters); a
  refused write is ``422 Invalid`` and recorded in :attr:`DraApiServer.rejected`.

:class:`RunningDraApiServer` runs it on 127.0.0.1 in its own event-loop thread.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp.web
import attrs
from kmock import KubernetesEmulator, KubernetesError, ResourceInfo, Server, resource

NODES = "v1/nodes"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")


def slices(version: str) -> str:
    return f"resource.k8s.io/{version}/resourceslices"


def claims(version: str) -> str:
    return f"resource.k8s.io/{version}/resourceclaims"


def _invalid(message: str) -> KubernetesError:
    return KubernetesError(status=422, reason="Invalid", message=message, details={})


def _conflict(message: str, reason: str = "Conflict") -> KubernetesError:
    return KubernetesError(status=409, reason=reason, message=message, details={})


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


@attrs.define(kw_only=True)
class DraApiServer(KubernetesEmulator):
    rejected: list[str] = attrs.field(factory=list)
    writes: list[tuple[str, str]] = attrs.field(factory=list)
    _revision: Iterator[int] = attrs.field(factory=lambda: itertools.count(1))

    @staticmethod
    def kind(res: Any) -> str:
        return f"{res.group}/{res.version}/{res.plural}".lstrip("/")

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        res = request.resource
        method = str(request.method.value).upper()
        if method == "GET" and re.fullmatch(r"/apis/[^/]+/", request.url.path):
            # The official client asks for API groups with a trailing slash.
            return aiohttp.web.json_response(await self._serve_group(request))
        if res is not None and method == "POST" and request.name is None:
            async with self._lock:
                obj = self._create(request)
                await self._buses[res].put({"type": "ADDED", "object": copy.deepcopy(obj)})
            return aiohttp.web.json_response(obj, status=201)
        if res is not None and method == "PUT" and request.name is not None:
            async with self._lock:
                obj = self._replace(request)
                await self._buses[res].put({"type": "MODIFIED", "object": copy.deepcopy(obj)})
            return aiohttp.web.json_response(obj)
        if (
            res is not None
            and method == "GET"
            and request.name is None
            and request.params.get("fieldSelector")
            and request.params.get("watch") not in ("true", "1")
        ):
            return aiohttp.web.json_response(self._list_selected(request))
        if res is not None and method == "DELETE":
            self.writes.append(("DELETE", request.name or ""))
        return await super()._handle(request)

    def _check(self, kind: str, obj: dict[str, Any]) -> None:
        if kind.endswith("/resourceslices"):
            bad = slice_problems(obj)
            if bad:
                self.rejected.extend(bad)
                raise _invalid("; ".join(bad))

    def _create(self, request: Any) -> dict[str, Any]:
        res = request.resource
        body = copy.deepcopy(request.data) if isinstance(request.data, dict) else {}
        meta = body.setdefault("metadata", {})
        name = meta.get("name") or (meta.get("generateName", "") + uuid.uuid4().hex[:5])
        key = (res, request.namespace, name)
        if key in self._objects and not self._objects[key].deleted:
            raise _conflict(f'{res.plural} "{name}" already exists', "AlreadyExists")
        meta.update(
            name=name,
            uid=str(uuid.uuid4()),
            generation=1,
            resourceVersion=str(next(self._revision)),
        )
        if request.namespace:
            meta["namespace"] = request.namespace
        self._check(self.kind(res), body)
        if key in self._objects:
            self._objects[key].create(body)
        else:
            self._objects[key] = body
        self.writes.append(("POST", name))
        return body

    def _replace(self, request: Any) -> dict[str, Any]:
        res = request.resource
        key = (res, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            raise KubernetesError(status=404, reason="NotFound", message="not found", details={})
        stored = self._objects[key].raw
        body: dict[str, Any] = copy.deepcopy(request.data)
        meta = body.setdefault("metadata", {})
        sent = meta.get("resourceVersion")
        if sent and sent != stored["metadata"]["resourceVersion"]:
            raise _conflict(f"{request.name}: resourceVersion {sent} is stale")
        meta.update(
            name=request.name,
            uid=stored["metadata"]["uid"],
            generation=stored["metadata"].get("generation", 1) + 1,
            resourceVersion=str(next(self._revision)),
        )
        self._check(self.kind(res), body)
        self._objects[key].history.append(body)
        self.writes.append(("PUT", request.name))
        return body

    def _list_selected(self, request: Any) -> dict[str, Any]:
        terms = dict(t.split("=", 1) for t in request.params["fieldSelector"].split(","))
        items = []
        for (res, namespace, _), obj in self._objects.items():
            if res != request.resource or obj.deleted:
                continue
            if request.namespace and namespace != request.namespace:
                continue
            raw = obj.raw
            spec = raw.get("spec") or {}
            if all(spec.get(k.removeprefix("spec.")) == v for k, v in terms.items()):
                items.append(raw)
        return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}


class RunningDraApiServer:
    """A :class:`DraApiServer` on 127.0.0.1, serving the given ``resource.k8s.io`` versions."""

    def __init__(self, versions: tuple[str, ...] = ("v1",)) -> None:
        self.versions = versions
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.server: DraApiServer | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, name="dra-apiserver", daemon=True)

    def start(self) -> RunningDraApiServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the test API server did not start within 10 s")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self.server = DraApiServer()
        self.server.resources[NODES] = ResourceInfo(kind="Node", namespaced=False)
        for v in self.versions:
            self.server.resources[slices(v)] = ResourceInfo(kind="ResourceSlice", namespaced=False)
            self.server.resources[claims(v)] = ResourceInfo(kind="ResourceClaim", namespaced=True)
        async with self.server, Server(self.server) as http:
            self.url = str(http.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    # access from the test thread ------------------------------------------------
    def _call(self, fn: Any) -> Any:
        server = self.server
        assert server is not None

        async def run() -> Any:
            async with server._lock:
                return fn(server)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def put(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """Store an object as another client (the scheduler, kubectl) would."""

        def store(server: DraApiServer) -> dict[str, Any]:
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("generation", 1)
            meta["resourceVersion"] = str(next(server._revision))
            key = (resource(kind), meta.get("namespace"), meta["name"])
            if key in server.objects and not server.objects[key].deleted:
                server.objects[key].history.append(obj)
            elif key in server.objects:
                server.objects[key].create(obj)
            else:
                server.objects[key] = obj
            return obj

        return self._call(store)  # type: ignore[no-any-return]

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete an object as another client would (the kubelet wiping slices)."""

        def drop(server: DraApiServer) -> None:
            server.objects[(resource(kind), namespace, name)].delete()

        self._call(drop)

    def list(self, kind: str) -> list[dict[str, Any]]:
        def read(server: DraApiServer) -> list[dict[str, Any]]:
            return [
                copy.deepcopy(o.raw)
                for (res, _, _), o in server.objects.items()
                if res == resource(kind) and not o.deleted
            ]

        return self._call(read)  # type: ignore[no-any-return]
