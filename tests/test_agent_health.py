"""The agent's /healthz, /readyz and /metrics endpoints, over real HTTP."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from vgpu_state.agent.health import HealthServer, HealthState, parse_listen
from vgpu_state.agent.metrics import AgentMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[HealthState, AgentMetrics, str, Clock]]:
    clock = Clock()
    state = HealthState(stuck_after=60, clock=clock)
    metrics = AgentMetrics()
    server = HealthServer(state, metrics, "127.0.0.1", 0).start()
    yield state, metrics, f"http://127.0.0.1:{server.port}", clock
    server.stop()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_ready_only_after_the_first_reconcile(
    served: tuple[HealthState, AgentMetrics, str, Clock],
) -> None:
    state, _, url, _ = served
    assert get(url + "/healthz")[0] == 200
    code, body = get(url + "/readyz")
    assert code == 503 and "no reconcile finished yet" in body
    state.reconcile_started()
    state.reconcile_finished(True, "converged: 4 vGPUs")
    assert get(url + "/readyz") == (200, "converged: 4 vGPUs\n")


def test_a_failed_reconcile_makes_the_agent_unready_but_alive(
    served: tuple[HealthState, AgentMetrics, str, Clock],
) -> None:
    state, _, url, _ = served
    state.reconcile_finished(False, "API server unreachable")
    assert get(url + "/readyz") == (503, "API server unreachable\n")
    assert get(url + "/healthz")[0] == 200


def test_a_reconcile_stuck_too_long_fails_liveness(
    served: tuple[HealthState, AgentMetrics, str, Clock],
) -> None:
    state, _, url, clock = served
    state.reconcile_started()
    clock.now += 30
    assert get(url + "/healthz")[0] == 200
    clock.now += 31
    code, body = get(url + "/healthz")
    assert code == 503 and "reconcile running for 61 s" in body
    state.reconcile_finished(True, "done")
    assert get(url + "/healthz")[0] == 200


def test_metrics_expose_what_the_agent_did(
    served: tuple[HealthState, AgentMetrics, str, Clock],
) -> None:
    _, metrics, url, _ = served
    metrics.reconcile_duration.labels(mode="enforce", result="success").observe(0.3)
    metrics.actions.labels(kind="create", result="ok").inc(2)
    metrics.set_vgpus({("NVIDIA A2-4Q", "free"): 3, ("NVIDIA A2-4Q", "in_use"): 1})
    metrics.blocked_items.set(1)
    metrics.last_success.set(1795000000)
    metrics.config_generation.set(2)
    code, body = get(url + "/metrics")
    assert code == 200
    assert (
        'vgpu_state_reconcile_duration_seconds_count{mode="enforce",result="success"} 1.0' in body
    )
    assert 'vgpu_state_actions_total{kind="create",result="ok"} 2.0' in body
    assert 'vgpu_state_vgpus{state="free",type="NVIDIA A2-4Q"} 3.0' in body
    assert "vgpu_state_blocked_items 1.0" in body
    assert "vgpu_state_last_successful_reconcile_timestamp_seconds 1.795e+09" in body
    assert "vgpu_state_config_generation 2.0" in body
    # A type that is gone from the node disappears from the gauge.
    metrics.set_vgpus({("NVIDIA A2-8Q", "free"): 2})
    body = get(url + "/metrics")[1]
    assert "A2-4Q" not in body and 'type="NVIDIA A2-8Q"' in body


def test_unknown_paths_are_404(served: tuple[HealthState, AgentMetrics, str, Clock]) -> None:
    assert get(served[2] + "/nope")[0] == 404


@pytest.mark.parametrize(
    ("value", "expected"),
    [(":9410", ("0.0.0.0", 9410)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9", ("::1", 9))],
)
def test_parse_listen(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["9410", "host:", ":99999", "host:http"])
def test_parse_listen_rejects_bad_values(value: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(value)


def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(request)
        answer = b""
        while piece := conn.recv(65536):
            answer += piece
    return answer


def test_only_get_and_head_of_well_formed_requests_are_answered(
    served: tuple[HealthState, AgentMetrics, str, Clock],
) -> None:
    _, _, url, _ = served
    head = _raw(url, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert b"Content-Length: " in head
    assert _raw(url, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").startswith(
        b"HTTP/1.0 405 "
    )
    long_header = b"X-Long: " + b"a" * 9000 + b"\r\n"
    assert _raw(url, b"GET /metrics HTTP/1.1\r\n" + long_header + b"\r\n").startswith(
        b"HTTP/1.0 400 "
    )
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(200))
    assert _raw(url, b"GET /metrics HTTP/1.1\r\n" + many + b"\r\n").startswith(b"HTTP/1.0 400 ")
    assert _raw(url, b"nonsense\r\n\r\n").startswith(b"HTTP/1.0 400 ")
