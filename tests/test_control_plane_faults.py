"""The control plane's faults, named and survived: etcd killed, a Node deleted and
registered again under the garbage collector, a VGPUNodeState deleted by an admin.

A control plane of this module's own (upstream etcd and kube-apiserver,
``tests/realcluster.py``, ``deploy/`` installed): its etcd is killed and started
again on its data, and upstream's kube-controller-manager runs its garbage
collector in it, which the other modules' shared control plane must not see. The
agent runs as a process on a FUSE-simulated node with its pod-bound token, the
controller as a process with its own ServiceAccount's token, as their Deployment
and DaemonSet run them; every request either makes is checked by the shipped
RBAC and admission policies (a refusal fails the test).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_process import NODE, Running, running_agent, wait_for
from tests.apiserver import put_kubevirt
from tests.realcluster import ControlPlane, Unavailable, controller_manager

NODESTATES = "vgpu-state.io/v1alpha1/vgpunodestates"
OUTAGE = "has not been ready for"
RECOVERY = "is ready again"
REPO = Path(__file__).resolve().parent.parent


def _required(e: Exception) -> None:
    if os.environ.get("VGPU_STATE_REQUIRE_K8S") == "1":
        pytest.fail(f"a real control plane is required (VGPU_STATE_REQUIRE_K8S=1): {e}")
    pytest.skip(f"no real control plane: {e}")


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own control plane (etcd is killed in it; the GC runs in it)."""
    plane = ControlPlane(tmp_path_factory.mktemp("faults"))
    try:
        plane.start()
        plane.install()
    except Unavailable as e:
        plane.stop()
        _required(e)
    except BaseException:
        plane.stop()
        raise
    yield plane
    plane.stop()


@pytest.fixture
def cluster(plane: ControlPlane) -> Iterator[ControlPlane]:
    """The plane with a KubeVirt CR and the agent's Node; a ServiceAccount's request the
    server refused (RBAC, admission) fails the test."""
    mark = plane.audit_mark()
    plane.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4g"}}})
    put_kubevirt(plane)
    yield plane
    refused = [
        f"{e['verb']} {e['requestURI']} by {e['user']['username']}: "
        f"{e.get('responseStatus', {}).get('message', '')}"
        for e in plane.audit(mark, "system:serviceaccount:")
        if e.get("responseStatus", {}).get("code") in (403, 422)
    ]
    plane.reset()
    assert refused == [], "the API server refused a ServiceAccount's requests"


@pytest.fixture
def agent(cluster: ControlPlane, tmp_path: Path, require_fuse: None) -> Iterator[Running]:
    with running_agent(cluster, tmp_path) as running:
        proc = running.start()
        wait_for("the first reconcile", lambda: running.state() == "success", proc, 60)
        wait_for("the agent ready", lambda: running.get("/readyz")[0] == 200, proc, 30)
        yield running


