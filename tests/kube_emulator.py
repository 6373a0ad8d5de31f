"""The test API server (``tests/apiserver.py``) with the watch semantics of the real one.

kmock's watches replay every stored object and then stream from the moment
they subscribe, so a write between the two is lost; they ignore
``resourceVersion`` and field selectors and never end. A watcher that resumes,
relists and backs off cannot be tested against that. :class:`WatchingApiServer`
adds, on top of :class:`tests.apiserver.ApiServer` (resource versions, PUT with
conflicts, patches, status subresource, validation):

* lists carry the current ``resourceVersion``;
* a watch from a ``resourceVersion`` streams only what is newer (no replay of
  what the client has seen), and nothing written while it starts is lost;
* a watch honours ``fieldSelector`` as a list does;
* a watch from a version older than :attr:`WatchingApiServer.compacted_below`
  gets ``410 Gone`` (see :meth:`WatchingApiServer.compact`);
* :meth:`WatchingApiServer.end_watches` ends every open watch, as an API
  server does at its watch timeout or on restart.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import attrs
from kmock import resource

from tests.apiserver import ApiServer, RunningApiServer, field_selected, merge_patch


@attrs.define(kw_only=True)
class WatchingApiServer(ApiServer):
    compacted_below: int = 0
    latest: int = attrs.field(default=0, init=False)
    _ended: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        base = self._revision

        def tracked() -> Iterator[int]:
            for n in base:
                self.latest = n
                yield n

        self._revision = tracked()

    def compact(self) -> None:
        """Forget the history: a watch from any version seen so far gets 410 Gone."""
        self.compacted_below = next(self._revision)

    def end_watches(self) -> None:
        self._ended.set()
        self._ended = asyncio.Event()

    async def _serve_list(self, request: Any) -> Any:
        result = await super()._serve_list(request)
        result["metadata"] = {"resourceVersion": str(self.latest)}
        return result

    async def _serve_watch(self, request: Any) -> AsyncIterator[Any]:
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
        ended = self._ended
        bus = self._buses[request.resource]
        # Mark the bus before reading the stored objects: a write in between is streamed.
        mark = await bus.mark()
        pending: asyncio.Future[Any] | None = None
        try:
            async with self._lock:
                current = [
                    copy.deepcopy(obj.raw)
                    for (res, _, _), obj in self.objects.items()
                    if res == request.resource and not obj.deleted and _selected(request, obj.raw)
                ]
            for raw in current:
                if _newer(raw, since):
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
                    return
                event = pending.result()
                pending = None
                raw = event.get("object", {})
                if _selected(request, raw) and _newer(raw, since):
                    yield event
        finally:
            if pending is not None:  # the client went away, or the watch was ended
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await bus.unmark(mark)


def _newer(raw: Any, since: int) -> bool:
    version = raw.get("metadata", {}).get("resourceVersion")
    return not since or version is None or int(version) > since


def _selected(request: Any, raw: dict[str, Any]) -> bool:
    meta = raw.get("metadata", {})
    if request.namespace is not None and meta.get("namespace") != request.namespace:
        return False
    if request.name is not None and meta.get("name", "") != request.name:
        return False
    return field_selected(raw, request.params.get("fieldSelector", ""))


class RunningEmulator(RunningApiServer):
    """A :class:`WatchingApiServer` on a real port, with helpers for watch tests."""

    server: WatchingApiServer | None

    def __init__(self) -> None:
        super().__init__(WatchingApiServer)

    @property
    def emulator(self) -> WatchingApiServer:
        assert self.server is not None
        return self.server

    def call(self, fn: Callable[[WatchingApiServer], Any]) -> Any:
        """Run ``fn(server)`` on the server's loop, under its lock."""
        return self._call(fn)  # type: ignore[arg-type]

    def write(
        self, kind: str, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> None:
        """Create or merge into an object as a client would (watchers see the event)."""

        def store(server: WatchingApiServer) -> None:
            key = (resource(kind), namespace, name)
            exists = key in server.objects and not server.objects[key].deleted
            current = copy.deepcopy(server.objects[key].raw) if exists else {}
            new = merge_patch(current, body)
            meta = new.setdefault("metadata", {})
            meta["name"] = name
            if namespace:
                meta["namespace"] = namespace
            meta["resourceVersion"] = str(next(server._revision))
            if exists:
                server.objects[key].history.append(new)
            else:
                server.objects[key] = new
            event = {"type": "MODIFIED" if exists else "ADDED", "object": copy.deepcopy(new)}
            pending.append((resource(kind), event))

        pending: list[tuple[Any, dict[str, Any]]] = []
        self._call(store)  # type: ignore[arg-type]

        async def publish() -> None:
            assert self.server is not None
            for res, event in pending:
                await self.server._buses[res].put(event)

        asyncio.run_coroutine_threadsafe(publish(), self.loop).result(10)

    def requests(self) -> list[Any]:
        return list(self._call(lambda server: list(server)))  # type: ignore[arg-type]

    def end_watches(self) -> None:
        self._call(lambda server: server.end_watches())  # type: ignore[arg-type, union-attr]

    def stop(self) -> None:
        """End the open watches first, so that no stream is left pending at shutdown."""
        if self.server is not None and self._thread.is_alive():
            self.end_watches()
            time.sleep(0.05)
        super().stop()
