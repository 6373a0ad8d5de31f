"""The agent's coalescing work queue and its periodic resync."""

from __future__ import annotations

import threading
import time

from vgpu_state.agent.queue import WorkQueue
from vgpu_state.agent.resync import Resync


def test_a_burst_of_triggers_gives_one_batch() -> None:
    queue = WorkQueue(settle=0.05)
    for i in range(50):
        queue.trigger("config" if i % 2 else "node")
    batch = queue.get(timeout=2)
    assert batch is not None
    assert batch.reasons == ("node", "config")
    assert batch.count == 50
    assert queue.get(timeout=0.2) is None, "the burst must not leave a second batch behind"


def test_triggers_from_many_threads_while_the_worker_is_busy_coalesce() -> None:
    queue = WorkQueue(settle=0.0)
    queue.trigger("start")
    first = queue.get(timeout=1)
    assert first is not None and first.reasons == ("start",)
    # The worker "reconciles" while 8 threads trigger 100 times each.
    threads = [
        threading.Thread(target=lambda n=n: [queue.trigger(f"t{n}") for _ in range(100)])
        for n in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    second = queue.get(timeout=1)
    assert second is not None and second.count == 800
    assert sorted(second.reasons) == [f"t{n}" for n in range(8)]
    assert queue.get(timeout=0.1) is None


def test_a_trigger_during_a_reconcile_gives_exactly_one_more() -> None:
    queue = WorkQueue(settle=0.0)
    queue.trigger("a")
    assert queue.get(timeout=1) is not None
    queue.trigger("b")
    queue.trigger("b")
    batch = queue.get(timeout=1)
    assert batch is not None and batch.reasons == ("b",) and batch.count == 2


def test_the_settle_time_gathers_a_burst_spread_over_time() -> None:
    queue = WorkQueue(settle=0.3)
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(queue.get(timeout=5)))
    worker.start()
    queue.trigger("a")
    time.sleep(0.05)
    queue.trigger("b")
    worker.join()
    batch = got[0]
    assert batch is not None and batch.reasons == ("a", "b")  # type: ignore[attr-defined]


def test_close_wakes_a_waiting_worker_and_drops_later_triggers() -> None:
    queue = WorkQueue()
    got: list[object] = ["unset"]
    worker = threading.Thread(target=lambda: got.__setitem__(0, queue.get()))
    worker.start()
    queue.close()
    worker.join(2)
    assert not worker.is_alive() and got[0] is None
    queue.trigger("late")
    assert queue.get(timeout=0.1) is None


def test_resync_fires_periodically_until_stopped() -> None:
    queue = WorkQueue(settle=0.0)
    resync = Resync(lambda: queue.trigger("resync"), interval=0.05).start()
    batches = [queue.get(timeout=2) for _ in range(3)]
    resync.stop(timeout=2)
    assert all(b is not None and b.reasons == ("resync",) for b in batches)
    queue.get(timeout=0.1)  # drain one that may have fired while stopping
    assert queue.get(timeout=0.2) is None, "no resync after stop"


def test_every_trigger_has_its_metric_series_from_the_start() -> None:
    """The ``source`` label takes its values from :class:`Trigger`: every member is a
    series at 0 before anything fired, so a rate over it exists from the start."""
    from vgpu_state.agent.metrics import AgentMetrics
    from vgpu_state.agent.triggers import Trigger

    page = AgentMetrics().render().decode()
    series = {
        line.split('source="')[1].split('"')[0]
        for line in page.splitlines()
        if line.startswith("vgpu_state_triggers_total{")
    }
    assert series == {t.value for t in Trigger}
    assert {
        "start", "config", "node", "nodestate", "resync", "holders", "kubelet", "retry"
    } == series
