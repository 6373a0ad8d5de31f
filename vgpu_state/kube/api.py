"""JSON requests to the Kubernetes API.

:meth:`KubeApi.connect` reads the credentials (:mod:`vgpu_state.kube.credentials`:
the in-cluster service account or a kubeconfig) and sends through a
:class:`~vgpu_state.kube.transport.Transport` (``http.client`` and ``ssl``: TLS,
authentication, a small connection pool). This class sends and receives plain
JSON documents, the shape every adapter in this package works with. The official
``kubernetes`` client is loaded only for a kubeconfig that needs its loader (a
credential plugin, an auth provider, several files to merge).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlencode

from vgpu_state.kube import credentials
from vgpu_state.kube.errors import ClusterError, ClusterUnreachableError, NotFoundError
from vgpu_state.kube.transport import Response, Transport
from vgpu_state.model import bounded

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
PatchKind = Literal["json", "merge"]

_CONTENT_TYPES: dict[str, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
}


class ConflictError(ClusterError):
    """HTTP 409: the object changed since it was read, or it already exists."""


class InvalidError(ClusterError):
    """HTTP 422: the request was refused, e.g. a JSON Patch ``test`` op did not hold."""


T = TypeVar("T")


def retry_on_conflict(attempt: Callable[[], T], attempts: int, gave_up: Exception) -> T:
    """``attempt()`` (a read, then a write guarded by what it read) again while it raises
    :class:`ConflictError`: another writer changed the object in between. After
    ``attempts`` conflicts in a row ``gave_up`` is raised. (The KubeVirt CR's write,
    which also waits a :class:`~vgpu_state.background.Backoff`, is
    :func:`vgpu_state.kube.kubevirt.write`.)"""
    for _ in range(attempts):
        try:
            return attempt()
        except ConflictError:
            continue
    raise gave_up


def path_of(
    group: str, version: str, plural: str, name: str | None = None, namespace: str | None = None
) -> str:
    """The REST path of a collection or an object (``group`` ``""`` is the core API)."""
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{plural}"
    if name is not None:
        base += f"/{quote(name, safe='')}"
    return base


class KubeApi:
    """A Kubernetes API endpoint. Build it with :meth:`connect` (kubeconfig or in-cluster).

    Every method raises :class:`NotFoundError` (404), :class:`ConflictError`
    (409), :class:`InvalidError` (422), :class:`ClusterError` (other refusals)
    or :class:`ClusterUnreachableError` (no answer at all).
    """

    def __init__(self, transport: Transport, server: str, timeout: tuple[float, float]) -> None:
        self._client = transport
        self.server = server
        self.timeout = timeout
        self.requests = 0

    @property
    def client(self) -> Transport:
        """The :class:`Transport` (for the Node watch, which streams)."""
        return self._client

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        *,
        in_cluster: bool | None = None,
        timeout: tuple[float, float] = (5.0, 30.0),
        pool_size: int = 4,
    ) -> KubeApi:
        """Load credentials and return an endpoint; nothing is sent yet.

        ``kubeconfig``: a kubeconfig file; ``None`` uses the in-cluster service
        account when running in a pod, else the client's default kubeconfig
        (``$KUBECONFIG`` or ``~/.kube/config``); ``in_cluster`` forces either way.
        """
        where = kubeconfig or "the default kubeconfig"
        endpoint = None
        try:
            if in_cluster or (in_cluster is None and kubeconfig is None):
                try:
                    endpoint = credentials.in_cluster()
                    where = "in-cluster service account"
                except credentials.CredentialsError:
                    if in_cluster:
                        where = "the in-cluster service account"
                        raise
                    # Not in a pod: the default kubeconfig below.
            if endpoint is None:
                endpoint = credentials.from_kubeconfig(kubeconfig, context)
            transport = Transport(endpoint, pool_size)
        except Exception as e:  # unreadable files, YAML, the client loader's errors, bad TLS
            raise ClusterUnreachableError(
                f"cannot load Kubernetes credentials from {where}: {e}"
            ) from e
        log.debug("Kubernetes API %s (from %s)", endpoint.server, where)
        return cls(transport, endpoint.server, timeout)

    # requests ------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> JsonObject:
        status, raw = self._send(method, path, body, content_type, query, "application/json")
        data = _decode(raw)
        if 200 <= status < 300:
            return data
        raise _error(method, path, status, data)

    def get_bytes(
        self,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        accept: str = "application/json",
    ) -> bytes:
        """GET ``path``: the response body as sent, not decoded (for a caller that decodes
        it elsewhere, or in part). Raises as :meth:`request` does."""
        status, raw = self._send("GET", path, None, "application/json", query, accept)
        if 200 <= status < 300:
            return raw
        raise _error("GET", path, status, _decode(raw))

    def answer(self, path: str, timeout: tuple[float, float]) -> tuple[int, bytes]:
        """GET ``path`` within ``timeout`` (connect, read seconds): the status code and the
        body, whatever the code (for a health check such as ``/readyz``). Raises
        :class:`ClusterUnreachableError` only when nothing answers."""
        return self._send("GET", path, None, "application/json", None, "*/*", timeout)

    def get_chunks(
        self,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        accept: str = "application/json",
        chunk_size: int = 64 * 1024,
    ) -> Generator[bytes, None, None]:
        """GET ``path``: the response body in pieces of at most ``chunk_size`` bytes, as
        they arrive (a caller that decodes as it reads never holds the whole body).
        Raises as :meth:`request` does; the connection is released when the pieces are
        read or the iterator is closed."""
        body = self.open_stream(path, query=query, accept=accept)
        if query:
            path = f"{path}?{urlencode(dict(query))}"
        done = False
        try:
            while True:
                try:
                    piece = body.read(chunk_size)
                except Exception as e:  # socket and HTTP read errors: the answer broke off
                    raise ClusterUnreachableError(
                        f"Kubernetes API server {self.server} broke off its answer "
                        f"(GET {path}): {_short(e)}"
                    ) from e
                if not piece:
                    done = True
                    return
                yield piece
        finally:
            if done:
                body.release_conn()
            else:
                body.close()

    def open_stream(
        self,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        timeout: tuple[float, float] | None = None,
        accept: str = "application/json",
    ) -> Response:
        """GET ``path`` and hand back the open answer (``stream()`` it, ``release_conn()``
        it): a watch's, whose answer lasts up to ``timeout``'s read
        seconds, or a list read in pieces (:meth:`get_chunks`; ``None``: the client's
        timeout). Raises as :meth:`request` does."""
        response, path = self._open("GET", path, None, "application/json", query, accept, timeout)
        status = int(response.status)
        if not 200 <= status < 300:
            raise _error("GET", path, status, _decode(response.read()))
        return response

    def _open(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | Sequence[Any] | None,
        content_type: str,
        query: Mapping[str, str] | None,
        accept: str,
        timeout: tuple[float, float] | None = None,
    ) -> tuple[Response, str]:
        """Send the request: the response, its body not read yet, and the path as sent
        (with its query)."""
        if query:
            path = f"{path}?{urlencode(dict(query))}"
        headers = {"Accept": accept, "Content-Type": content_type}
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            response = self._client.open(method, path, headers, data, timeout or self.timeout)
        except ClusterError:
            raise
        except Exception as e:  # socket, TLS, HTTP and credential errors: all mean "no answer"
            raise self._unreachable(method, path, e) from e
        self.requests += 1
        for warning in _warnings(response):
            # E.g. a field the server does not know and drops ("unknown field"): a bug to see.
            log.warning("the Kubernetes API server warns (%s %s): %s", method, path, warning)
        return response, path

    def _unreachable(self, method: str, path: str, e: Exception) -> ClusterUnreachableError:
        return ClusterUnreachableError(
            f"Kubernetes API server {self.server} is unreachable ({method} {path}): {_short(e)}"
        )

    def _send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | Sequence[Any] | None,
        content_type: str,
        query: Mapping[str, str] | None,
        accept: str,
        timeout: tuple[float, float] | None = None,
    ) -> tuple[int, bytes]:
        response, path = self._open(method, path, body, content_type, query, accept, timeout)
        try:
            raw = response.read()
        except Exception as e:  # the answer broke off: as no answer
            raise self._unreachable(method, path, e) from e
        return int(response.status), raw or b""

    def get(self, path: str) -> JsonObject:
        return self.request("GET", path)

    def list(
        self, path: str, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[JsonObject]:
        query = {
            key: value
            for key, value in (("labelSelector", label_selector), ("fieldSelector", field_selector))
            if value
        }
        items = self.request("GET", path, query=query or None).get("items") or []
        return [i for i in items if isinstance(i, dict)]

    def create(self, path: str, body: Mapping[str, Any]) -> JsonObject:
        return self.request("POST", path, body)

    def replace(self, path: str, body: Mapping[str, Any]) -> JsonObject:
        return self.request("PUT", path, body)

    def patch(
        self, path: str, body: Mapping[str, Any] | Sequence[Any], kind: PatchKind
    ) -> JsonObject:
        return self.request("PATCH", path, body, content_type=_CONTENT_TYPES[kind])

    def delete(self, path: str) -> JsonObject:
        return self.request("DELETE", path)

    def close(self) -> None:
        self._client.close()


def _warnings(response: Response) -> list[str]:
    """The texts of the response's ``Warning`` headers (RFC 7234: ``299 - "text"``)."""
    values = response.headers.get_all("Warning") or []
    texts = []
    for value in values:
        if not isinstance(value, str) or not value:
            continue
        code, _, rest = value.partition(" ")
        agent, _, text = rest.partition(" ")
        if code.isdigit() and agent and text.startswith('"') and text.endswith('"'):
            texts.append(text[1:-1].replace('\\"', '"'))
        else:
            texts.append(value)
    return texts


