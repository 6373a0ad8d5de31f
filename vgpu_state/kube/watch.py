"""Watch one Node (or the node's ``VGPUNodeState``): resume from ``resourceVersion``, back
off on errors, relist on 410 Gone.

The agent needs to know when its Node's labels change (the label picks the
layout). A Kubernetes watch streams every change to the Node, including
status heartbeats every few seconds, so :class:`NodeWatch` calls back only
when the labels differ from the last ones it reported. :class:`NodeStateWatch`
tells the agent when its own ``VGPUNodeState`` is deleted.

The protocol is the API server's: list once to get the current object and a
``resourceVersion``, then watch from that version; after the stream ends
(server timeout, network error) watch again from the last version seen, so no
change is missed or replayed; when the server answers 410 Gone (the version
was compacted away), list again. Errors wait an exponential, jittered backoff
that resets after a successful list or event.

The requests go through the agent's :class:`~vgpu_state.kube.transport.Transport`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

from vgpu_state.background import BackgroundLoop, Backoff
from vgpu_state.kube.transport import Response, Transport, shutdown
from vgpu_state.model import bounded

log = logging.getLogger(__name__)

HTTP_GONE = 410


class WatchError(Exception):
    """The API server answered a list or watch with an error status."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


WATCH_BACKOFF = Backoff(0.5, 30.0)
"""The wait before listing or watching again after an error (jittered)."""


class NodeWatch(BackgroundLoop):
    """Call ``on_labels(labels)`` from a daemon thread: once at start, then on every change.

    ``api_client``: the API server's :class:`Transport`. ``server_timeout``: the
    watch's ``timeoutSeconds`` (the server ends the stream after it; the watch
    then resumes). ``read_timeout``: a silent connection is dropped after this
    long and resumed. ``on_error``: told about every failure (for logs and
    metrics); the watch itself keeps going until :meth:`stop`. ``ignore``: label
    keys whose changes do not count (the ones the caller writes itself).
    ``on_node``: called with every Node object seen (status heartbeats too),
    after ``on_labels``; it must be cheap (it runs on the watch's thread).
    """

    KIND = "node"
    THREAD = "vgpu-state-nodewatch"

    def __init__(
        self,
        api_client: Transport,
        node: str,
        on_labels: Callable[[Mapping[str, str]], None],
        *,
        server_timeout: int = 300,
        read_timeout: float = 330.0,
        backoff: Backoff = WATCH_BACKOFF,
        on_error: Callable[[Exception], None] | None = None,
        ignore: frozenset[str] = frozenset(),
        on_node: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        super().__init__(self.THREAD, first=0)
        self._client = api_client
        self._on_node = on_node
        self._ignore = ignore
        self.node = node
        self._on_labels = on_labels
        self._server_timeout = server_timeout
        self._read_timeout = read_timeout
        self.backoff = backoff
        self._failures = 0
        self._on_error = on_error
        self._response: Response | None = None
        self._lock = threading.Lock()
        self.resource_version: str | None = None
        self.labels: dict[str, str] | None = None
        self.lists = 0
        self._gone_in_a_row = 0

    def stop(self, timeout: float | None = 5.0) -> None:
        self.stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            shutdown(response)
        super().stop(timeout)

    # the loop ------------------------------------------------------------------------
    def step(self) -> float:
        """List (when no version is known) and watch until the stream ends; the seconds
        to wait before the next round (0 after a stream that ended well)."""
        try:
            if self.resource_version is None:
                self._list()
            self._watch()
        except WatchError as exc:
            if exc.status != HTTP_GONE:
                return self._failed(exc)
            log.info("watch of %s %s expired (%s); listing again", self.KIND, self.node, exc)
            self.resource_version = None
            self._gone_in_a_row += 1
            # Expired again at once: do not spin.
            return self._next_delay() if self._gone_in_a_row > 1 else 0.0
        except Exception as exc:  # socket, HTTP and JSON errors: retry them all
            if self.stopping.is_set():
                return 0.0
            return self._failed(exc)
        return 0.0

    def _failed(self, exc: Exception) -> float:
        delay = self._next_delay()
        log.warning(
            "watch of %s %s failed: %s; retrying in %.1f s", self.KIND, self.node, exc, delay
        )
        if self._on_error is not None:
            self._on_error(exc)
        return delay

    def _next_delay(self) -> float:
        self._failures += 1
        return self.backoff.delay(self._failures)

    def _list(self) -> None:
        raw = self._get(self._path(), {"fieldSelector": self._selector()}).read()
        body = bounded.loads(raw, "the list of nodes")
        self.lists += 1
        mine = [i for i in body.get("items") or [] if self._is_mine(i)]
        self.resource_version = str(body.get("metadata", {}).get("resourceVersion") or "") or None
        if not self._gone_in_a_row:
            self._failures = 0
        if mine:
            self._seen(mine[0])
        else:
            self._missing()

    def _watch(self) -> None:
        query = {
            "fieldSelector": self._selector(),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._server_timeout),
        }
        if self.resource_version:
            query["resourceVersion"] = self.resource_version
        response = self._get(self._path(), query)
        with self._lock:
            self._response = response
        try:
            for event in _events(response):
                if self.stopping.is_set():
                    return
                self._event(event)
        finally:
            with self._lock:
                self._response = None
            response.release_conn()

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            raise WatchError(int(obj.get("code") or 0), str(obj.get("message") or obj))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = str(version)
        self._failures = 0
        self._gone_in_a_row = 0
        if not self._is_mine(obj):
            return  # a server that ignores the field selector
        if kind in ("ADDED", "MODIFIED"):
            self._seen(obj)
        elif kind == "DELETED":
            self._deleted()

    def _missing(self) -> None:
        """A list found no object of that name."""
        log.warning("node %s not found; waiting for it to appear", self.node)

    def _deleted(self) -> None:
        log.warning("node %s was deleted", self.node)

    def _is_mine(self, obj: Mapping[str, Any]) -> bool:
        return bool((obj.get("metadata") or {}).get("name") == self.node)

    def _seen(self, node: Mapping[str, Any]) -> None:
        labels = {
            k: v
            for k, v in ((node.get("metadata") or {}).get("labels") or {}).items()
            if k not in self._ignore
        }
        if labels != self.labels:
            self.labels = labels
            self._on_labels(labels)
        if self._on_node is not None:
            self._on_node(node)

    # HTTP ----------------------------------------------------------------------------
    def _path(self) -> str:
        return "/api/v1/nodes"

    def _selector(self) -> str:
        return f"metadata.name={self.node}"

    def _get(self, path: str, query: Mapping[str, str]) -> Response:
        response = self._client.open(
            "GET",
            f"{path}?{urlencode(dict(query))}",
            {"Accept": "application/json"},
            None,
            (5.0, self._read_timeout),
        )
        if not 200 <= int(response.status) < 300:
            raw = response.read()
            try:
                message = json.loads(raw).get("message", "")
            except ValueError:
                message = raw[:200].decode("utf-8", "replace")
            raise WatchError(int(response.status), f"GET {path}: {message}")
        return response


