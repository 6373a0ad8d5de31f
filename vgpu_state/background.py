"""Work on a daemon thread, and the wait after a failure: one home for both.

A :class:`BackgroundLoop` runs its :meth:`~BackgroundLoop.step` on a daemon
thread until :meth:`~BackgroundLoop.stop`. Each step says when it wants to
run again (seconds, or ``None``: only when :meth:`~BackgroundLoop.wake` is
called); :meth:`~BackgroundLoop.wake` runs it at once. A step that raises is
logged and runs again after ``after_error`` seconds, so no loop dies of an
error its step did not expect.

The agent's config watch, resync, holder watch and allocatable monitor, the
Node watch and the VGPUNodeState watch, the API server probe, the
ResourceSlice resync, the device plugin's supervisor, the renewal of a rollout
slot and the controller's webhook-certificate keeper are each one of these.

:class:`Backoff` is the one rule for how long to wait after failures in a
row: the Node watch, the KubeVirt CR's guarded write, the agent's failed
reconcile, the device plugin's registration and the re-registration of a
resource the kubelet lost each keep their count of failures and ask it.
"""

from __future__ import annotations

import logging
import random
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Self

log = logging.getLogger(__name__)

DEFAULT_AFTER_ERROR = 10.0
"""Seconds before a step that raised runs again, unless the loop says otherwise."""


def positive(what: str, seconds: float) -> float:
    """``seconds`` when above zero; else a :class:`ValueError` naming ``what``."""
    if not seconds > 0:
        raise ValueError(f"{what} must be positive, got {seconds:g}")
    return seconds


@dataclass(frozen=True)
class Backoff:
    """The wait after ``failures`` failures in a row: ``base * 2**(failures - 1)``, at most ``cap``.

    With ``jitter`` the wait is drawn uniformly between ``base`` and that
    ceiling, so clients that failed together do not all try again together.
    """

    base: float
    cap: float
    jitter: bool = True

    def __post_init__(self) -> None:
        positive("a backoff's base", self.base)
        if self.cap < self.base:
            raise ValueError(f"a backoff's cap ({self.cap:g}) is below its base ({self.base:g})")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1 for the first)."""
        ceiling = min(self.cap, self.base * 2.0 ** min(max(failures - 1, 0), 64))
        if not self.jitter:
            return ceiling
        return (rng or _RNG).uniform(self.base, ceiling)


_RNG = random.Random()


class BackgroundLoop(ABC):
    """Run :meth:`step` on a daemon thread named ``name`` until :meth:`stop`.

    ``first``: seconds before the first step (``0``: at once; ``None``: not
    until :meth:`wake`). ``after_error``: seconds before a step that raised
    runs again.
    """

    def __init__(
        self, name: str, *, first: float | None, after_error: float = DEFAULT_AFTER_ERROR
    ) -> None:
        self.name = name
        self._first = first
        self.after_error = after_error
        self.stopping = threading.Event()
        """Set by :meth:`stop`; a step that blocks waits on it too."""
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    @abstractmethod
    def step(self) -> float | None:
        """One round of the loop's work; returns the seconds until the next one
        (``None``: not until :meth:`wake`)."""

    def start(self) -> Self:
        """Start the thread (once; starting again does nothing)."""
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return self

    def wake(self) -> None:
        """Run the step now (from any thread; never blocks)."""
        self._wake.set()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the loop and wait up to ``timeout`` seconds for a running step to end."""
        self.stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        delay = self._first
        while not self.stopping.is_set():
            if delay is None or delay > 0:
                self._wake.wait(delay)
            self._wake.clear()
            if self.stopping.is_set():
                return
            try:
                delay = self.step()
            except Exception:  # the loop outlives any one step
                log.exception("%s failed; again in %.1f s", self.name, self.after_error)
                delay = self.after_error
