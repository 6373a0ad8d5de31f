"""A Kubernetes API server for tests: kmock's ``KubernetesEmulator``, extended, in a thread.

The base of every fake API server in ``tests/``: :class:`RunningApiServer` owns
the thread, the event loop, the port and the access from the test thread;
``tests/dra_apiserver.py`` serves the ``resource.k8s.io`` versions a test asks
for on it, ``tests/kube_emulator.py`` adds the watch semantics of the real one.

kmock serves real HTTP and the official ``kubernetes`` client talks to it, but
its emulator stores objects as plain dicts merged on PATCH and knows nothing of
resource versions. Where it falls short of the real API server, :class:`ApiServer`
adds what vgpu-state relies on (every extension below is a test-only stand-in
for documented API-server behaviour):

* ``metadata.resourceVersion`` (one counter for all objects, as etcd's revision),
  ``uid``, ``generation`` (bumped when anything but metadata and status
  changes) and ``creationTimestamp``;
* ``PUT`` (replace) with an optimistic-concurrency check: a stale
  ``resourceVersion`` is ``409 Conflict``; ``POST`` of an existing name is
  ``409 AlreadyExists``;
* ``PATCH`` by content type: JSON Patch (RFC 6902) where a failed ``test`` op
  (or a path that does not exist) is ``422 Invalid``; JSON merge patch (RFC 7386)
  and strategic merge patch (treated as a merge patch: the objects patched here
  have no merge-keyed lists); a ``resourceVersion`` in the patched result that
  differs from the stored one is ``409 Conflict``;
* the ``status`` subresource for the resources listed in ``status_subresource``:
  writes to the main resource keep the stored status, writes to ``/status``
  change only the status, and ``POST`` drops the status;
* the API server's limit on an object's annotations (256 KiB for all keys and
  values together): a write over it is ``422 Invalid``;
* per-resource validators (schema checks): a write that fails one is refused
  with ``422 Invalid`` and remembered in :attr:`ApiServer.rejected`, so a test
  also fails when the code under test ever sends an invalid object;
* API group discovery at ``/apis/<group>/`` (the official client's path, with
  its trailing slash);
* lists honour ``fieldSelector`` terms (``field=value`` or ``field==value``, such
  as ``metadata.name``, ``spec.nodeName`` or ``spec.driver``);
* paged lists (``limit`` and ``continue``): with a ``limit`` the items come in
  key order (namespace, name, as etcd stores them), at most ``limit`` of them,
  with ``metadata.continue`` (an opaque token) and ``remainingItemCount`` when
  more remain; a token the server did not issue is ``400 Bad Request``.
  Without a ``limit``, kmock's list: every item, in the order stored.

GET, LIST, WATCH and DELETE are kmock's own.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import itertools
import json
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, Self

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import jsonschema  # type: ignore[import-untyped]
from kmock import KubernetesEmulator, KubernetesError, ResourceInfo, Server, resource

REFERENCE = Path("/work/shared/reference/kubevirt-cr.openapi.json")
REPO = Path(__file__).resolve().parent.parent

Validator = Callable[[dict[str, Any]], None]

KUBEVIRT = "kubevirt.io/v1/kubevirts"
NODES = "v1/nodes"
EVENTS = "v1/events"
LEASES = "coordination.k8s.io/v1/leases"
NODESTATES = "vgpu-state.io/v1alpha1/vgpunodestates"


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _invalid(message: str) -> KubernetesError:
    return KubernetesError(status=422, reason="Invalid", message=message, details={})


def _conflict(message: str, reason: str = "Conflict") -> KubernetesError:
    return KubernetesError(status=409, reason=reason, message=message, details={})


def _not_found(what: str) -> KubernetesError:
    return KubernetesError(status=404, reason="NotFound", message=f"{what} not found", details={})


@attrs.define(kw_only=True)
class ApiServer(KubernetesEmulator):
    """The emulator with resource versions, conflicts, patches, status and validation."""

    status_subresource: set[str] = attrs.field(factory=set)
    validators: dict[str, Validator] = attrs.field(factory=dict)
    counts: Counter[str] = attrs.field(factory=Counter)
    rejected: list[str] = attrs.field(factory=list)
    keep_requests: bool = True
    """False: forget each request once served. kmock matches every request against
    all requests served so far, so a long benchmark's server slows down with the
    square of its requests; a real API server does not."""
    _revision: Any = attrs.field(factory=lambda: itertools.count(1))

    @staticmethod
    def key(res: resource) -> str:
        return f"{res.group}/{res.version}/{res.plural}".lstrip("/")

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        if str(request.method.value).upper() == "GET" and re.fullmatch(
            r"/apis/[^/]+/", request.url.path
        ):
            # The official client asks for API groups with a trailing slash.
            return aiohttp.web.json_response(await self._serve_group(request))
        try:
            return await self._serve(request)
        finally:
            if not self.keep_requests:
                served = self._requests
                index = next((i for i, r in enumerate(served) if r is request), None)
                if index is not None:
                    del served[index]

    async def _serve(self, request: Any) -> aiohttp.web.StreamResponse:
        method = str(request.method.value).upper()
        if request.resource is None or method not in ("POST", "PUT", "PATCH"):
            return await super()._handle(request)
        async with self._lock:
            try:
                status, obj, event = self._write(request, method)
            except KubernetesError as e:
                self.counts[str(e.status)] += 1
                raise
            self.counts[method] += 1
            await self._buses[request.resource].put({"type": event, "object": copy.deepcopy(obj)})
        return aiohttp.web.json_response(obj, status=status)

    async def _serve_list(self, request: Any) -> Any:
        body: dict[str, Any] = await super()._serve_list(request)  # type: ignore[assignment]
        params = request.params or {}
        selector = params.get("fieldSelector") or ""
        if selector:
            body = {**body, "items": [i for i in body["items"] if field_selected(i, selector)]}
        if not params.get("limit"):
            return body
        try:
            limit = int(params["limit"])
            token = params.get("continue") or ""
            after = json.loads(base64.urlsafe_b64decode(token)) if token else None
        except ValueError as e:
            raise KubernetesError(
                status=400, reason="BadRequest", message=f"invalid limit or continue: {e}"
            ) from None
        items = sorted(body["items"], key=_list_key)
        if after is not None:
            items = [i for i in items if list(_list_key(i)) > after]
        page, rest = items[:limit], items[limit:]
        meta = dict(body.get("metadata") or {})
        if rest and page:
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps(list(_list_key(page[-1]))).encode()
            ).decode()
            meta["remainingItemCount"] = len(rest)
        self.counts["LIST_PAGE"] += 1
        return {**body, "metadata": meta, "items": page}

    # writes ----------------------------------------------------------------------
    def _write(self, request: Any, method: str) -> tuple[int, dict[str, Any], str]:
        res = request.resource
        kind = self.key(res)
        if method == "POST":
            body = request.data if isinstance(request.data, dict) else {}
            meta = body.setdefault("metadata", {})
            name = meta.get("name")
            if not name and meta.get("generateName"):
                name = meta["generateName"] + uuid.uuid4().hex[:5]
            if not name:
                raise _invalid("metadata.name: Required value")
            key = (res, request.namespace, name)
            if key in self._objects and not self._objects[key].deleted:
                raise _conflict(f'{res.plural} "{name}" already exists', "AlreadyExists")
            meta.update(
                name=name,
                uid=str(uuid.uuid4()),
                generation=1,
                creationTimestamp=_now(),
                resourceVersion=str(next(self._revision)),
            )
            if request.namespace:
                meta["namespace"] = request.namespace
            if kind in self.status_subresource:
                body.pop("status", None)
            _check_annotations(body)
            self._validate(kind, body)
            if key in self._objects:
                self._objects[key].create(body)
            else:
                self._objects[key] = body
            return 201, body, "ADDED"

        key = (res, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            raise _not_found(f'{res.plural} "{request.name}"')
        current: dict[str, Any] = copy.deepcopy(self._objects[key].raw)
        stored_rv = current.get("metadata", {}).get("resourceVersion")
        if method == "PUT":
            proposed = request.data if isinstance(request.data, dict) else {}
        else:
            proposed = self._patched(request, current)
        sent_rv = (proposed.get("metadata") or {}).get("resourceVersion")
        if sent_rv is not None and sent_rv != stored_rv:
            raise _conflict(
                f'Operation cannot be fulfilled on {res.plural} "{request.name}": the object '
                "has been modified; please apply your changes to the latest version and try again"
            )
        new = self._merge_subresource(kind, request.subresource, current, proposed)
        meta = new.setdefault("metadata", {})
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            if fixed in current.get("metadata", {}):
                meta[fixed] = current["metadata"][fixed]
        if _spec_part(new) != _spec_part(current):
            meta["generation"] = int(meta.get("generation", 1)) + 1
        meta["resourceVersion"] = str(next(self._revision))
        _check_annotations(new)
        self._validate(kind, new)
        self._objects[key].history.append(new)
        return 200, new, "MODIFIED"

    def _patched(self, request: Any, current: dict[str, Any]) -> dict[str, Any]:
        content_type = str(request.headers.get("Content-Type", "")).split(";")[0].strip()
        if content_type == "application/json-patch+json":
            if not isinstance(request.data, list):
                raise _invalid("a JSON Patch must be a list of operations")
            try:
                result = jsonpatch.JsonPatch(request.data).apply(current)
            except jsonpatch.JsonPatchTestFailed as e:
                raise _invalid(f"the test operation of the JSON Patch failed: {e}") from e
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                raise _invalid(f"the JSON Patch cannot be applied: {e}") from e
            self.counts["json-patch"] += 1
            return dict(result)
        if content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            if not isinstance(request.data, dict):
                raise _invalid("a merge patch must be a JSON object")
            return dict(merge_patch(current, request.data))
        raise KubernetesError(
            status=415, reason="UnsupportedMediaType", message=content_type, details={}
        )

    def _merge_subresource(
        self, kind: str, sub: str | None, current: dict[str, Any], proposed: dict[str, Any]
    ) -> dict[str, Any]:
        if kind not in self.status_subresource:
            return copy.deepcopy(proposed)
        if sub == "status":
            new = copy.deepcopy(current)
            if "status" in proposed:
                new["status"] = copy.deepcopy(proposed["status"])
            else:
                new.pop("status", None)
            if "metadata" in proposed:
                new["metadata"]["resourceVersion"] = proposed["metadata"].get("resourceVersion")
            return new
        new = copy.deepcopy(proposed)
        if "status" in current:
            new["status"] = copy.deepcopy(current["status"])
        else:
            new.pop("status", None)
        return new

    def _validate(self, kind: str, obj: dict[str, Any]) -> None:
        check = self.validators.get(kind)
        if check is None:
            return
        try:
            check(obj)
        except (ValueError, jsonschema.ValidationError) as e:
            text = getattr(e, "message", str(e))
            where = "/".join(str(p) for p in getattr(e, "absolute_path", ()))
            self.rejected.append(f"{kind}: {where}: {text}")
            raise _invalid(f"{kind} is invalid: {where}: {text}") from e


ANNOTATIONS_LIMIT = 256 * 1024


def field_selected(obj: dict[str, Any], selector: str) -> bool:
    """Whether ``obj`` matches every ``field=value`` (or ``field==value``) term."""
    for term in filter(None, selector.split(",")):
        path, _, value = term.partition("=")
        found: Any = obj
        for part in path.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if str(found or "") != value.removeprefix("="):
            return False
    return True


def _list_key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _check_annotations(obj: dict[str, Any]) -> None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    size = sum(len(k) + len(str(v)) for k, v in annotations.items())
    if size > ANNOTATIONS_LIMIT:
        raise _invalid(
            f"metadata.annotations: Too long: must have at most {ANNOTATIONS_LIMIT} bytes"
        )


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


# schema validators ----------------------------------------------------------------
def kubevirt_validator(path: Path = REFERENCE) -> Validator:
    """The KubeVirt CR checked against KubeVirt's own OpenAPI (swagger 2.0) definitions.

    Unknown fields are refused (``additionalProperties: false`` is added to every
    object definition that lists its properties), as the API server's strict
    field validation does, so a misspelt field name fails the test.
    """
    doc = json.loads(path.read_text())
    definitions = copy.deepcopy(doc["definitions"])
    for d in definitions.values():
        if d.get("type") == "object" and "properties" in d and "additionalProperties" not in d:
            d["additionalProperties"] = False
    schema = {"$ref": "#/definitions/v1.KubeVirt", "definitions": definitions}
    validator = jsonschema.Draft4Validator(schema)

    def check(obj: dict[str, Any]) -> None:
        error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
        if error is not None:
            raise error

    return check


def crd_validator(crd: dict[str, Any]) -> Validator:
    """An object checked against the ``openAPIV3Schema`` of a CRD's served version."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(_strip_k8s_keys(schema))

    def check(obj: dict[str, Any]) -> None:
        body = {k: v for k, v in obj.items() if k != "metadata"}
        error = jsonschema.exceptions.best_match(validator.iter_errors(body))
        if error is not None:
            raise error

    return check


