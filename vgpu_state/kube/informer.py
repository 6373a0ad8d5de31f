"""Watch a collection from a ``resourceVersion``: every change, each event bounded before
it is believed; resume after a broken stream, say when the version expired (410 Gone).

The controller lists a collection once (page by page, :mod:`vgpu_state.kube.liststream`)
and then watches it from the list's ``resourceVersion`` with a :class:`CollectionWatch`:
the API server streams one JSON event per line (``ADDED``, ``MODIFIED``, ``DELETED``,
``BOOKMARK``, ``ERROR``). The watch asks for bookmarks (``allowWatchBookmarks``), so an
idle stream still moves its version forward, and for ``timeoutSeconds``: the server ends
the stream after it and the watch resumes from the last version seen, so no change is
missed or replayed. A stream that breaks (network, a restarted server) resumes after a
jittered backoff. When the server no longer has the version (410 Gone, as an HTTP status
or an ``ERROR`` event), the watch stops and calls ``on_expired``: the owner lists again
and :meth:`CollectionWatch.resume` s from the new list's version.

Every event crosses the trust boundary (a node writes its own ``VGPUNodeState``): its
line is refused past :data:`MAX_EVENT_BYTES` before anything is decoded, and decoded
with its nesting bounded (:func:`vgpu_state.model.bounded.loads`). An event refused so
is logged and counted, and the watch starts over from a new list (the object it carried
cannot be skipped silently: the owner's list reads it through the same bounds as every
list).

:class:`WatchHealth` is the watch's readiness, as
:class:`~vgpu_state.kube.apihealth.ApiServerHealth`
is the server's: not ready once the watch has failed without a success for ``bound``
seconds.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from vgpu_state.background import BackgroundLoop, Backoff
from vgpu_state.kube.api import JsonObject, KubeApi
from vgpu_state.kube.apihealth import Answer
from vgpu_state.kube.errors import ClusterError
from vgpu_state.model import bounded

log = logging.getLogger(__name__)

HTTP_GONE = 410
MAX_EVENT_BYTES = 4 * 1024 * 1024
"""Bytes one watch event's line may have (the API server stores objects of at most
about 1.5 MiB; a ``VGPUNodeState``'s status is bounded by its CRD far below that)."""
DEFAULT_SERVER_TIMEOUT = 300
"""The watch's ``timeoutSeconds``: the server ends the stream after it; it resumes."""
READ_MARGIN = 60.0
"""Seconds past the server's timeout a silent stream is kept before it is dropped."""
WATCH_BACKOFF = Backoff(0.5, 30.0)
"""The wait before watching again after a failure (jittered)."""
DEFAULT_HEALTH_BOUND = 60.0
"""Seconds a watch may fail without a success before it is not ready."""


class EventError(ClusterError):
    """A watch event that is not believed (too large, too deep, not JSON)."""


