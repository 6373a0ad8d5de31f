"""The webhook's check of a layouts text, in a child process with a deadline.

One admission review must never cost the controller more than the API server waits for
it, nor take the process down. :class:`IsolatedCheck` runs each check in a child process
forked from a single-threaded fork server (``multiprocessing``'s ``forkserver``: never a
fork of the threaded controller), gives it :data:`CHECK_SECONDS` of wall time and a CPU
limit a little above that, and answers with a refusal when the child is late or dies
(a crash in a parser is one dead child, not a dead controller). At most ``slots`` checks
run at once; a review that finds none free within its deadline is refused as busy.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import resource
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from vgpu_state.catalog import Catalog

log = logging.getLogger(__name__)

CHECK_SECONDS = 4.0
"""Wall time one check may take, waiting for a free slot included. deploy/webhook.yaml
gives the webhook ``timeoutSeconds: 5``; reading the review, starting the child and
answering take about 0.1 s of the rest (bench/webhook_hostile.py)."""
SLOTS = 2
"""Checks that run at once (each a child process of one CPU at most)."""
MEMORY_BYTES = 256 * 1024 * 1024
"""Address space a child may add to what it starts with (a check of a 1 MiB ConfigMap of
real layouts needs about 60 MB); past it the check fails with ``MemoryError``, a denial."""

Verdict3 = tuple[bool, str, tuple[str, ...]]
"""(allowed, message, warnings): what a child sends back."""


def _child(
    conn: Connection,
    check: Callable[[str, Catalog, str], Verdict3],
    text: str,
    catalog: Catalog,
    key: str,
    cpu_seconds: int,
) -> None:  # pragma: no cover - runs in the child process
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    with contextlib.suppress(ValueError, OSError):
        pages = int(Path("/proc/self/statm").read_text().split()[0])
        limit = pages * resource.getpagesize() + MEMORY_BYTES
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with contextlib.suppress(OSError):
        # Out of memory in the controller's cgroup, the kernel ends a check first.
        Path("/proc/self/oom_score_adj").write_text("1000")
    try:
        conn.send(check(text, catalog, key))
    except BaseException as e:  # anything the check raises is a refusal
        conn.send((False, f"the layouts could not be checked: {type(e).__name__}: {e}", ()))
    finally:
        conn.close()


class IsolatedCheck:
    """Runs ``check(text, catalog, key)`` in a child process with a deadline."""

    def __init__(
        self,
        check: Callable[[str, Catalog, str], Verdict3],
        *,
        seconds: float = CHECK_SECONDS,
        slots: int = SLOTS,
        preload: tuple[str, ...] = (),
    ) -> None:
        self.check = check
        self.seconds = seconds
        self._slots = threading.BoundedSemaphore(slots)
        self._context: Any = multiprocessing.get_context("forkserver")
        if preload:
            self._context.set_forkserver_preload(list(preload))

    def start(self) -> None:
        """Start the fork server now, so the first review does not wait for it."""
        from multiprocessing import forkserver

        forkserver.ensure_running()

    def __call__(self, text: str, catalog: Catalog, key: str) -> Verdict3:
        deadline = time.monotonic() + self.seconds
        if not self._slots.acquire(timeout=self.seconds):
            return (
                False,
                f"the layouts could not be checked: {self.seconds:g} s passed waiting for "
                "one of the checks already running; try again",
                (),
            )
        try:
            return self._run(text, catalog, key, deadline)
        finally:
            self._slots.release()

    def _run(self, text: str, catalog: Catalog, key: str, deadline: float) -> Verdict3:
        receive, send = self._context.Pipe(duplex=False)
        cpu = max(1, int(self.seconds + 1))
        child = self._context.Process(
            target=_child,
            args=(send, self.check, text, catalog, key, cpu),
            name="vgpu-state-layouts-check",
            daemon=True,
        )
        try:
            child.start()
            send.close()
            if receive.poll(max(0.0, deadline - time.monotonic())):
                try:
                    answer: Verdict3 = receive.recv()
                    return answer
                except EOFError:
                    pass  # the child died before answering: the exit code says how
            else:
                child.kill()
                log.warning("layouts check killed after %g s", self.seconds)
                return (
                    False,
                    f"the layouts could not be checked within {self.seconds:g} s "
                    "(the webhook's time limit); run vgpu-state validate on them",
                    (),
                )
            child.join(1.0)
            code = child.exitcode
            why = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            log.warning("layouts check ended without an answer (%s)", why)
            return (False, f"the layouts could not be checked: the check ended with {why}", ())
        finally:
            receive.close()
            if child.is_alive():
                child.kill()
            if child.pid is not None:
                child.join(1.0)
