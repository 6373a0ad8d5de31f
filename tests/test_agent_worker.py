"""The reconcile worker: one reconcile per batch, retries, and a graceful SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from vgpu_state.agent.health import HealthState
from vgpu_state.agent.queue import Batch, WorkQueue
from vgpu_state.agent.worker import PassResult, Worker
from vgpu_state.background import Backoff


def test_each_batch_runs_one_reconcile_and_failures_are_retried() -> None:
    queue = WorkQueue(settle=0.0)
    health = HealthState()
    seen: list[tuple[str, ...]] = []
    results = iter([PassResult(False, "API down"), PassResult(True, "converged")])

    def reconcile(batch: Batch, stopping: threading.Event) -> PassResult:
        seen.append(batch.reasons)
        outcome = next(results)
        if outcome.ok:
            worker.request_stop()
        return outcome

    worker = Worker(queue, reconcile, health, backoff=Backoff(0.05, 300.0, jitter=False))
    queue.trigger("start")
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(5)
    assert not thread.is_alive()
    assert seen == [("start",), ("retry",)]


def test_waiting_is_retried_at_its_own_pace_and_failures_back_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node waiting for a rollout slot asks again after the delay it names, however
    long it waits; a failed reconcile's delay doubles, and waiting does not reset it."""
    queue = WorkQueue(settle=0.0)
    delays: list[float] = []

    class FiresAtOnce:
        """Stands in for ``threading.Timer``: records the delay, fires at once."""

        def __init__(self, delay: float, fn: Any, args: tuple[str, ...]) -> None:
            delays.append(delay)
            self.daemon = False
            self._fire = lambda: fn(*args)

        def start(self) -> None:
            self._fire()

        def cancel(self) -> None:
            return None

    monkeypatch.setattr("vgpu_state.agent.worker.threading.Timer", FiresAtOnce)
    waiting = PassResult(False, "waiting for a rollout slot", retry_in=7.5)
    results = iter(
        [PassResult(False, "API down"), PassResult(False, "API down")]
        + [waiting] * 6
        + [PassResult(False, "API down"), PassResult(True, "converged")]
    )

    def reconcile(batch: Batch, stopping: threading.Event) -> PassResult:
        outcome = next(results)
        if outcome.ok:
            worker.request_stop()
        return outcome

    worker = Worker(queue, reconcile, HealthState(), backoff=Backoff(5.0, 300.0, jitter=False))
    queue.trigger("start")
    worker.run()
    assert delays == [5.0, 10.0] + [7.5] * 6 + [20.0]


def test_an_exception_in_a_reconcile_does_not_kill_the_worker() -> None:
    queue = WorkQueue(settle=0.0)
    health = HealthState()
    calls: list[int] = []

    def reconcile(batch: Batch, stopping: threading.Event) -> PassResult:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        worker.request_stop()
        return PassResult(True, "ok")

    worker = Worker(queue, reconcile, health, backoff=Backoff(0.05, 300.0, jitter=False))
    queue.trigger("start")
    worker.run()
    assert len(calls) == 2
    assert not health.liveness().ok, "a stopped worker is not live"


def test_shutdown_hooks_run_in_order_even_when_one_fails() -> None:
    queue = WorkQueue(settle=0.0)
    order: list[str] = []
    worker = Worker(queue, lambda b, s: PassResult(True, ""), HealthState())

    def failing() -> None:
        order.append("watchers")
        raise OSError("already gone")

    worker.on_shutdown("watchers", failing)
    worker.on_shutdown("device plugin", lambda: order.append("device plugin"))
    worker.request_stop()
    worker.run()
    assert order == ["watchers", "device plugin"]


AGENT_LIKE = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    from vgpu_state.agent.health import HealthState
    from vgpu_state.agent.queue import WorkQueue
    from vgpu_state.agent.worker import PassResult, Worker

    log = Path(sys.argv[1])

    def note(line):
        with log.open("a") as f:
            f.write(line + "\\n")

    def reconcile(batch, stopping):
        for step in range(3):
            if stopping.is_set():
                note(f"stopped before step {step}")
                return PassResult(True, "stopped")
            note(f"step {step} start")
            time.sleep(0.4)
            note(f"step {step} done")
        return PassResult(True, "converged")

    queue = WorkQueue(settle=0.0)
    worker = Worker(queue, reconcile, HealthState())
    worker.install_signal_handlers()
    worker.on_shutdown("device plugin", lambda: note("device lists emptied"))
    queue.trigger("start")
    worker.run()
    note("exit")
    """
)


def test_sigterm_finishes_the_current_step_then_stops_the_device_plugin(tmp_path: Path) -> None:
    log = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, "-c", AGENT_LIKE, str(log)])
    try:
        deadline = time.monotonic() + 10
        while "step 0 start" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the reconcile never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
    assert log.read_text().splitlines() == [
        "step 0 start",
        "step 0 done",
        "stopped before step 1",
        "device lists emptied",
        "exit",
    ]
