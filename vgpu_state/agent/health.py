"""``/healthz``, ``/readyz`` and ``/metrics`` over plain HTTP (one small server thread).

The server answers ``GET`` (and ``HEAD``) of these three paths, one request per
connection (HTTP/1.0), on ``socketserver`` alone: ``http.server`` would cost the
agent most of a megabyte for what a probe and a scrape need. A request line or
header longer than 8 KiB, more than 100 headers, or a client silent for 10 s
ends the connection.

Liveness: the worker is alive and no single reconcile has run longer than
``stuck_after``. Readiness: the Kubernetes API server and its storage answer
(:mod:`vgpu_state.kube.apihealth`: a probe succeeded within its bound), the
agent has finished its first reconcile and the last one did not fail (a node
that is blocked or degraded by a config error is still ready: it reports; a
node whose last reconcile failed is not). Liveness never depends on the API
server: restarting the agent would not bring it back.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from vgpu_state.agent.metrics import AgentMetrics
from vgpu_state.kube.apihealth import ApiServerHealth

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Probe:
    ok: bool
    reason: str


class HealthState:
    """What the worker tells the probes. Thread-safe; the clock is injectable for tests."""

    def __init__(
        self,
        stuck_after: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
        apiserver: ApiServerHealth | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._apiserver = apiserver
        self._clock = clock
        self._stuck_after = stuck_after
        self._started_at: float | None = None
        self._finished_once = False
        self._last_ok = False
        self._last_reason = "no reconcile finished yet"
        self._worker_alive = True

    def reconcile_started(self) -> None:
        with self._lock:
            self._started_at = self._clock()

    def reconcile_finished(self, ok: bool, reason: str) -> None:
        with self._lock:
            self._started_at = None
            self._finished_once = True
            self._last_ok = ok
            self._last_reason = reason

    def worker_stopped(self, reason: str) -> None:
        with self._lock:
            self._worker_alive = False
            self._last_reason = reason

    def liveness(self) -> Probe:
        with self._lock:
            if not self._worker_alive:
                return Probe(False, f"worker stopped: {self._last_reason}")
            if self._started_at is not None:
                running = self._clock() - self._started_at
                if running > self._stuck_after:
                    return Probe(False, f"reconcile running for {running:.0f} s")
            return Probe(True, "ok")

    def readiness(self) -> Probe:
        live = self.liveness()
        if not live.ok:
            return live
        if self._apiserver is not None:
            api = self._apiserver.check()
            if not api.ok:
                return Probe(False, api.reason)
        with self._lock:
            if not self._finished_once:
                return Probe(False, self._last_reason)
            return Probe(self._last_ok, self._last_reason)


class HealthServer:
    """Serve the probes and metrics on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, state: HealthState, metrics: AgentMetrics, host: str, port: int) -> None:
        self._server = _Server((host, port), state, metrics)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="vgpu-state-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` (all interfaces) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address must be HOST:PORT or :PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


MAX_LINE = 8192
MAX_HEADERS = 100
CLIENT_TIMEOUT = 10.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


class _Server(socketserver.ThreadingTCPServer):
    """The probes' server: what its handlers answer from."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], state: HealthState, metrics: AgentMetrics
    ) -> None:
        self.state = state
        self.metrics = metrics
        super().__init__(address, _Handler)

    def answer(self, path: str) -> tuple[int, bytes, str]:
        """Status, body and content type for a GET of ``path``."""
        if path == "/metrics":
            return 200, self.metrics.render(), CONTENT_TYPE_METRICS
        if path in ("/healthz", "/readyz"):
            probe = self.state.liveness() if path == "/healthz" else self.state.readiness()
            body = (probe.reason + "\n").encode()
            return 200 if probe.ok else 503, body, "text/plain; charset=utf-8"
        return 404, b"not found\n", "text/plain; charset=utf-8"


class _Handler(socketserver.StreamRequestHandler):
    """One request: its line and headers (bounded), then the answer, then close."""

    timeout = CLIENT_TIMEOUT
    server: _Server

    def handle(self) -> None:
        try:
            line = self.rfile.readline(MAX_LINE + 1)
            for _ in range(MAX_HEADERS + 1):
                header = self.rfile.readline(MAX_LINE + 1)
                if header in (b"\r\n", b"\n", b"") or len(header) > MAX_LINE:
                    break
            else:
                header = b"x" * (MAX_LINE + 1)  # too many headers
        except OSError:  # the client went silent or away
            return
        parts = line.decode("latin-1").split()
        if not line or len(line) > MAX_LINE or len(header) > MAX_LINE or len(parts) != 3:
            self._send(400, b"bad request\n", "text/plain; charset=utf-8", head=False)
            self._drain()
            return
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            self._send(405, b"method not allowed\n", "text/plain; charset=utf-8", head=False)
            return
        code, body, content_type = self.server.answer(target.split("?", 1)[0])
        self._send(code, body, content_type, head=method == "HEAD")

    def _drain(self) -> None:
        """Read a little of what the client still sends, so that closing does not reset
        the connection before it reads the answer."""
        with contextlib.suppress(OSError):
            self.connection.settimeout(0.2)
            self.connection.shutdown(socket.SHUT_WR)
            for _ in range(16):
                if not self.connection.recv(65536):
                    break

    def _send(self, code: int, body: bytes, content_type: str, *, head: bool) -> None:
        lines = (
            f"HTTP/1.0 {code} {_REASONS[code]}",
            "Server: vgpu-state",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Connection: close",
        )
        with contextlib.suppress(OSError):  # the client went away
            self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head else body))
