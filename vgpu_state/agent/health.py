"""``/healthz``, ``/readyz`` and ``/metrics`` over plain HTTP (one small server thread).

Liveness: the worker is alive and no single reconcile has run longer than
``stuck_after``. Readiness: the Kubernetes API server and its storage answer
(:mod:`vgpu_state.kube.apihealth`: a probe succeeded within its bound), the
agent has finished its first reconcile and the last one did not fail (a node
that is blocked or degraded by a config error is still ready: it reports; a
node whose last reconcile failed is not). Liveness never depends on the API
server: restarting the agent would not bring it back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
        handler = _handler_for(state, metrics)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
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


def _handler_for(state: HealthState, metrics: AgentMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "vgpu-state"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics.render(), CONTENT_TYPE_METRICS)
            elif path in ("/healthz", "/readyz"):
                probe = state.liveness() if path == "/healthz" else state.readiness()
                body = (probe.reason + "\n").encode()
                self._send(200 if probe.ok else 503, body, "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Probes every few seconds would flood the log; stay quiet."""

    return Handler