def _strip_k8s_keys(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strip_k8s_keys(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
        if out.get("type") == "object" and "properties" in out and "metadata" in out["properties"]:
            out["properties"] = {k: v for k, v in out["properties"].items() if k != "metadata"}
        return out
    if isinstance(schema, list):
        return [_strip_k8s_keys(v) for v in schema]
    return schema


# running it -------------------------------------------------------------------------
class RunningApiServer:
    """An :class:`ApiServer` serving HTTP on 127.0.0.1 from its own event-loop thread.

    :meth:`configure` says which resources it serves (and their status
    subresources and validators); a subclass serves others.
    """

    def __init__(
        self, server_cls: type[ApiServer] | None = None, *, keep_requests: bool = True
    ) -> None:
        self._server_cls = server_cls or ApiServer
        self._keep_requests = keep_requests
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self.server: ApiServer | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, name="apiserver", daemon=True)

    def configure(self, server: ApiServer) -> None:
        """Nodes, Events, Leases, the KubeVirt CR (validated) and VGPUNodeStates."""
        for kind, info in {
            NODES: ResourceInfo(kind="Node", namespaced=False),
            EVENTS: ResourceInfo(kind="Event", namespaced=True),
            LEASES: ResourceInfo(kind="Lease", namespaced=True),
            KUBEVIRT: ResourceInfo(kind="KubeVirt", namespaced=True),
            NODESTATES: ResourceInfo(
                kind="VGPUNodeState", namespaced=False, subresources={"status"}
            ),
        }.items():
            server.resources[kind] = info
        server.status_subresource.update({KUBEVIRT, NODESTATES})
        server.validators[KUBEVIRT] = kubevirt_validator()

    def start(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the test API server did not start within 10 s")
        if self._failure is not None:
            raise RuntimeError(f"the test API server failed to start: {self._failure!r}")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as e:
            self._failure = e
            self._ready.set()
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self.server = self._server_cls()
        self.server.keep_requests = self._keep_requests
        self.configure(self.server)
        async with self.server, Server(self.server) as http:
            self.url = str(http.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    # access from the test thread --------------------------------------------------
    def _call(self, fn: Callable[[ApiServer], Any]) -> Any:
        server = self.server
        assert server is not None

        async def run() -> Any:
            async with server._lock:
                return fn(server)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def put(
        self, kind: str, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Store an object as an admin (or another client) would, with metadata filled in;
        the object stored."""

        def store(server: ApiServer) -> dict[str, Any]:
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            meta["name"] = name
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta.setdefault("generation", 1)
            meta["resourceVersion"] = str(next(server._revision))
            if namespace:
                meta["namespace"] = namespace
            key = (resource(kind), namespace, name)
            if key not in server.objects:
                server.objects[key] = obj
            elif server.objects[key].deleted:
                server.objects[key].create(obj)
            else:
                server.objects[key].history.append(obj)
            return obj

        result: dict[str, Any] = self._call(store)
        return result

    def put_object(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """:meth:`put` with the name and namespace the object's metadata gives."""
        meta = body.get("metadata") or {}
        return self.put(kind, meta["name"], body, meta.get("namespace"))

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete an object as another client would (the kubelet wiping slices)."""
        self._call(lambda server: server.objects[(resource(kind), namespace, name)].delete())

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        def read(server: ApiServer) -> dict[str, Any] | None:
            key = (resource(kind), namespace, name)
            if key not in server.objects or server.objects[key].deleted:
                return None
            return copy.deepcopy(server.objects[key].raw)

        result: dict[str, Any] | None = self._call(read)
        return result

    def all(self, kind: str) -> list[dict[str, Any]]:
        def read(server: ApiServer) -> list[dict[str, Any]]:
            want = resource(kind)
            return [
                copy.deepcopy(obj.raw)
                for (res, _, _), obj in server.objects.items()
                if res == want and not obj.deleted
            ]

        result: list[dict[str, Any]] = self._call(read)
        return result

    def history(self, kind: str, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        def read(server: ApiServer) -> list[dict[str, Any]]:
            key = (resource(kind), namespace, name)
            if key not in server.objects:
                return []
            return [copy.deepcopy(v.raw) for v in server.objects[key].history if v is not None]

        result: list[dict[str, Any]] = self._call(read)
        return result

    @property
    def counts(self) -> Counter[str]:
        assert self.server is not None
        return self.server.counts

    @property
    def rejected(self) -> list[str]:
        assert self.server is not None
        return self.server.rejected

    def set_validator(self, kind: str, check: Validator) -> None:
        assert self.server is not None
        self.server.validators[kind] = check

    def api_client(self) -> Any:
        """The product's transport to this server."""
        from vgpu_state.kube.transport import Endpoint, Transport

        return Transport(Endpoint(server=self.url))

    def kube_api(self) -> Any:
        """The product's :class:`~vgpu_state.kube.api.KubeApi` for this server."""
        from vgpu_state.kube.api import KubeApi

        return KubeApi(self.api_client(), self.url, (5.0, 10.0))

    def write_kubeconfig(self, path: Path, server: str | None = None) -> Path:
        """A kubeconfig for this server (or for ``server``, e.g. a closed port)."""
        return write_kubeconfig(path, server or self.url)


class Stores(Protocol):
    """What this server and the real one (``tests/realcluster.py``) both offer a test."""

    def put(
        self, kind: str, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]: ...


def kubevirt_cr(
    *,
    permitted: list[dict[str, Any]] | None = None,
    mdev_types: list[str] | None = None,
    gates: tuple[str, ...] = ("DisableMDEVConfiguration",),
) -> dict[str, Any]:
    """A KubeVirt CR; by default with KubeVirt's own mdev handling off (its feature gate).

    ``permitted``: the ``permittedHostDevices.mediatedDevices`` entries;
    ``mdev_types``: the ``mediatedDevicesConfiguration`` KubeVirt would create.
    """
    configuration: dict[str, Any] = {}
    if mdev_types is not None:
        configuration["mediatedDevicesConfiguration"] = {"mediatedDeviceTypes": mdev_types}
    if permitted is not None:
        configuration["permittedHostDevices"] = {"mediatedDevices": permitted}
    configuration["developerConfiguration"] = {"featureGates": list(gates)}
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "spec": {"configuration": configuration},
    }


def put_kubevirt(
    api: Stores,
    *,
    permitted: list[dict[str, Any]] | None = None,
    mdev_types: list[str] | None = None,
    gates: tuple[str, ...] = ("DisableMDEVConfiguration",),
) -> None:
    """Store ``kubevirt/kubevirt`` (:func:`kubevirt_cr`) as an admin would."""
    cr = kubevirt_cr(permitted=permitted, mdev_types=mdev_types, gates=gates)
    api.put(KUBEVIRT, "kubevirt", cr, namespace="kubevirt")


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig file for the API server at ``server``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    }
    path.write_text(json.dumps(config))
    return path


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def running_apiserver() -> Iterator[RunningApiServer]:
    """Start a server, yield it, stop it; fails the test if it refused an invalid write."""
    api = RunningApiServer().start()
    try:
        yield api
    finally:
        api.stop()


def main() -> None:
    """``python -m tests.apiserver``: serve until standard input closes; print the URL first.

    Benchmarks run the server in its own process so that the client threads
    under test do not compete with it for the interpreter.
    """
    import sys

    api = RunningApiServer(keep_requests=False).start()
    print(api.url, flush=True)
    try:
        sys.stdin.read()
    finally:
        api.stop()


if __name__ == "__main__":
    main()
