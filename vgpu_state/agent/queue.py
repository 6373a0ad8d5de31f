"""A coalescing work queue: any number of triggers while no reconcile runs yield one batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Batch:
    """The triggers gathered for one reconcile, first-seen order, without repeats."""

    reasons: tuple[str, ...]
    # Triggers folded into this batch, repeats included (a burst of 50 events -> 50).
    count: int


class WorkQueue:
    """Collect triggers; hand them out as one :class:`Batch` per reconcile.

    ``settle``: after the first trigger of a batch, wait this long for more
    (a ConfigMap update is several file events; a label edit may come with
    a status update) so a burst becomes one reconcile, not two.
    """

    def __init__(self, settle: float = 0.2, clock: Callable[[], float] = time.monotonic) -> None:
        self._settle = settle
        self._clock = clock
        self._cond = threading.Condition()
        self._reasons: dict[str, None] = {}
        self._count = 0
        self._first_at: float | None = None
        self._closed = False

    def trigger(self, reason: str) -> None:
        """Ask for a reconcile. Never blocks; safe from any thread."""
        with self._cond:
            if self._closed:
                return
            self._reasons.setdefault(reason, None)
            self._count += 1
            if self._first_at is None:
                self._first_at = self._clock()
            self._cond.notify_all()

    def close(self) -> None:
        """Wake the worker; :meth:`get` returns ``None`` from now on."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def pending(self) -> bool:
        with self._cond:
            return self._count > 0

    def get(self, timeout: float | None = None) -> Batch | None:
        """The next batch, once it has settled; ``None`` when closed or on timeout."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._closed:
                    return None
                now = self._clock()
                if self._first_at is not None:
                    ready_at = self._first_at + self._settle
                    if now >= ready_at:
                        batch = Batch(tuple(self._reasons), self._count)
                        self._reasons = {}
                        self._count = 0
                        self._first_at = None
                        return batch
                    wait = ready_at - now
                else:
                    wait = None
                if deadline is not None:
                    if now >= deadline:
                        return None
                    wait = deadline - now if wait is None else min(wait, deadline - now)
                self._cond.wait(wait)
