"""A deposed controller replica writes nothing: two real ``vgpu-state controller`` processes
on the real API server, each as the controller's ServiceAccount bound to its own pod, each
talking to the server through its own proxy in this test.

In every cycle the leader is held right after its list of node states — stopped
(SIGSTOP), or its network path stalled (its proxy holds every request, and passes them on,
late, when the stall ends) — until its Lease has expired and the other replica has taken
over and changed the KubeVirt CR; then it goes on. Counted in the server's audit log, it
makes no accepted CR write. Both directions alternate: the node stops reporting an entry
(the new leader removes it; the held replica's list still has it), or starts reporting one
(the new leader adds it; the held replica's list lacks it). Cycles per direction and mode:
``$VGPU_STATE_FENCING_CYCLES`` (default 20). The Lease lasts 2 s here (CLI flags).
"""

from __future__ import annotations

import contextlib
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

from tests.hostile_reports import LAYOUTS
from tests.realcluster import CONTROLLER_SA, CONTROLLER_USER, NAMESPACE, ControlPlane
from tests.test_controller_real import KUBEVIRT, NODESTATES, POD_NAME, _report, _scan
from vgpu_state.kube import lease
from vgpu_state.kube.permitted import OWNERSHIP_ANNOTATION
from vgpu_state.model.snapshot import NodeSnapshot

CYCLES = int(os.environ.get("VGPU_STATE_FENCING_CYCLES") or 20)
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
A2 = "nvidia.com/NVIDIA_A2-4Q"
WRITER_TERM = "vgpu-state.io/writer-term"
TIMINGS = ["--lease-seconds", "2", "--renew-deadline", "1.5", "--request-timeout", "0.5",
           "--interval", "0.2"]  # fmt: skip


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


def _patches(cluster: ControlPlane, mark: int, pod: str) -> list[int]:
    """The response codes of ``pod``'s patches of the KubeVirt CR since ``mark`` (audit log)."""
    return [
        int(e.get("responseStatus", {}).get("code", 0))
        for e in cluster.audit(mark, CONTROLLER_USER)
        if pod in (e.get("user", {}).get("extra", {}).get(POD_NAME) or [])
        and e["verb"] == "patch"
        and e.get("objectRef", {}).get("resource") == "kubevirts"
    ]