class Controller:
    """``vgpu-state controller`` as a process: its ServiceAccount's token, bound to its pod."""

    SERVING = re.compile(r"serving /metrics(?:, /healthz and /readyz)? on [^ ]+:(\d+)$", re.M)

    def __init__(self, cluster: ControlPlane, tmp: Path) -> None:
        self.log = tmp / "controller.log"
        kubeconfig = cluster.controller_kubeconfig(tmp / "controller-kubeconfig")
        args = [
            sys.executable, "-m", "vgpu_state.cli.main", "controller",
            "--kubeconfig", str(kubeconfig), "--namespace", "vgpu-state",
            "--identity", "controller-0", "--interval", "2", "--webhook-port", "0",
            "--listen", "127.0.0.1:0", "--config", "",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args, cwd=REPO, stdout=self.log.open("a"), stderr=subprocess.STDOUT, text=True
        )

    def get(self, path: str) -> tuple[int, str]:
        found = self.SERVING.search(self.log.read_text(errors="replace"))
        if found is None:
            return 0, ""
        return _http(f"http://127.0.0.1:{found.group(1)}{path}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        print(self.log.read_text(errors="replace"))


@pytest.fixture
def controller(cluster: ControlPlane, tmp_path: Path) -> Iterator[Controller]:
    running = Controller(cluster, tmp_path)
    try:
        wait_for("the controller ready", lambda: running.get("/readyz")[0] == 200, running.proc)
        yield running
    finally:
        running.close()


def _http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()
    except OSError:
        return 0, ""


def _until(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``check()`` holds (polled every 0.2 s); fails after ``timeout``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - start


def _first_times(checks: dict[str, Callable[[], bool]], timeout: float) -> dict[str, float]:
    """Seconds until each check first held (all polled together every 0.2 s)."""
    start = time.monotonic()
    found: dict[str, float] = {}
    while len(found) < len(checks):
        for name, check in checks.items():
            if name not in found and check():
                found[name] = round(time.monotonic() - start, 1)
        if time.monotonic() - start > timeout:
            missing = sorted(set(checks) - set(found))
            raise AssertionError(f"after {timeout:.0f} s still waiting for {missing} ({found})")
        time.sleep(0.2)
    return found


def _log_since(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found is not None, f"no {name} in /metrics"
    return float(found.group(1))


def _etcd_outage(cluster: ControlPlane, agent: Running, controller: Controller) -> None:
    """etcd is down: both unready within 15 s; 30 s later it is back: both ready again."""
    unready = _first_times(
        {
            "agent": lambda: agent.get("/readyz")[0] == 503,
            "controller": lambda: controller.get("/readyz")[0] == 503,
        },
        30,
    )
    print(f"unready after etcd was killed: {unready}")
    assert max(unready.values()) <= 15, unready
    for who, reason in (("agent", agent.get("/readyz")), ("controller", controller.get("/readyz"))):
        assert reason[0] == 503 and "etcd" in reason[1], (who, reason)
    assert agent.get("/healthz")[0] == 200

    time.sleep(max(0.0, 30 - max(unready.values())))
    cluster.restart_etcd()
    ready = _first_times(
        {
            "apiserver": cluster.apiserver_ready,
            "agent": lambda: agent.get("/readyz")[0] == 200,
            "controller": lambda: controller.get("/readyz")[0] == 200,
        },
        60,
    )
    print(f"ready again after etcd's return: {ready}")
    # The API server itself waits for its etcd client's reconnect (a backoff of several
    # seconds after a 30 s outage). Both processes are ready within 15 s of etcd's
    # return, or, when the server itself was later than that, within 3 s of it.
    for who in ("agent", "controller"):
        assert ready[who] <= max(15.0, ready["apiserver"] + 3.0), ready


def test_etcd_killed_for_30_s_the_agent_and_the_controller_are_unready_then_ready_again(
    cluster: ControlPlane, agent: Running, controller: Controller
) -> None:
    agent_log, controller_log = agent.log.stat().st_size, controller.log.stat().st_size
    # Liveness has nothing to do with the API server (a restart would not bring it back).
    assert agent.get("/healthz")[0] == 200

    cluster.kill_etcd()
    try:
        _etcd_outage(cluster, agent, controller)
    finally:
        if cluster.etcd is not None and cluster.etcd.poll() is not None:
            cluster.restart_etcd()  # for the next test, whatever happened
            _until("the API server ready", cluster.apiserver_ready, 60)

    # Each logged the outage once, with its cause, and its end once.
    for name, path, offset in (
        ("agent", agent.log, agent_log),
        ("controller", controller.log, controller_log),
    ):
        text = _log_since(path, offset)
        outages = [line for line in text.splitlines() if OUTAGE in line]
        assert len(outages) == 1, f"{name}: {outages}"
        assert "etcd" in outages[0], outages[0]
        assert sum(RECOVERY in line for line in text.splitlines()) == 1, name
    agent_metrics = agent.get("/metrics")[1]
    controller_metrics = controller.get("/metrics")[1]
    for text in (agent_metrics, controller_metrics):
        assert _metric(text, "vgpu_state_apiserver_outages_total") == 1
        assert _metric(text, "vgpu_state_apiserver_reachable") == 1


def _nodestate(cluster: ControlPlane) -> dict[str, Any] | None:
    return cluster.get(NODESTATES, NODE)


def _node_owners(obj: dict[str, Any] | None) -> list[str]:
    refs = (obj or {}).get("metadata", {}).get("ownerReferences") or []
    return [r["uid"] for r in refs if r.get("kind") == "Node"]


def _register_again(cluster: ControlPlane) -> str:
    """Delete the Node and register it again under its name (as a kubelet does after a
    ``kubectl delete node``): the same name and labels, a new UID."""
    node = cluster.get("v1/nodes", NODE)
    assert node is not None
    cluster.delete("v1/nodes", NODE)
    _until("the Node gone", lambda: cluster.get("v1/nodes", NODE) is None, 30)
    labels = node["metadata"].get("labels") or {}
    again = cluster.write("v1/nodes", NODE, {"metadata": {"labels": labels}})
    assert again["metadata"]["uid"] != node["metadata"]["uid"]
    return str(again["metadata"]["uid"])


def _owned_by_dead_node(cluster: ControlPlane, name: str, uid: str) -> None:
    """A ConfigMap whose only owner is the Node with ``uid``: the garbage collector's
    witness (it is collected once the collector has seen that owner gone)."""
    cluster.request(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid}
                ],
            },
        },
    )


