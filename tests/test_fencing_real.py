"""A deposed controller writes nothing, on the real API server, as the controller's own
ServiceAccount: every KubeVirt CR write carries its term's token, so a write of a term that
has ended is refused by the server however late it arrives.

* In-process (wall clocks injected, so a Lease expires without waiting): a write sent in a
  term that ended before it arrived is refused (422) and not retried; a Lease created anew
  (its count back at 0) is followed by a term numbered past the CR's token.
* Two real ``vgpu-state controller`` processes, each talking to the server through its own
  proxy in this test: the leader is held right after its list of node states — stopped
  (SIGSTOP), or its network path stalled — until the other replica has taken over and
  changed the CR; once it goes on, it makes no accepted CR write. Both directions: an entry
  the new leader removed is not re-added, an entry it added is not removed. Cycles per
  direction and mode: ``$VGPU_STATE_FENCING_CYCLES`` (default 20).
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import CONTROLLER_SA, CONTROLLER_USER, NAMESPACE, ControlPlane
from tests.test_controller_real import KUBEVIRT, NODESTATES, POD_NAME, _report, _scan
from vgpu_state.controller.run import Controller, ControllerSettings
from vgpu_state.kube import lease
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.fencing import WRITER_TERM_ANNOTATION, DeposedError, parse_token, term_of
from vgpu_state.kube.permitted import OWNERSHIP_ANNOTATION

CYCLES = int(os.environ.get("VGPU_STATE_FENCING_CYCLES") or 20)
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
A2 = "nvidia.com/NVIDIA_A2-4Q"
W0 = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)


def _kubevirt(cluster: ControlPlane) -> None:
    cluster.request(
        "POST",
        KUBEVIRT,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt"},
            "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": []}}},
        },
    )


def _cr(cluster: ControlPlane) -> dict[str, Any]:
    return dict(cluster.request("GET", f"{KUBEVIRT}/kubevirt"))


def _owned(cr: dict[str, Any]) -> set[str]:
    annotations = cr["metadata"].get("annotations") or {}
    return set(json.loads(annotations.get(OWNERSHIP_ANNOTATION, "[]")))


def _term(cr: dict[str, Any]) -> str | None:
    token = (cr["metadata"].get("annotations") or {}).get(WRITER_TERM_ANNOTATION)
    return None if token is None else str(token)


def _patches(cluster: ControlPlane, mark: int, pod: str) -> list[int]:
    """The response codes of ``pod``'s patches of the KubeVirt CR since ``mark`` (audit log)."""
    return [
        int(e.get("responseStatus", {}).get("code", 0))
        for e in cluster.audit(mark, CONTROLLER_USER)
        if pod in (e.get("user", {}).get("extra", {}).get(POD_NAME) or [])
        and e["verb"] == "patch"
        and e.get("objectRef", {}).get("resource") == "kubevirts"
    ]


def _controller(
    cluster: ControlPlane, tmp_path: Path, node: str, identity: str, wall: list[datetime.datetime]
) -> tuple[Controller, str]:
    """A controller replica in this process, as the controller's ServiceAccount bound to a pod
    on ``node``; its wall clock is ``wall[0]``."""
    token = cluster.agent_token(node, service_account=CONTROLLER_SA)
    api = KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / identity, token=token)))
    settings = ControllerSettings(identity=identity, grace=0.0)
    return Controller(api, settings, wall=lambda: wall[0]), f"{CONTROLLER_SA}-{node}"