class WatchHealth:
    """Whether a watch works: not ready once it has failed, without a success since, for
    ``bound`` seconds. ``on_change(ok)`` is called when that flips, ``on_failure()`` on
    every failure."""

    def __init__(
        self,
        what: str,
        bound: float = DEFAULT_HEALTH_BOUND,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.what = what
        self.bound = bound
        self.on_change = on_change
        self.on_failure = on_failure
        self._clock = clock
        self._lock = threading.Lock()
        self._failing_since: float | None = None
        self._cause = ""
        self._ok = True
        self.failures = 0

    def succeeded(self) -> None:
        with self._lock:
            self._failing_since = None
        self._update()

    def failed(self, cause: str) -> None:
        with self._lock:
            self.failures += 1
            self._cause = cause[:500]
            if self._failing_since is None:
                self._failing_since = self._clock()
        if self.on_failure is not None:
            self.on_failure()
        self._update()

    def check(self) -> Answer:
        self._update()
        with self._lock:
            if self._ok:
                return Answer(True, "ok")
            assert self._failing_since is not None
            return Answer(
                False,
                f"the watch of {self.what} has failed for "
                f"{self._clock() - self._failing_since:.0f} s: {self._cause}",
            )

    def _update(self) -> None:
        with self._lock:
            since = self._failing_since
            ok = since is None or self._clock() - since <= self.bound
            if ok == self._ok:
                return
            self._ok = ok
            if ok:
                log.info("the watch of %s works again", self.what)
            else:
                log.error(
                    "the watch of %s has failed for %.0f s: %s; not ready until it works",
                    self.what,
                    self.bound,
                    self._cause,
                )
        if self.on_change is not None:
            self.on_change(ok)


class CollectionWatch(BackgroundLoop):
    """Watch the collection at ``path`` from a version given by :meth:`resume`; call
    ``on_event(type, obj)`` (``ADDED``, ``MODIFIED`` or ``DELETED``, on this watch's
    thread) for each change, ``on_expired()`` when the version is gone (410) or an event
    was refused: the owner lists again and resumes. Idle until the first :meth:`resume`.
    """

    def __init__(
        self,
        api: KubeApi,
        path: str,
        on_event: Callable[[str, JsonObject], None],
        on_expired: Callable[[str], None],
        *,
        what: str,
        field_selector: str | None = None,
        accept: str = "application/json",
        server_timeout: int = DEFAULT_SERVER_TIMEOUT,
        connect_timeout: float = 5.0,
        backoff: Backoff = WATCH_BACKOFF,
        health: WatchHealth | None = None,
    ) -> None:
        super().__init__(f"vgpu-state-watch-{what}", first=None)
        self.api = api
        self.path = path
        self.what = what
        self._on_event = on_event
        self._on_expired = on_expired
        self._selector = field_selector
        self._accept = accept
        self._server_timeout = server_timeout
        self._connect_timeout = connect_timeout
        self.backoff = backoff
        self.health = health or WatchHealth(what)
        self._lock = threading.Lock()
        self._version: str | None = None
        self._response: Any = None
        self._failures = 0
        self.events = 0
        self._open = False
        self._ended_well: float | None = None
        """When (``time.monotonic``) the last stream ended at the server's timeout."""

    def live(self, within: float = 5.0) -> bool:
        """Whether a stream is open now (the server answered the watch), or the last one
        ended well less than ``within`` seconds ago (the next is on its way)."""
        with self._lock:
            if self._open:
                return True
            ended = self._ended_well
        return ended is not None and time.monotonic() - ended < within

    @property
    def version(self) -> str | None:
        with self._lock:
            return self._version

    def resume(self, version: str) -> None:
        """Watch from ``version`` (a list's), now; a stream open from an older version is
        ended first."""
        with self._lock:
            self._version = version or None
            response = self._response
        if response is not None:
            _shutdown(response)
        self.start()
        self.wake()

    def stop(self, timeout: float | None = 5.0) -> None:
        self.stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            _shutdown(response)
        super().stop(timeout)

    def step(self) -> float | None:
        with self._lock:
            version = self._version
        if version is None:
            return None  # until resume()
        try:
            self._watch(version)
        except EventError as e:
            self._expire(f"an event is refused: {e}")
            return None
        except ClusterError as e:
            if e.status == HTTP_GONE:
                self._expire(str(e))
                return None
            return self._failed(e)
        except Exception as e:  # HTTP, socket and decode errors: the stream broke
            if self.stopping.is_set():
                return None
            return self._failed(e)
        return 0.0

    def _expire(self, why: str) -> None:
        log.info("watch of %s ends (%s); listing again", self.what, why)
        with self._lock:
            self._version = None
        self._on_expired(why)

    def _failed(self, e: Exception) -> float:
        self._failures += 1
        delay = self.backoff.delay(self._failures)
        log.warning("watch of %s failed: %s; again in %.1f s", self.what, e, delay)
        self.health.failed(str(e))
        return delay

    def _watch(self, version: str) -> None:
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._server_timeout),
            "resourceVersion": version,
        }
        if self._selector:
            query["fieldSelector"] = self._selector
        timeout = (self._connect_timeout, self._server_timeout + READ_MARGIN)
        response = self.api.open_stream(
            self.path, query=query, timeout=timeout, accept=self._accept
        )
        with self._lock:
            if self._version != version or self.stopping.is_set():
                _shutdown(response)  # resumed elsewhere meanwhile
                response.release_conn()
                return
            self._response = response
            self._open = True
            self._ended_well = None
        self._failures = 0
        self.health.succeeded()
        current = version
        try:
            for event in events(response, f"a watch event of {self.what}"):
                with self._lock:
                    if self.stopping.is_set() or self._version != current:
                        return  # stopped, or resumed from a newer list
                seen = self._event(event)
                if seen:
                    with self._lock:
                        if self._version == current:
                            self._version = current = seen
            with self._lock:
                self._ended_well = time.monotonic()
        finally:
            with self._lock:
                self._response = None
                self._open = False
            response.release_conn()

    def _event(self, event: Mapping[str, Any]) -> str | None:
        """Hand a change on; the version the event carries."""
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise EventError(f"a watch event of {self.what} carries no object")
        if kind == "ERROR":
            code = obj.get("code")
            raise ClusterError(
                f"watch of {self.what}: {obj.get('message') or obj.get('reason') or obj}",
                code if isinstance(code, int) else 0,
                str(obj.get("reason") or ""),
            )
        meta = obj.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.events += 1
            self._on_event(kind, obj)
        elif kind != "BOOKMARK":
            log.debug("watch of %s: event %r ignored", self.what, kind)
        self.health.succeeded()
        return version if isinstance(version, str) and version else None


def events(response: Any, name: str, limit: int = MAX_EVENT_BYTES) -> Iterator[JsonObject]:
    """The JSON events of a watch stream, one per line, each line refused past ``limit``
    bytes before it is decoded and decoded with its nesting bounded."""
    buffer = bytearray()
    for chunk in response.stream(amt=None):
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            line = bytes(buffer[start:end])
            start = end + 1
            if line.strip():
                yield _decode(line, name, limit)
        del buffer[:start]
        if len(buffer) > limit:
            raise EventError(f"{name}: more than {limit} bytes (the limit of one event)")


def _decode(line: bytes, name: str, limit: int) -> JsonObject:
    if len(line) > limit:
        raise EventError(f"{name}: {len(line)} bytes, more than the limit of {limit}")
    try:
        event = bounded.loads(line, name)
    except ValueError as e:
        raise EventError(str(e).splitlines()[0][:300]) from None
    if not isinstance(event, dict):
        raise EventError(f"{name}: not a JSON object")
    return event


def _shutdown(response: Any) -> None:
    """Unblock a thread reading the stream (close alone does not wake a blocked recv)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is None:
        sock = getattr(getattr(getattr(response, "_fp", None), "fp", None), "raw", None)
        sock = getattr(sock, "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
