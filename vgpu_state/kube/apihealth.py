"""Is the Kubernetes API server, and the storage behind it, answering? For ``/readyz``.

A process that only reads and writes the API server now and then (the agent
between its resyncs, the controller between passes) cannot tell from its own
requests that the server's storage is gone: a GET may be served from the
server's watch cache while etcd is down, and a write hangs until the server
gives up. :class:`ApiServerProbe` therefore asks the server itself, every
``period`` seconds (every second while it fails): ``GET /readyz``, which the
server answers 200 only while its own checks pass, among them ``etcd`` and
``etcd-readiness`` (the server asks etcd at most every second, however many
clients probe). Every authenticated identity may read ``/readyz``: the
ClusterRole ``system:public-info-viewer``, bound to ``system:authenticated`` in
every cluster, grants it.

:class:`ApiServerHealth` keeps the answers and tells ``/readyz`` the truth: not
ready before the first answer, nor once no probe has succeeded for ``bound``
seconds: readiness is the age of the last success, so a hung probe cannot keep
an old answer alive (and each probe has its own connect and read timeouts).
The start of an outage is logged once, with its cause (the server's failed
checks, or why nothing answered), and so is its end; ``on_change`` feeds the
metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from vgpu_state.background import BackgroundLoop
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.errors import ClusterError

log = logging.getLogger(__name__)

PROBE_PATH = "/readyz"
DEFAULT_PERIOD = 5.0
"""Seconds between two probes while the server answers ready."""
FAILING_PERIOD = 1.0
"""Seconds between two probes while it does not (its return is seen at once)."""
DEFAULT_BOUND = 10.0
"""Seconds without a successful probe after which the process is not ready."""
PROBE_TIMEOUT = (2.0, 6.0)
"""Connect and read timeout of one probe (the server takes about 4 s to say its storage
is down): a hung probe ends before :data:`DEFAULT_BOUND` has passed twice."""
MAX_IN_FLIGHT = 4
"""Probes open at once, at most (a failing one takes up to the timeout)."""
MAX_CAUSE = 500
"""Characters of a cause kept (the server's failed checks are short lines)."""

REACHABLE_METRIC = (
    "vgpu_state_apiserver_reachable",
    "1 while the Kubernetes API server and its storage answer (GET /readyz succeeded "
    "within the readiness bound); 0 before its first answer and during an outage.",
)
"""Name and help of the gauge the agent and the controller export."""
OUTAGES_METRIC = (
    "vgpu_state_apiserver_outages",
    "Outages of the Kubernetes API server or its storage seen (no successful GET /readyz "
    "within the readiness bound); each is logged once.",
)
"""Name and help of the counter the agent and the controller export (``_total``)."""


@dataclass(frozen=True)
class Answer:
    """Whether the API server is ready, and why not."""

    ok: bool
    reason: str


class ApiServerHealth:
    """The probes' answers; thread-safe; the clock is injectable for tests.

    ``server``: the API server's URL (for the messages). ``on_change(reachable)``
    is called when the server's state flips (also the first time it answers).
    """

    def __init__(
        self,
        server: str,
        bound: float = DEFAULT_BOUND,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not bound > 0:
            raise ValueError(f"the API server's readiness bound must be positive, got {bound:g}")
        self.server = server
        self.bound = bound
        self.on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._last_ok: float | None = None
        self._cause = "no probe has run yet"
        self._reachable = False
        self._down_since: float | None = None

    def succeeded(self) -> None:
        with self._lock:
            self._last_ok = self._clock()
            self._cause = "no probe has been answered since"
        self._update()

    def failed(self, cause: str) -> None:
        with self._lock:
            self._cause = cause[:MAX_CAUSE]
        self._update()

    def check(self) -> Answer:
        """For ``/readyz``: ready while a probe succeeded within ``bound`` seconds."""
        self._update()
        with self._lock:
            if self._reachable:
                return Answer(True, "ok")
            if self._last_ok is None:
                return Answer(
                    False,
                    f"the Kubernetes API server {self.server} has not been ready yet: "
                    f"{self._cause}",
                )
            since = self._clock() - self._last_ok
            return Answer(
                False,
                f"the Kubernetes API server {self.server} has not been ready for "
                f"{since:.0f} s: {self._cause}",
            )

    def _update(self) -> None:
        """Flip the state when the last success is within, or past, ``bound`` (or, before
        any success, when ``bound`` has passed since the start); log each flip once. Under
        the lock, so that two threads never report flips out of order."""
        with self._lock:
            now = self._clock()
            fresh = self._last_ok is not None and now - self._last_ok <= self.bound
            if fresh and not self._reachable:
                self._reachable = True
                if self._down_since is not None:
                    log.info(
                        "the Kubernetes API server %s is ready again (after %.0f s); ready",
                        self.server,
                        now - self._down_since,
                    )
                else:
                    log.info("the Kubernetes API server %s answers", self.server)
                self._down_since = None
            elif not fresh and (
                self._reachable
                or (self._down_since is None and now - self._started > self.bound)
            ):
                self._reachable = False
                self._down_since = now
                since = self._last_ok if self._last_ok is not None else self._started
                log.error(
                    "the Kubernetes API server %s has not been ready for %.0f s%s: %s; not "
                    "ready until it is",
                    self.server,
                    now - since,
                    "" if self._last_ok is not None else " (since the start)",
                    self._cause,
                )
            else:
                return
            if self.on_change is not None:
                self.on_change(self._reachable)


class ApiServerProbe(BackgroundLoop):
    """``GET /readyz`` every ``period`` seconds (every ``failing_period`` seconds while the
    server does not answer ready); the answers go to ``health``.

    Each probe runs on a short-lived thread of its own, so a slow answer (the server
    takes its etcd checks' timeouts, about 4 s, to say it is not ready) does not
    delay the next probe: the server's return is seen within ``failing_period`` plus
    one answer. At most :data:`MAX_IN_FLIGHT` probes are open at once. ``api``'s
    connection pool and credentials are used, with ``timeout`` instead of its own.
    """

    def __init__(
        self,
        api: KubeApi,
        health: ApiServerHealth,
        period: float = DEFAULT_PERIOD,
        failing_period: float = FAILING_PERIOD,
        timeout: tuple[float, float] = PROBE_TIMEOUT,
    ) -> None:
        super().__init__("vgpu-state-apiserver-probe", first=0, after_error=failing_period)
        self.api = api
        self.health = health
        self.period = period
        self.failing_period = failing_period
        self.timeout = timeout
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_ok = False

    def step(self) -> float:
        with self._lock:
            start = self._in_flight < MAX_IN_FLIGHT
            if start:
                self._in_flight += 1
            healthy = self._last_ok
        if start:
            threading.Thread(target=self._probe, name=f"{self.name}-once", daemon=True).start()
        return self.period if healthy else self.failing_period

    def _probe(self) -> None:
        try:
            ok = self.probe()
        finally:
            with self._lock:
                self._in_flight -= 1
        with self._lock:
            self._last_ok = ok

    def probe(self) -> bool:
        """One probe, on the calling thread; ``True`` when the server said it is ready."""
        try:
            status, body = self.api.answer(PROBE_PATH, self.timeout)
        except ClusterError as e:
            self.health.failed(str(e))
            return False
        if status == 200:
            self.health.succeeded()
            return True
        self.health.failed(failed_checks(status, body))
        return False

    def service(self) -> Callable[[], Callable[[], None]]:
        """Start with the process, stop with it (an agent's ``Service``)."""

        def start() -> Callable[[], None]:
            self.start()
            return lambda: self.stop(5)

        return start


def failed_checks(status: int, body: bytes) -> str:
    """The cause a ``/readyz`` answer other than 200 gives: the server's failed checks
    (``[-]etcd failed: ...``), or the status and the start of the body."""
    text = body.decode("utf-8", "replace")
    failed = [line[3:].strip() for line in text.splitlines() if line.startswith("[-]")]
    if failed:
        return f"GET {PROBE_PATH}: HTTP {status}: {'; '.join(failed)}"[:MAX_CAUSE]
    detail = " ".join(text.split())[:200]
    hint = ""
    if status in (401, 403):
        hint = (
            " (every authenticated identity may read /readyz through the ClusterRole "
            "system:public-info-viewer: check its binding to system:authenticated)"
        )
    return f"GET {PROBE_PATH}: HTTP {status}{': ' + detail if detail else ''}{hint}"
