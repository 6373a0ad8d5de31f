"""What ``/readyz`` makes of the API server's answers (``vgpu_state.kube.apihealth``), on a
clock the test moves: not ready before the first answer nor once no probe succeeded for
the bound, each outage logged once with its cause and its end once. The real server
killing its etcd is ``tests/test_control_plane_faults.py``."""

from __future__ import annotations

import logging

import pytest

from vgpu_state.agent.health import HealthState
from vgpu_state.kube.apihealth import ApiServerHealth, failed_checks

SERVER = "https://api.example:6443"
ETCD_DOWN = (
    b"[+]ping ok\n[+]log ok\n[-]etcd failed: reason withheld\n"
    b"[-]etcd-readiness failed: reason withheld\n[+]informer-sync ok\n"
    b"readyz check failed\n"
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_ready_while_a_probe_succeeded_within_the_bound_and_each_outage_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    flips: list[bool] = []
    health = ApiServerHealth(SERVER, bound=10, clock=clock, on_change=flips.append)
    first = health.check()
    assert not first.ok and "has not been ready yet" in first.reason

    health.succeeded()
    assert health.check().ok
    caplog.set_level(logging.INFO, "vgpu_state.kube.apihealth")
    cause = failed_checks(500, ETCD_DOWN)
    for _ in range(10):  # failures within the bound: still ready, nothing logged
        clock.now += 1
        health.failed(cause)
        assert health.check().ok
    assert caplog.records == []

    for _ in range(20):  # past the bound: not ready, one error naming the cause
        clock.now += 1
        health.failed(cause)
        answer = health.check()
        assert not answer.ok
    assert "etcd failed: reason withheld; etcd-readiness failed" in answer.reason
    assert "has not been ready for 30 s" in answer.reason
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "etcd failed" in errors[0].getMessage()

    health.succeeded()
    assert health.check().ok
    recovered = [r.getMessage() for r in caplog.records if "ready again" in r.getMessage()]
    assert recovered == [f"the Kubernetes API server {SERVER} is ready again (after 19 s); ready"]
    assert flips == [True, False, True]


def test_the_bound_passes_without_any_probe_finishing() -> None:
    """A hung probe cannot keep an old success alive: readiness is its age."""
    clock = Clock()
    health = ApiServerHealth(SERVER, bound=10, clock=clock)
    health.succeeded()
    clock.now += 10.5
    answer = health.check()
    assert not answer.ok and "no probe has run yet" not in answer.reason


@pytest.mark.parametrize(
    ("status", "body", "cause"),
    [
        (
            500,
            ETCD_DOWN,
            "GET /readyz: HTTP 500: etcd failed: reason withheld; "
            "etcd-readiness failed: reason withheld",
        ),
        (503, b"", "GET /readyz: HTTP 503"),
        (
            403,
            b'{"kind":"Status","message":"forbidden"}',
            'GET /readyz: HTTP 403: {"kind":"Status","message":"forbidden"} (every authenticated '
            "identity may read /readyz through the ClusterRole system:public-info-viewer: "
            "check its binding to system:authenticated)",
        ),
    ],
)
def test_the_cause_is_the_servers_failed_checks(status: int, body: bytes, cause: str) -> None:
    assert failed_checks(status, body) == cause


def test_the_agent_is_unready_while_the_api_server_is_and_alive_all_along() -> None:
    clock = Clock()
    api = ApiServerHealth(SERVER, bound=10, clock=clock)
    state = HealthState(clock=clock, apiserver=api)
    api.succeeded()
    state.reconcile_finished(True, "converged")
    assert state.readiness().ok
    clock.now += 11
    ready = state.readiness()
    assert not ready.ok and SERVER in ready.reason
    assert state.liveness().ok
    api.succeeded()
    assert state.readiness().ok


def test_a_server_that_never_answers_is_an_outage_logged_once_after_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    flips: list[bool] = []
    health = ApiServerHealth(SERVER, bound=10, clock=clock, on_change=flips.append)
    caplog.set_level(logging.INFO, "vgpu_state.kube.apihealth")
    for _ in range(30):
        clock.now += 1
        health.failed("Kubernetes API server unreachable: connection refused")
        assert not health.check().ok
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"the Kubernetes API server {SERVER} has not been ready for 11 s (since the start): "
        "Kubernetes API server unreachable: connection refused; not ready until it is"
    ]
    assert flips == [False]
    health.succeeded()
    assert health.check().ok and flips == [False, True]
    assert "ready again (after 19 s)" in caplog.records[-1].getMessage()


def test_a_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="bound must be positive, got 0"):
        ApiServerHealth(SERVER, bound=0)