def test_a_write_sent_in_a_term_that_ended_is_refused_and_not_retried(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """The leader's patch is held on its way until its Lease has expired and the other replica
    has taken over; that replica has nothing to change but claims the CR. The late patch
    reaches the server: refused, since its term's token is no longer the CR's, and the
    deposed replica re-checks the Lease and stops instead of planning again."""
    _kubevirt(cluster)
    wall_one, wall_two = [W0], [W0]
    one, pod_one = _controller(cluster, tmp_path, "control-node", "c-0", wall_one)
    two, _ = _controller(cluster, tmp_path, "control-node-2", "c-1", wall_two)
    two.settings = ControllerSettings(identity="c-1", grace=300.0)  # it keeps what nobody reports
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1"))
    assert one.run_once() is not None
    claimed = _cr(cluster)
    assert A2 in _owned(claimed) and _term(claimed) == one.term.token  # type: ignore[union-attr]
    # The node no longer reports A2: one removes it (grace 0), and its patch is held.
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1").model_copy(update={"gpus": ()}))
    real_patch = one.api.patch

    def held(path: str, body: Any, kind: Any) -> Any:
        wall_two[0] = W0 + datetime.timedelta(seconds=31)  # one's Lease has expired
        taken = two.run_once()
        assert taken is not None and taken.write.writes == 1 and not taken.write.changes
        return real_patch(path, body, kind)

    one.api.patch = held  # type: ignore[method-assign]
    mark = cluster.audit_mark()
    with pytest.raises(DeposedError):
        one.run_once()
    assert _patches(cluster, mark, pod_one) == [422], "refused once, not retried"
    after = _cr(cluster)
    assert A2 in _owned(after), "the deposed replica's removal did not land"
    assert _term(after) == two.term.token  # type: ignore[union-attr]
    assert not one.leading and one.term is None


def test_a_lease_created_anew_is_followed_by_a_term_past_the_crs(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """Someone deletes the Lease: the replica creates it again, its count back at 0, while
    the CR carries the token of term 0 of the old Lease. The replica does not take that for
    a newer term's forever: the Lease still shows its own term, so it starts one past the
    CR's, and claims the CR with it."""
    _kubevirt(cluster)
    wall = [W0]
    one, pod = _controller(cluster, tmp_path, "control-node", "c-0", wall)
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1"))
    assert one.run_once() is not None
    old = parse_token(_term(_cr(cluster)))
    assert old is not None and old.number == 0
    cluster.request("DELETE", f"{LEASES}/{lease.LEASE_NAME}")
    wall[0] = W0 + datetime.timedelta(seconds=1)
    with pytest.raises(DeposedError):
        one.run_once()
    shown = term_of(cluster.request("GET", f"{LEASES}/{lease.LEASE_NAME}"))
    assert shown is not None and shown.number == 1 and shown == one.term
    mark = cluster.audit_mark()
    again = one.run_once()
    assert again is not None and again.write.writes == 1
    assert _term(_cr(cluster)) == shown.token
    assert _patches(cluster, mark, pod) == [200]


# two controller processes ---------------------------------------------------------------
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


@dataclass
class Seen:
    arrived: float
    method: str
    path: str


@dataclass
class Proxy:
    """One replica's network path to the API server: plain HTTP in, TLS to the server out
    (the replica's bearer token passes through). It records each request, can hold every
    request on its way (a stalled path: held ones go on, late, when released), and can run
    an action once, right after the server answered the replica's next list of node
    states and before that answer goes on to the replica."""

    cluster: ControlPlane
    requests: list[Seen] = field(default_factory=list)
    flowing: threading.Event = field(default_factory=threading.Event)
    on_list: Callable[[], None] | None = None
    server: ThreadingHTTPServer | None = None

    def start(self) -> Proxy:
        self.flowing.set()
        proxy = self
        host, _, port = self.cluster.url.removeprefix("https://").partition(":")
        context = self.cluster.ssl_context(None)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                proxy.requests.append(Seen(time.monotonic(), self.command, self.path))
                proxy.flowing.wait()
                upstream = http.client.HTTPSConnection(host, int(port), context=context)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                upstream.close()
                action = proxy.on_list
                if action and self.command == "GET" and self.path.split("?")[0] == NODESTATES:
                    proxy.on_list = None
                    action()
                with contextlib.suppress(OSError):
                    self.send_response(answer.status)
                    for key, value in answer.getheaders():
                        if key.lower() not in _HOP | {"content-length"}:
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            do_GET = do_PUT = do_PATCH = do_POST = do_DELETE = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def lease_requests_since(self, moment: float) -> int:
        return sum(1 for r in self.requests if r.arrived > moment and "/leases/" in r.path)

    def close(self) -> None:
        self.flowing.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Replica:
    identity: str
    pod: str
    proxy: Proxy
    proc: subprocess.Popen[bytes]
    log: Path


LEASE_SECONDS = 2
TIMINGS = ["--lease-seconds", str(LEASE_SECONDS), "--renew-deadline", "1.5",
           "--request-timeout", "0.5", "--interval", "0.2"]  # fmt: skip


@contextlib.contextmanager
def replicas(cluster: ControlPlane, tmp_path: Path) -> Iterator[list[Replica]]:
    """Two ``vgpu-state controller`` processes (grace 0: an entry no node reports goes at the
    next pass), each as the controller's ServiceAccount bound to its own pod, each through
    its own :class:`Proxy`."""
    started: list[Replica] = []
    try:
        for index, node in enumerate(("control-node", "control-node-2")):
            proxy = Proxy(cluster).start()
            token = cluster.agent_token(node, service_account=CONTROLLER_SA)
            config = cluster.write_kubeconfig(tmp_path / f"c-{index}", token=token, server=proxy.url)
            log = tmp_path / f"c-{index}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "vgpu_state.cli.main", "controller",
                     "--kubeconfig", str(config), "--identity", f"c-{index}",
                     "--namespace", NAMESPACE, "--kubevirt", "kubevirt/kubevirt",
                     "--grace", "0", *TIMINGS, "--webhook-port", "0", "--listen", "",
                     "--config", "", "--log-level", "debug"],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                )  # fmt: skip
            started.append(Replica(f"c-{index}", f"{CONTROLLER_SA}-{node}", proxy, proc, log))
        yield started
    finally:
        for r in started:
            r.proxy.flowing.set()
            with contextlib.suppress(ProcessLookupError):
                r.proc.send_signal(signal.SIGCONT)
                r.proc.terminate()
        for r in started:
            try:
                r.proc.wait(10)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait(5)
            r.proxy.close()


