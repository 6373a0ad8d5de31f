"""HTTP(S) to the Kubernetes API server on the standard library (``http.client``, ``ssl``).

:class:`Transport` sends one request at a time per connection and keeps up to
``pool_size`` idle connections to the server for reuse. It does what the adapters
need of a client and nothing more: TLS verified against the cluster's CA (or not,
when the kubeconfig says ``insecure-skip-tls-verify``), a client certificate, the
``Authorization`` header (a bearer token, re-read from its file when the file
changes, as a projected service-account token is rotated; or one asked of a
callable; or user and password), an HTTP proxy (``CONNECT`` for HTTPS; from the
kubeconfig's ``proxy-url`` or ``HTTPS_PROXY``/``HTTP_PROXY`` with ``NO_PROXY``),
connect and read timeouts, and answers read whole, in pieces, or as a stream
(a watch). A request whose connection fails before it was sent, or whose kept
connection the server had closed, is tried once more on a new connection; one
the server closed as it went out, only when the method is idempotent.

Every failure is an ``OSError`` or an ``http.client.HTTPException``;
:class:`~vgpu_state.kube.api.KubeApi` maps them to its errors.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

USER_AGENT = "vgpu-state"
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
_PIECE = 64 * 1024


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is and how to authenticate to it.

    ``ca_file``/``ca_data``: the CA certificates (PEM) to verify the server with
    (neither: the system's); ``verify`` ``False`` skips verification.
    ``cert_file``/``key_file`` or ``cert_data``/``key_data``: a client certificate.
    ``token_file``: a bearer token read from that file, again whenever it changes;
    ``token_source``: a callable giving the whole ``Authorization`` value (a
    credential plugin's, refreshed by it). ``proxy``: an ``http://`` proxy URL
    (``None``: the environment's).
    """

    server: str
    ca_file: str | None = None
    ca_data: str | None = None
    verify: bool = True
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    tls_server_name: str | None = None
    token: str | None = None
    token_file: str | None = None
    token_source: Callable[[], str | None] | None = None
    username: str | None = None
    password: str | None = None
    proxy: str | None = None
    no_proxy: str | None = None


