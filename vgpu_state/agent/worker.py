"""The reconcile worker and the agent's shutdown.

One thread takes batches from the :class:`WorkQueue` and runs one reconcile per
batch; nothing else changes the host. On SIGTERM (or SIGINT) the worker lets
the reconcile in progress finish its current step, runs no further ones, and
the shutdown hooks run in order (the device plugin withdraws its devices last
of all). The process then exits 0.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from vgpu_state.agent.health import HealthState
from vgpu_state.agent.queue import Batch, WorkQueue
from vgpu_state.agent.triggers import Trigger
from vgpu_state.background import Backoff

log = logging.getLogger(__name__)

RETRY_BACKOFF = Backoff(5.0, 300.0, jitter=False)
"""The wait before a failed reconcile runs again (unless another trigger comes first)."""


@dataclass(frozen=True)
class PassResult:
    """What one reconcile amounted to, for the probes and the log.

    ``ok``: the agent did its job (converged, or reported why it could not, e.g.
    blocked or a config error); ``False`` means the reconcile itself failed
    and is retried.
    """

    ok: bool
    summary: str
    retry_in: float | None = None
    """Not ok, but not a failure either (e.g. waiting for a rollout slot): try again
    after this many seconds, without the failures' growing backoff."""
    failed: bool = False
    """The reconcile ended with an error (reported, e.g. a config that does not load, or
    to be retried): logged as a warning, whether or not it is retried."""

    @property
    def is_failure(self) -> bool:
        """A failure to log as one: :attr:`failed`, or not ok with no wait given."""
        return self.failed or (not self.ok and self.retry_in is None)


# reconcile(batch, stopping): ``stopping`` is set once shutdown is requested;
# a reconcile checks it between steps and returns early.
Reconcile = Callable[[Batch, threading.Event], PassResult]


class Worker:
    """Run ``reconcile`` for every batch until :meth:`request_stop`.

    ``backoff``: a failed reconcile is tried again after its delay (5 s doubling
    up to 5 minutes) unless another trigger comes first.
    """

    def __init__(
        self,
        queue: WorkQueue,
        reconcile: Reconcile,
        health: HealthState,
        backoff: Backoff = RETRY_BACKOFF,
    ) -> None:
        self.queue = queue
        self._reconcile = reconcile
        self._health = health
        self._backoff = backoff
        self.stopping = threading.Event()
        self._shutdown_hooks: list[tuple[str, Callable[[], None]]] = []
        self._retry_timer: threading.Timer | None = None
        self._failures = 0

    def on_shutdown(self, name: str, hook: Callable[[], None]) -> None:
        """Run ``hook`` after the last reconcile (hooks run in registration order)."""
        self._shutdown_hooks.append((name, hook))

    def request_stop(self, why: str = "stop requested") -> None:
        if not self.stopping.is_set():
            log.info("%s: finishing the current step, then stopping", why)
        self.stopping.set()
        self.queue.close()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the agent gracefully (main thread only)."""

        def handle(signum: int, frame: FrameType | None) -> None:
            self.request_stop(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def run(self) -> None:
        """Reconcile until stopped; then run the shutdown hooks. Returns normally."""
        try:
            while not self.stopping.is_set():
                batch = self.queue.get()
                if batch is None:
                    break
                self._run_one(batch)
        finally:
            self._cancel_retry()
            self._health.worker_stopped("shutting down")
            for name, hook in self._shutdown_hooks:
                try:
                    hook()
                except Exception:  # a failing hook must not keep the others from running
                    log.exception("shutdown step %r failed", name)

    def _run_one(self, batch: Batch) -> None:
        self._cancel_retry()
        self._health.reconcile_started()
        started = time.monotonic()
        try:
            outcome = self._reconcile(batch, self.stopping)
        except Exception as exc:  # the agent must outlive any one reconcile
            log.exception("reconcile failed")
            outcome = PassResult(False, f"reconcile failed: {exc}", failed=True)
        took = time.monotonic() - started
        self._health.reconcile_finished(outcome.ok, outcome.summary)
        log.log(
            logging.WARNING if outcome.is_failure else logging.INFO,
            "reconcile (%s; %d trigger(s)) took %.3f s: %s",
            ", ".join(batch.reasons),
            batch.count,
            took,
            outcome.summary,
        )
        if outcome.ok:
            self._failures = 0
        elif outcome.retry_in is not None:
            self._schedule_retry(outcome.retry_in)
        else:
            self._failures += 1
            self._schedule_retry()

    def _schedule_retry(self, delay: float | None = None) -> None:
        if self.stopping.is_set():
            return
        if delay is None:
            delay = self._backoff.delay(self._failures)
        timer = threading.Timer(delay, self.queue.trigger, args=(Trigger.RETRY,))
        timer.daemon = True
        timer.start()
        self._retry_timer = timer

    def _cancel_retry(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