def _wait(what: str, done: Callable[[], bool], replicas: list[Replica], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        for r in replicas:
            if r.proc.poll() is not None:
                pytest.fail(f"{r.identity} exited ({r.proc.returncode}):\n{r.log.read_text()}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"{r.identity}: ...{r.log.read_text()[-3000:]}" for r in replicas)
            pytest.fail(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.02)


def _leader(cluster: ControlPlane) -> tuple[str | None, str | None]:
    """The Lease's holder and its term's token."""
    found = cluster.request("GET", f"{LEASES}/{lease.LEASE_NAME}")
    term = term_of(found) if found else None
    return (term.holder, term.token) if term else (None, None)


def _claimed(cluster: ControlPlane, wanted: bool, leader: str | None = None) -> bool:
    """The CR is as the fleet wants it (A2 listed or not), claimed by the Lease's holder (who
    is ``leader`` when given)."""
    holder, token = _leader(cluster)
    cr = _cr(cluster)
    return (
        token is not None
        and _term(cr) == token
        and (A2 in _owned(cr)) == wanted
        and (leader is None or holder == leader)
    )


@pytest.mark.parametrize("mode", ["paused", "stalled"])
def test_a_replica_held_past_its_lease_makes_no_accepted_write(
    cluster: ControlPlane, tmp_path: Path, mode: str
) -> None:
    _kubevirt(cluster)
    with_a2 = _scan("a2-host.yaml", "gpu-1")
    without_a2 = with_a2.model_copy(update={"gpus": ()})
    _report(cluster, "gpu-1", with_a2)
    wanted = True
    accepted: list[str] = []
    with replicas(cluster, tmp_path) as both:
        by_name = {r.identity: r for r in both}
        _wait("a leader that claimed the CR", lambda: _claimed(cluster, True), both, 30)
        for cycle in range(2 * CYCLES):
            # re-add direction: the held leader's list still has A2, which the new leader
            # removes; remove direction: its list lacks A2, which the new leader adds.
            direction = "re-add" if wanted else "remove"
            holder, _ = _leader(cluster)
            assert holder is not None
            held, other = by_name[holder], next(r for r in both if r.identity != holder)
            listed = threading.Event()

            def hold(held: Replica = held, listed: threading.Event = listed) -> None:
                if mode == "paused":
                    held.proc.send_signal(signal.SIGSTOP)
                else:
                    held.proxy.flowing.clear()
                listed.set()

            held.proxy.on_list = hold
            _wait(f"{held.identity}'s list", listed.is_set, both, 10)
            wanted = not wanted
            _report(cluster, "gpu-1", with_a2 if wanted else without_a2)
            _wait(
                f"{other.identity} leading and {'adding' if wanted else 'removing'} A2",
                lambda: _claimed(cluster, wanted, other.identity),
                both,
                15,
            )
            mark, resumed = cluster.audit_mark(), time.monotonic()
            if mode == "paused":
                held.proc.send_signal(signal.SIGCONT)
            else:
                held.proxy.flowing.set()
            # Its pass has ended once it has begun two more (each begins at the Lease).
            _wait(
                f"{held.identity}'s next passes",
                lambda: held.proxy.lease_requests_since(resumed) >= 2,
                both,
                15,
            )
            codes = _patches(cluster, mark, held.pod)
            if any(200 <= c < 300 for c in codes):
                accepted.append(f"cycle {cycle} ({direction}): {held.identity} wrote {codes}")
            _wait("the CR as the fleet wants it", lambda: _claimed(cluster, wanted), both, 15)
    assert accepted == [], (
        f"{len(accepted)} of {2 * CYCLES} cycles ({mode}) let a deposed replica write:\n"
        + "\n".join(accepted)
    )
