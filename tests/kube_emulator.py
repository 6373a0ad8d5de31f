"""kmock's KubernetesEmulator, run in a thread for synchronous code, with resource versions.

The stock emulator keeps objects and serves lists and watches, but gives
objects no ``resourceVersion``, ignores it on writes and watches, and never
ends a watch. The API server does all of that, and a correct watcher or lease
depends on it, so :class:`VersionedEmulator` adds:

* a cluster-wide counter stamped into ``metadata.resourceVersion`` on every
  write, and served as the list's ``resourceVersion``;
* ``PUT`` (replace), which kmock lacks;
* optimistic concurrency: a write that carries a ``resourceVersion`` other
  than the stored one gets 409 Conflict;
* watches that start after the requested ``resourceVersion`` (no replay of
  what the client has seen), and 410 Gone for a version older than
  :attr:`compacted_below` (see :meth:`VersionedEmulator.compact`);
* :meth:`RunningEmulator.end_watches`, which ends every open watch stream the
  way an API server does at its watch timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import attrs
import kmock
from kmock._internal import enums, k8s, rendering

T = TypeVar("T")


@attrs.define(kw_only=True)
class VersionedEmulator(kmock.KubernetesEmulator):
    compacted_below: int = 0
    _counter: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _latest: int = attrs.field(default=0, init=False)
    _generation: int = attrs.field(default=0, init=False)
    _watch_generation: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def next_version(self) -> str:
        self._latest = next(self._counter)
        return str(self._latest)

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is not None and request.name and request.method == enums.method.PUT:
            return await self._replace(request)
        if request.resource is not None and request.action in (
            enums.action.CREATE,
            enums.action.UPDATE,
        ):
            data = request.data if isinstance(request.data, dict) else None
            if data is not None:
                meta = data.setdefault("metadata", {})
                sent = meta.get("resourceVersion")
                if request.action == enums.action.UPDATE and sent:
                    key = (request.resource, request.namespace, request.name)
                    if key in self.objects and not self.objects[key].deleted:
                        stored = self.objects[key].get("metadata", {}).get("resourceVersion")
                        if stored is not None and stored != sent:
                            raise k8s.KubernetesError(
                                status=409,
                                reason="Conflict",
                                message=f"the object has been modified (sent {sent}, is {stored})",
                            )
                meta["resourceVersion"] = self.next_version()
        return await super()._handle(request)

    async def _replace(self, request: rendering.Request) -> Any:
        """PUT: replace the whole object, guarded by its resourceVersion (kmock has no PUT)."""
        import aiohttp.web

        assert request.resource is not None and request.name is not None
        key = (request.resource, request.namespace, request.name)
        body = request.data if isinstance(request.data, dict) else {}
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                raise k8s.KubernetesObjectNotFoundError()
            current = dict(self.objects[key].raw)
            stored = current.get("metadata", {}).get("resourceVersion")
            sent = body.get("metadata", {}).get("resourceVersion")
            if sent and stored is not None and sent != stored:
                raise k8s.KubernetesError(
                    status=409,
                    reason="Conflict",
                    message=f"the object has been modified (sent {sent}, is {stored})",
                )
            body.setdefault("metadata", {})["resourceVersion"] = self.next_version()
            self.objects[key].patch(_merge_patch_from(current, body))
            raw = self.objects[key].raw
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(dict(raw))

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        result = await super()._serve_list(request)
        assert isinstance(result, dict)
        result["metadata"] = {"resourceVersion": str(self._latest)}
        result["items"] = [
            item
            for item in result["items"]
            if self._selected(
                request,
                item.get("metadata", {}).get("namespace"),
                item.get("metadata", {}).get("name", ""),
            )
        ]
        return result

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now: the client waits for them
        since = int(request.params.get("resourceVersion") or 0)
        if since and since < self.compacted_below:
            yield {
                "type": "ERROR",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "status": "Failure",
                    "code": 410,
                    "reason": "Expired",
                    "message": f"too old resource version: {since} ({self.compacted_below})",
                },
            }
            return
        assert request.resource is not None
        ended = self._watch_generation
        bus = self._buses[request.resource]
        # Mark the bus before reading the stored objects, so that a write between
        # the two is streamed, not lost.
        mark = await bus.mark()
        try:
            async with self._lock:
                current = [
                    obj.raw
                    for (resource, namespace, name), obj in self.objects.items()
                    if resource == request.resource
                    and not obj.deleted
                    and self._selected(request, namespace, name)
                ]
            for raw in current:
                if self._newer(raw, since):
                    yield {"type": "ADDED", "object": raw}
            stream = bus.stream(since=mark)
            while True:
                pending = asyncio.ensure_future(anext(stream))
                stopper = asyncio.ensure_future(ended.wait())
                try:
                    done, _ = await asyncio.wait(
                        {pending, stopper}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    stopper.cancel()
                    await asyncio.gather(stopper, return_exceptions=True)
                if pending not in done:
                    pending.cancel()
                    await asyncio.gather(pending, return_exceptions=True)
                    return
                event = pending.result()
                meta = event.get("object", {}).get("metadata", {})
                if self._selected(
                    request, meta.get("namespace"), meta.get("name", "")
                ) and self._newer(event.get("object", {}), since):
                    yield event
        finally:
            await bus.unmark(mark)

    @staticmethod
    def _newer(raw: Any, since: int) -> bool:
        version = raw.get("metadata", {}).get("resourceVersion")
        return not since or version is None or int(version) > since

    @staticmethod
    def _selected(request: rendering.Request, namespace: str | None, name: str) -> bool:
        if request.namespace is not None and namespace != request.namespace:
            return False
        if request.name is not None and name != request.name:
            return False
        selector = request.params.get("fieldSelector", "")
        for term in filter(None, selector.split(",")):
            field, _, value = term.partition("=")
            if field == "metadata.name" and name != value.lstrip("="):
                return False
            if field == "metadata.namespace" and namespace != value.lstrip("="):
                return False
        return True

    def compact(self) -> None:
        """Forget the history: a watch from any version seen so far gets 410 Gone."""
        self.compacted_below = int(self.next_version())

    def end_watches(self) -> None:
        """End every open watch stream (call on the emulator's loop)."""
        self._watch_generation.set()
        self._watch_generation = asyncio.Event()


def _merge_patch_from(current: Any, new: Any) -> Any:
    """The merge patch that turns ``current`` into ``new`` (``None`` removes a key)."""
    if not isinstance(current, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {key: None for key in current if key not in new}
    for key, value in new.items():
        patch[key] = _merge_patch_from(current.get(key), value) if key in current else value
    return patch


class RunningEmulator:
    """A :class:`VersionedEmulator` on a real port, its event loop in a daemon thread."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.emulator: VersionedEmulator | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)

    def start(self) -> RunningEmulator:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Kubernetes emulator did not start")
        if self._error is not None:
            raise RuntimeError("the Kubernetes emulator failed") from self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        async with VersionedEmulator() as emulator, kmock.Server(emulator) as server:
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stopped.wait()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the emulator's loop (its objects are not thread-safe)."""

        async def run() -> T:
            return fn()

        return self.run(run())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    @property
    def objects(self) -> Any:
        assert self.emulator is not None
        return self.emulator.objects

    def requests(self) -> list[rendering.Request]:
        assert self.emulator is not None
        return self.call(lambda: list(self.emulator))  # type: ignore[arg-type]

    def put(self, resource: str, namespace: str | None, name: str, body: dict[str, Any]) -> None:
        """Store an object as if a client created it (stamped, and watchers see ADDED)."""
        emulator = self.emulator
        assert emulator is not None

        async def put() -> None:
            body.setdefault("metadata", {})["resourceVersion"] = emulator.next_version()
            key = (kmock.resource(resource), namespace, name)
            emulator.objects[key] = body
            raw = emulator.objects[key].last.raw
            await emulator._buses[kmock.resource(resource)].put({"type": "ADDED", "object": raw})

        self.run(put())

    def patch(self, resource: str, namespace: str | None, name: str, patch: dict[str, Any]) -> None:
        """Merge ``patch`` into a stored object as a client PATCH would (watchers see MODIFIED)."""
        emulator = self.emulator
        assert emulator is not None

        async def apply() -> None:
            patch.setdefault("metadata", {})["resourceVersion"] = emulator.next_version()
            key = (kmock.resource(resource), namespace, name)
            emulator.objects[key].patch(patch)
            raw = emulator.objects[key].raw
            await emulator._buses[kmock.resource(resource)].put({"type": "MODIFIED", "object": raw})

        self.run(apply())

    def end_watches(self) -> None:
        assert self.emulator is not None
        self.call(self.emulator.end_watches)

    def stop(self) -> None:
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(10)
        self._loop.close()

    def api_client(self) -> Any:
        import kubernetes

        config = kubernetes.client.Configuration(host=self.url)
        return kubernetes.client.ApiClient(config)
