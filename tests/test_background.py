"""The one background loop and the one backoff (vgpu_state.background)."""

from __future__ import annotations

import random
import threading

import pytest

from vgpu_state.background import BackgroundLoop, Backoff


class Counting(BackgroundLoop):
    def __init__(self, first: float | None, every: float | None, fail_first: bool = False) -> None:
        super().__init__("test-loop", first=first, after_error=0.01)
        self.every = every
        self.steps = 0
        self.fail_first = fail_first
        self.stepped = threading.Event()

    def step(self) -> float | None:
        self.steps += 1
        self.stepped.set()
        if self.fail_first and self.steps == 1:
            raise RuntimeError("the first step fails")
        return self.every


def test_a_loop_waits_for_wake_when_its_step_says_none() -> None:
    loop = Counting(first=None, every=None).start()
    try:
        assert not loop.stepped.wait(0.2), "no step before wake()"
        loop.wake()
        assert loop.stepped.wait(5)
        loop.stepped.clear()
        assert not loop.stepped.wait(0.2), "one step per wake()"
    finally:
        loop.stop()
    assert loop.steps == 1


def test_a_step_that_raises_is_run_again_and_stop_ends_the_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Counting(first=0, every=3600, fail_first=True)
    assert loop.start() is loop.start(), "start twice is one thread"
    try:
        for _ in range(100):
            if loop.steps >= 2:
                break
            loop.stepped.wait(0.1)
            loop.stepped.clear()
    finally:
        loop.stop(timeout=5)
    assert loop.steps == 2
    assert "test-loop failed; again in 0.0 s" in caplog.text
    assert loop._thread is not None and not loop._thread.is_alive()


def test_stop_before_start_and_stop_twice_are_harmless() -> None:
    loop = Counting(first=0, every=1)
    loop.stop()
    loop.stop()
    assert loop.steps == 0


def test_backoff_doubles_to_its_cap_without_jitter() -> None:
    backoff = Backoff(5.0, 300.0, jitter=False)
    assert [backoff.delay(n) for n in range(1, 9)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert backoff.delay(10_000) == 300.0, "a long run of failures does not overflow"


def test_jittered_backoff_stays_between_base_and_the_doubled_ceiling() -> None:
    backoff = Backoff(base=0.5, cap=8.0)
    rng = random.Random(7)
    delays = [backoff.delay(n, rng) for n in range(1, 11)]
    ceilings = [min(8.0, 0.5 * 2 ** (n - 1)) for n in range(1, 11)]
    assert delays[0] == 0.5
    assert all(0.5 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert max(delays[5:]) > 2.0, "later delays reach well above the base"


@pytest.mark.parametrize(("base", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_backoff_that_cannot_wait_is_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(base, cap)