def _events(response: Response) -> Iterator[dict[str, Any]]:
    """The JSON events of a watch stream, one per line."""
    buffer = b""
    for chunk in response.stream(amt=None):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                event = bounded.loads(line, "a watch event")
                if isinstance(event, dict):
                    yield event


class NodeStateWatch(NodeWatch):
    """Call ``on_gone()`` from a daemon thread when the node's own ``VGPUNodeState`` is
    deleted (an admin's ``kubectl delete``, the garbage collector), so that it is written
    again at once, not at the next resync.

    The same list-then-watch as :class:`NodeWatch`, with the field selector
    ``metadata.name=<node>``: the server sends only this object's changes. A relist
    that finds it missing (after a 410 Gone) counts as a deletion; the first list
    does not (the agent's first reconcile creates it).
    """

    KIND = "VGPUNodeState"
    THREAD = "vgpu-state-nodestatewatch"

    def __init__(
        self, api_client: Transport, node: str, on_gone: Callable[[], None], **options: Any
    ) -> None:
        super().__init__(api_client, node, lambda labels: None, **options)
        self._on_gone = on_gone

    def _path(self) -> str:
        from vgpu_state.kube.nodestate import object_path

        return object_path()

    def _seen(self, node: Mapping[str, Any]) -> None:
        return  # its own writes: nothing to do

    def _missing(self) -> None:
        if self.lists > 1:
            log.warning("VGPUNodeState %s is gone; writing it again", self.node)
            self._on_gone()

    def _deleted(self) -> None:
        log.warning("VGPUNodeState %s was deleted; writing it again", self.node)
        self._on_gone()