def _decode(raw: bytes | None) -> JsonObject:
    if not raw:
        return {}
    try:
        data = bounded.loads(raw, "the API server's answer")
    except bounded.InputShapeError as e:
        raise ClusterError(str(e)) from None
    except ValueError:
        return {"message": raw[:200].decode("utf-8", "replace")}
    return data if isinstance(data, dict) else {"items": data}


def _error(method: str, path: str, status: int, data: JsonObject) -> Exception:
    reason = str(data.get("reason") or "")
    message = str(data.get("message") or reason or f"HTTP {status}")
    text = f"{method} {path}: HTTP {status} {reason}: {message}".replace(": :", ":")
    if status == 404:
        return NotFoundError(text, status, reason)
    if status == 409:
        return ConflictError(text, status, reason)
    if status == 422:
        return InvalidError(text, status, reason)
    if status in (401, 403):
        return ClusterError(
            f"{text} (the credentials lack permission: check the service account's RBAC)",
            status,
            reason,
        )
    if status >= 500 or status == 429:
        # A server that is overloaded or restarting: the caller may retry.
        return ClusterUnreachableError(text)
    return ClusterError(text, status, reason)


def _short(e: BaseException) -> str:
    """The reason of a socket, TLS or HTTP error, on one line."""
    reason = getattr(e, "reason", None)
    text = str(reason) if reason is not None else str(e)
    return text.splitlines()[0][:300] if text else type(e).__name__