_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a replica that gave up on a held request closes its connection."""


@dataclass
class Proxy:
    """One replica's network path to the API server: plain HTTP in, TLS to the server out
    (the replica's bearer token passes through). It records when each request arrived, can
    hold every request on its way (a stalled path), and can run an action once, right after
    the server answered the replica's next list of node states and before that answer goes
    on to the replica."""

    cluster: ControlPlane
    arrivals: list[tuple[float, str]] = field(default_factory=list)
    flowing: threading.Event = field(default_factory=threading.Event)
    on_list: Callable[[], None] | None = None
    server: _Server | None = None

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
                proxy.arrivals.append((time.monotonic(), self.path))
                proxy.flowing.wait()  # a stalled path: on its way, late, once it flows again
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
                with contextlib.suppress(OSError):  # the replica may have given up
                    self.send_response(answer.status)
                    for key, value in answer.getheaders():
                        if key.lower() not in _HOP | {"content-length"}:
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            do_GET = do_PUT = do_PATCH = do_POST = do_DELETE = forward

        self.server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def lease_requests_since(self, moment: float) -> int:
        return sum(1 for at, path in list(self.arrivals) if at > moment and "/leases/" in path)

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

    def hold(self, mode: str) -> None:
        if mode == "paused":
            self.proc.send_signal(signal.SIGSTOP)
        else:
            self.proxy.flowing.clear()

    def resume(self, mode: str) -> None:
        if mode == "paused":
            self.proc.send_signal(signal.SIGCONT)
        else:
            self.proxy.flowing.set()


@contextlib.contextmanager
def replicas(cluster: ControlPlane, tmp_path: Path) -> Iterator[list[Replica]]:
    """Two ``vgpu-state controller`` processes (grace 0: an entry no node reports goes at the
    next pass), each as the controller's ServiceAccount bound to its own pod, each through
    its own :class:`Proxy`."""
    started: list[Replica] = []
    layouts = tmp_path / "layouts.yaml"
    layouts.write_text(LAYOUTS)
    try:
        for index, node in enumerate(("control-node", "control-node-2")):
            proxy = Proxy(cluster).start()
            token = cluster.agent_token(node, service_account=CONTROLLER_SA)
            config = tmp_path / f"c-{index}.kubeconfig"
            cluster.write_kubeconfig(config, token=token, server=proxy.url)
            log = tmp_path / f"c-{index}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "vgpu_state.cli.main", "controller",
                     "--kubeconfig", str(config), "--identity", f"c-{index}",
                     "--namespace", NAMESPACE, "--kubevirt", "kubevirt/kubevirt",
                     "--grace", "0", *TIMINGS, "--webhook-port", "0", "--listen", "",
                     "--config", "", "-f", str(layouts), "--log-level", "debug"],
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


def _wait(what: str, done: Callable[[], bool], both: list[Replica], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        for r in both:
            if r.proc.poll() is not None:
                pytest.fail(f"{r.identity} exited ({r.proc.returncode}):\n{r.log.read_text()}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"{r.identity}: ...{r.log.read_text()[-3000:]}" for r in both)
            pytest.fail(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.05)


def _lease(cluster: ControlPlane) -> dict[str, Any]:
    return dict(cluster.request("GET", f"{LEASES}/{lease.LEASE_NAME}") or {})


def _holder(cluster: ControlPlane) -> str | None:
    return (_lease(cluster).get("spec") or {}).get("holderIdentity")


def _as_wanted(cluster: ControlPlane, wanted: bool, leader: str | None = None) -> bool:
    """The CR lists A2 (or not) as the fleet wants, and the Lease is ``leader``'s if given."""
    return (A2 in _owned(_cr(cluster))) == wanted and leader in (None, _holder(cluster))


def _cycle(
    cluster: ControlPlane, both: list[Replica], mode: str, report: NodeSnapshot, wanted: bool
) -> str | None:
    """Hold the leader right after its list (whichever replica lists next: only the leader
    does); the node's report becomes ``report`` (its A2: ``wanted``); the other replica
    takes over and brings the CR there; the held one goes on. What it got accepted, if
    anything."""
    chosen: list[Replica] = []
    lock = threading.Lock()

    def arm(replica: Replica) -> Callable[[], None]:
        def hold() -> None:
            with lock:
                if not chosen:
                    for r in both:
                        r.proxy.on_list = None
                    replica.hold(mode)
                    chosen.append(replica)

        return hold

    for r in both:
        r.proxy.on_list = arm(r)
    _wait("the leader's list", lambda: bool(chosen), both)
    held = chosen[0]
    other = next(r for r in both if r is not held)
    _report(cluster, "gpu-1", report)
    _wait(
        f"{other.identity} leading, {'adding' if wanted else 'removing'} A2",
        lambda: _as_wanted(cluster, wanted, other.identity),
        both,
    )
    mark, resumed = cluster.audit_mark(), time.monotonic()
    held.resume(mode)
    # The held pass has ended once it asks about the Lease again (the next pass, or the
    # check of a replica that found a newer term's token in the CR).
    _wait(
        f"{held.identity}'s next pass",
        lambda: held.proxy.lease_requests_since(resumed) >= 1,
        both,
    )
    _wait("the CR as the fleet wants it", lambda: _as_wanted(cluster, wanted), both)
    codes = _patches(cluster, mark, held.pod)
    if any(200 <= code < 300 for code in codes):
        return f"{held.identity} got {codes} for its patches of the CR"
    return None


@pytest.mark.parametrize("mode", ["paused", "stalled"])
def test_a_replica_held_past_its_lease_makes_no_accepted_write(
    cluster: ControlPlane, tmp_path: Path, mode: str
) -> None:
    _kubevirt(cluster)
    with_a2 = _scan("a2-host.yaml", "gpu-1")
    reports = {True: with_a2, False: with_a2.model_copy(update={"gpus": ()})}
    _report(cluster, "gpu-1", with_a2)
    wanted = True
    accepted: list[str] = []
    started = time.monotonic()
    with replicas(cluster, tmp_path) as both:
        _wait("a leader that added A2", lambda: _as_wanted(cluster, True, None), both, 30)
        for cycle in range(2 * CYCLES):
            direction = "re-add" if wanted else "remove"
            wanted = not wanted
            wrote = _cycle(cluster, both, mode, reports[wanted], wanted)
            if wrote is not None:
                accepted.append(f"cycle {cycle} ({direction}): {wrote}")
        print(f"{2 * CYCLES} cycles ({mode}) in {time.monotonic() - started:.1f} s")
        assert accepted == [], (
            f"{len(accepted)} of {2 * CYCLES} cycles ({mode}) let a deposed replica write:\n"
            + "\n".join(accepted)
        )
        # The leader claimed the CR: its writer-term annotation is the current term's token.
        spec = _lease(cluster)["spec"]
        token = f"{spec['leaseTransitions']}/{spec['holderIdentity']}/{spec['acquireTime']}"
        _wait(
            "the CR claimed",
            lambda: _cr(cluster)["metadata"]["annotations"].get(WRITER_TERM) == token,
            both,
        )