@pytest.fixture
def gc_built() -> None:
    """kube-controller-manager is there (built with the rest by ``hack/k8s/build.sh``)."""
    try:
        controller_manager()
    except Unavailable as e:
        _required(e)


def test_a_deleted_nodestate_is_back_within_5_s_and_follows_its_node_under_the_gc(
    gc_built: None, cluster: ControlPlane, agent: Running
) -> None:
    first = _nodestate(cluster)
    assert first is not None
    node_uid = cluster.get("v1/nodes", NODE)["metadata"]["uid"]  # type: ignore[index]
    assert _node_owners(first) == [node_uid]

    # An admin deletes it: the agent writes it again within seconds, not at its resync.
    cluster.delete(NODESTATES, NODE)
    back = _until("the VGPUNodeState back", lambda: _nodestate_so_far(cluster) != {}, 5)
    print(f"VGPUNodeState back after {back:.1f} s")
    again = _nodestate(cluster)
    assert again is not None and again["metadata"]["uid"] != first["metadata"]["uid"]
    assert _node_owners(again) == [node_uid]

    # The Node is deleted and registered again before any garbage collector runs: the
    # agent makes the new Node the owner of the same object.
    dead = node_uid
    node_uid = _register_again(cluster)
    _until("the new Node its owner", lambda: _node_owners(_nodestate(cluster)) == [node_uid], 15)
    _owned_by_dead_node(cluster, "owned-by-the-dead-node", dead)

    cluster.start_controller_manager()
    # The collector runs: what the dead Node owned is gone; the VGPUNodeState is not.
    _until(
        "the garbage collector to delete what the dead Node owned",
        lambda: cluster.get("v1/configmaps", "owned-by-the-dead-node", "default") is None,
        60,
    )
    kept = _nodestate(cluster)
    assert kept is not None and kept["metadata"]["uid"] == again["metadata"]["uid"]
    assert _node_owners(kept) == [node_uid]

    # Under the collector: the Node deleted and registered again. The collector deletes the
    # VGPUNodeState with the old Node (what the owner reference is for) unless the agent
    # moved its owner first; either way it is there, owned by the new Node, and stays.
    dead = node_uid
    node_uid = _register_again(cluster)
    _owned_by_dead_node(cluster, "owned-by-the-second-dead-node", dead)
    _until(
        "the garbage collector to delete what the second dead Node owned",
        lambda: cluster.get("v1/configmaps", "owned-by-the-second-dead-node", "default")
        is None,
        60,
    )
    _until("the VGPUNodeState back", lambda: _node_owners(_nodestate(cluster)) == [node_uid], 15)
    settled = _nodestate(cluster)
    _owned_by_dead_node(cluster, "owned-by-the-second-dead-node-too", dead)
    _until(
        "the garbage collector again",
        lambda: cluster.get("v1/configmaps", "owned-by-the-second-dead-node-too", "default")
        is None,
        60,
    )
    final = _nodestate(cluster)
    assert final is not None and settled is not None
    assert final["metadata"]["uid"] == settled["metadata"]["uid"]
    assert _node_owners(final) == [node_uid]


def _nodestate_so_far(cluster: ControlPlane) -> dict[str, Any]:
    found = cluster.get(NODESTATES, NODE)
    return dict((found or {}).get("status") or {})