class Transport:
    """A small pool of connections to one API server (see the module's description)."""

    def __init__(self, endpoint: Endpoint, pool_size: int = 4) -> None:
        parts = urlsplit(endpoint.server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server {endpoint.server!r} is not an http:// or https:// URL")
        self.endpoint = endpoint
        self.server = endpoint.server
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._context = _ssl_context(endpoint) if self._https else None
        self._proxy = _proxy_for(endpoint, parts.scheme, self._host, self._port)
        self._pool_size = pool_size
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._token = _TokenFile(endpoint.token_file) if endpoint.token_file else None

    # connections ---------------------------------------------------------------------
    def _new(self, connect_timeout: float) -> http.client.HTTPConnection:
        host, port = (self._proxy[0], self._proxy[1]) if self._proxy else (self._host, self._port)
        conn: http.client.HTTPConnection
        if self._https:
            conn = _HTTPSConnection(
                host,
                port,
                timeout=connect_timeout,
                context=self._context,
                server_hostname=self.endpoint.tls_server_name or self._host,
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=connect_timeout)
        if self._proxy and self._https:
            conn.set_tunnel(self._host, self._port, headers=self._proxy[2])
        return conn

    def _take(self) -> http.client.HTTPConnection | None:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if _usable(conn):
                    return conn
                conn.close()
        return None

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if conn.sock is not None and len(self._idle) < self._pool_size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # requests ------------------------------------------------------------------------
    def open(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: tuple[float, float],
    ) -> Response:
        """Send ``method target`` (``target``: the path and query) and return the answer
        with its body not read yet."""
        url = self._prefix + target
        if self._proxy and not self._https:
            url = f"http://{self._host}:{self._port}{url}"
        sent = {"User-Agent": USER_AGENT, **headers}
        authorization = self.authorization()
        if authorization:
            sent["Authorization"] = authorization
        if self._proxy and not self._https and self._proxy[2]:
            sent.update(self._proxy[2])
        connect_timeout, read_timeout = timeout
        for attempt in (0, 1):
            conn = self._take()
            kept = conn is not None
            if conn is None:
                conn = self._new(connect_timeout)
            try:
                if conn.sock is None:
                    conn.timeout = connect_timeout
                    conn.connect()
                    kept = False
            except OSError:
                conn.close()
                if attempt:
                    raise
                continue  # not sent: once more
            try:
                assert conn.sock is not None
                conn.sock.settimeout(read_timeout)
                conn.request(method, url, body=body, headers=sent)
            except _STALE:
                conn.close()
                if attempt or not kept:
                    raise
                continue  # the server had closed the kept connection: nothing was read
            except BaseException:
                conn.close()
                raise
            try:
                response = conn.getresponse()
            except _STALE:
                conn.close()
                if attempt or not kept or method not in _IDEMPOTENT:
                    raise
                continue  # closed as the request went out: again only if idempotent
            except BaseException:
                conn.close()
                raise
            return Response(self, conn, response)
        raise AssertionError("unreachable")  # pragma: no cover

    def authorization(self) -> str | None:
        """The ``Authorization`` header a request sent now carries (``None``: none)."""
        endpoint = self.endpoint
        if endpoint.token_source is not None:
            return endpoint.token_source()
        if self._token is not None:
            return f"Bearer {self._token.read()}"
        if endpoint.token:
            return f"Bearer {endpoint.token}"
        if endpoint.username is not None:
            pair = f"{endpoint.username}:{endpoint.password or ''}".encode()
            return "Basic " + base64.b64encode(pair).decode()
        return None


class Response:
    """An answer whose body is read whole (:meth:`read`), in pieces (``read(n)``) or as
    it arrives (:meth:`stream`). :meth:`release_conn` hands a fully read connection
    back for reuse and closes any other; :meth:`close` closes it."""

    def __init__(
        self, transport: Transport, conn: http.client.HTTPConnection, raw: http.client.HTTPResponse
    ) -> None:
        self._transport = transport
        self.connection = conn  # its ``sock`` is what a watch's stop shuts down
        self._raw = raw
        self.status = raw.status
        self.reason = raw.reason
        self.headers = raw.headers
        self._done = False

    def read(self, amt: int | None = None) -> bytes:
        """The rest of the body (``amt``: at most that many bytes; ``b""`` at the end).
        A body read to its end hands its connection back."""
        try:
            data = self._raw.read() if amt is None else self._raw.read(amt)
        except BaseException:
            self.close()  # broken off: the connection is not reused
            raise
        if amt is None or not data:
            self.release_conn()
        return data

    def stream(self, amt: int | None = None) -> Iterator[bytes]:
        """The body's bytes as they arrive (each piece at most ``amt`` or 64 KiB)."""
        size = amt or _PIECE
        while True:
            piece = self._raw.read1(size)
            if not piece:
                return
            yield piece

    def release_conn(self) -> None:
        if self._done:
            return
        self._done = True
        if self._raw.isclosed() and not self._raw.will_close:
            self._transport._give_back(self.connection)
        else:
            self._raw.close()
            self.connection.close()

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._raw.close()
            self.connection.close()


class _HTTPSConnection(http.client.HTTPSConnection):
    """``HTTPSConnection`` that checks the certificate against ``server_hostname`` (the
    kubeconfig's ``tls-server-name``, else the server's host), through a proxy too."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float,
        context: ssl.SSLContext | None,
        server_hostname: str,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        assert context is not None
        self._tls = context
        self._server_hostname = server_hostname

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_hostname)


class _TokenFile:
    """A bearer token in a file, read again when the file changes (a projected
    service-account token is replaced by the kubelet before it expires)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._token = ""
        self._lock = threading.Lock()

    def read(self) -> str:
        with self._lock:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key != self._seen:
                with open(self.path, encoding="utf-8") as f:
                    self._token = f.read().strip()
                self._seen = key
            return self._token


def _usable(conn: http.client.HTTPConnection) -> bool:
    """A kept connection the server has not closed (nothing to read on an idle one)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _ssl_context(endpoint: Endpoint) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=endpoint.ca_file, cadata=endpoint.ca_data)
    if not endpoint.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if endpoint.cert_file or endpoint.cert_data:
        if endpoint.cert_data is not None or endpoint.key_data is not None:
            _load_cert_data(context, endpoint)
        else:
            assert endpoint.cert_file is not None
            context.load_cert_chain(endpoint.cert_file, endpoint.key_file)
    return context


def _load_cert_data(context: ssl.SSLContext, endpoint: Endpoint) -> None:
    """``load_cert_chain`` reads files only: the PEM goes through a private temporary
    directory, removed once loaded."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vgpu-state-tls-") as where:
        paths = []
        for name, data, path in (
            ("cert.pem", endpoint.cert_data, endpoint.cert_file),
            ("key.pem", endpoint.key_data, endpoint.key_file),
        ):
            if data is None:
                paths.append(path)
                continue
            target = os.path.join(where, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            paths.append(target)
        assert paths[0] is not None
        context.load_cert_chain(paths[0], paths[1])


def _proxy_for(
    endpoint: Endpoint, scheme: str, host: str, port: int
) -> tuple[str, int, dict[str, str]] | None:
    """The proxy's host, port and headers (its credentials), or ``None`` for a direct
    connection: the endpoint's proxy, else ``HTTPS_PROXY``/``HTTP_PROXY`` unless
    ``NO_PROXY`` names the host."""
    proxy = endpoint.proxy
    no_proxy = endpoint.no_proxy
    if proxy is None:
        proxy = _env(f"{scheme}_proxy")
        if no_proxy is None:
            no_proxy = _env("no_proxy")
    if not proxy or _bypass(host, port, no_proxy or ""):
        return None
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"proxy {proxy!r}: only http:// proxies are supported")
    headers: dict[str, str] = {}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(pair).decode()
    return parts.hostname, parts.port or 80, headers


def _env(name: str) -> str | None:
    return os.environ.get(name.lower()) or os.environ.get(name.upper()) or None


def _bypass(host: str, port: int, no_proxy: str) -> bool:
    """Whether ``NO_PROXY``'s rules (``*``, a domain and its subdomains, ``host:port``,
    an address or a CIDR block) name ``host``."""
    host = host.lower().strip("[]")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            import ipaddress

            try:
                if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and entry_port != str(port):
            continue
        name = name.lstrip(".").strip("[]")
        if host == name or host.endswith("." + name):
            return True
    return False


def shutdown(response: object) -> None:
    """Unblock a thread reading ``response``'s stream (close alone does not wake a
    blocked ``recv``)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
