"""Does the kubelet offer what the agent advertised? The ``KubeletAllocatable`` condition.

What an operator sees: the node's ``VGPUNodeState`` says whether the Node's
``status.allocatable`` holds, per device-plugin resource, as many vGPUs as the
device plugin advertises healthy; when the kubelet loses a resource (shows 0)
the condition turns False naming it, a Warning Event says the plugin
registers it again, and once the kubelet offers it again the condition is
True. A kubelet heartbeat costs nothing: no reconcile, no write.

The integration tests run the agent's parts in-process against the harness's
real kube-apiserver + etcd (the ``cluster`` fixture, ``tests/realcluster.py``),
talking as the agent's ServiceAccount with a token bound to a Pod on the node,
under the shipped RBAC and the installed CRD's validation (the fixture fails a
test on any 403; the ``running`` fixture on any 422 of the agent's). Beside
them: the device plugin's gRPC servers, the fake kubelet on a unix socket, and
:class:`tests.kubelet_node.KubeletNodeStatus`, which writes the Node's
``status.capacity``/``allocatable`` from the lists the fake kubelet receives,
as a real kubelet does (as the admin, through the status subresource). The
agent's writes are counted from the server's audit log; the successive
``KubeletAllocatable`` conditions are read from an admin's watch of the
``VGPUNodeState``. No test here needs a fault only an emulator can make.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.agent_process import A2_SPEC, CONFIG, NODE
from tests.apiserver import NODESTATES
from tests.builders import V, build_gpu, build_snapshot
from tests.kubelet_node import KubeletNodeStatus
from tests.realcluster import AGENT_USER, WRITE_VERBS, ControlPlane, api_path
from vgpu_state.agent.allocatable import AllocatableMonitor
from vgpu_state.agent.assemble import allocatable_monitor
from vgpu_state.agent.cluster import AgentCluster, ClusterSink
from vgpu_state.agent.metrics import AgentMetrics
from vgpu_state.agent.run import Agent, AgentParts, node_watch_starter
from vgpu_state.agent.triggers import Trigger
from vgpu_state.catalog import default_catalog
from vgpu_state.config import FileConfigSource
from vgpu_state.deviceplugin import DevicePluginManager
from vgpu_state.kube.api import KubeApi
from vgpu_state.model.allocatable import AllocatableReason, check, extended_counts
from vgpu_state.model.inuse import InUse
from vgpu_state.model.policy import Publish
from vgpu_state.model.publish import split
from vgpu_state.model.status import (
    Condition,
    ConditionType,
    ConfigState,
    EventType,
    NodeStatus,
)
from vgpu_state.reconcile import Ports, Settings
from vgpu_state.sim.node import open_sim
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet

CATALOG = default_catalog()
REPO = Path(__file__).resolve().parent.parent
LABEL = "nvidia.com/vgpu.config"
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"
GRACE = 1.0


# the verdict (pure) ----------------------------------------------------------------------
def test_allocatable_as_advertised_is_true_and_other_resources_are_not_looked_at() -> None:
    verdict = check(
        {"nvidia.com/A2-4Q": 2, "nvidia.com/A2-4C": 1},
        withdrawn=["nvidia.com/A2-4A", "nvidia.com/A2-8Q"],
        allocatable={
            "nvidia.com/A2-4Q": 2,
            "nvidia.com/A2-4C": 1,
            "nvidia.com/A2-4A": 0,  # withdrawn: 0 is right, and so is absent (A2-8Q)
            "nvidia.com/gpu": 4,  # another plugin's resource
        },
        settled=True,
    )
    assert verdict.status is True and verdict.reason is AllocatableReason.MATCHES
    assert verdict.message == "allocatable as advertised: nvidia.com/A2-4C: 1, nvidia.com/A2-4Q: 2"


def test_a_difference_is_unknown_within_the_grace_and_false_after_naming_each_resource() -> None:
    args: dict[str, Any] = {
        "advertised": {"nvidia.com/A2-4Q": 2, "nvidia.com/A2-4C": 1},
        "withdrawn": ["nvidia.com/A2-4A"],
        "allocatable": {"nvidia.com/A2-4C": 1, "nvidia.com/A2-4A": 1},
    }
    waiting = check(**args, settled=False, grace=40)
    assert waiting.status is None and waiting.reason is AllocatableReason.AWAITING_KUBELET
    assert "waiting up to 40 s" in waiting.message
    verdict = check(**args, settled=True)
    assert verdict.status is False and verdict.reason is AllocatableReason.MISMATCH
    assert verdict.message == (
        "nvidia.com/A2-4Q: advertised 2, allocatable absent; "
        "nvidia.com/A2-4A: advertised 0 (withdrawn), allocatable 1"
    )
    assert [c.resource for c in verdict.lost] == ["nvidia.com/A2-4Q"], "only 0 of >0 is lost"
    unread = check({"nvidia.com/A2-4Q": 2}, [], None, settled=True)
    assert unread.status is None and unread.reason is AllocatableReason.NODE_UNREAD


def test_only_whole_numbers_of_extended_resources_are_device_counts() -> None:
    counts = extended_counts(
        {"cpu": "8", "memory": "32Gi", "nvidia.com/A2-4Q": "3", "example.com/fpga": "500m"}
    )
    assert counts == {"nvidia.com/A2-4Q": 3}


# the monitor, on a clock the test moves ------------------------------------------------
class Plugin:
    def __init__(self, advertised: dict[str, int]) -> None:
        self.lists = dict(advertised)
        self.regs = dict.fromkeys(advertised, 1)
        self.asked: list[str] = []

    def advertised(self) -> Mapping[str, int]:
        return dict(self.lists)

    def registrations(self) -> Mapping[str, int]:
        return dict(self.regs)

    def reregister(self, resource: str) -> bool:
        self.asked.append(resource)
        return resource in self.lists


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(allocatable: dict[str, int]) -> dict[str, Any]:
    values = {"cpu": "8", **{r: str(n) for r, n in allocatable.items()}}
    return {"metadata": {"name": NODE}, "status": {"allocatable": values, "capacity": values}}


def test_a_lost_resource_is_registered_again_once_per_grace_with_backoff_until_it_matches() -> None:
    plugin, clock = Plugin({A2_4Q: 2}), Clock()
    monitor = AllocatableMonitor(plugin, grace=40, clock=clock)
    monitor.metrics = AgentMetrics()
    events: list[tuple[str, str, EventType]] = []
    monitor.event = lambda reason, message, kind: events.append((reason, message, kind))
    written: list[tuple[bool | None, str]] = []

    def publish() -> bool:
        verdict = monitor.condition()
        written.append((verdict.status, verdict.message))
        monitor.written(verdict)
        return True

    monitor.publish = publish
    monitor.node_seen(node({A2_4Q: 2}))
    monitor.tick()
    assert written == [(True, f"allocatable as advertised: {A2_4Q}: 2")]

    clock.now += 100  # the kubelet loses it long after the last list: False at once
    monitor.node_seen(node({A2_4Q: 0}))
    assert monitor.tick() == pytest.approx(40)
    assert written[-1] == (False, f"{A2_4Q}: advertised 2, allocatable 0")
    assert plugin.asked == [], "not before the mismatch lasted the grace period"
    assert [e[0] for e in events] == ["AllocatableMismatch"]

    heals = []
    for step in range(0, 400, 5):  # 400 s of the kubelet never coming back
        clock.now += 5
        monitor.tick()
        if len(plugin.asked) > len(heals):
            heals.append(step + 5)
    assert heals == [40, 80, 160, 320], "once per grace period, the interval doubling"
    assert len(written) == 2, "a steady mismatch is written once"
    reregistered = [e for e in events if e[0] == "DevicePluginReregistered"]
    assert len(reregistered) == 4 and all(e[2] is EventType.WARNING for e in reregistered)
    assert f"{A2_4Q}: advertised 2, allocatable 0" in reregistered[0][1]
    metrics = monitor.metrics.render().decode()
    assert "vgpu_state_kubelet_allocatable_mismatched_resources 1.0" in metrics
    assert f'vgpu_state_device_plugin_reregistrations_total{{resource="{A2_4Q}"}} 4.0' in metrics

    # The kubelet offers it again: True, and the backoff starts over for the next loss.
    monitor.node_seen(node({A2_4Q: 2}))
    monitor.tick()
    assert written[-1][0] is True
    assert (
        "vgpu_state_kubelet_allocatable_mismatched_resources 0.0"
        in monitor.metrics.render().decode()
    )
    clock.now += 100
    monitor.node_seen(node({A2_4Q: 0}))
    monitor.tick()
    clock.now += 40
    monitor.tick()
    assert len(plugin.asked) == 5


def test_a_changed_list_gives_the_kubelet_the_grace_period_before_false() -> None:
    plugin, clock = Plugin({A2_4Q: 1}), Clock()
    monitor = AllocatableMonitor(plugin, grace=40, clock=clock)
    monitor.node_seen(node({A2_4Q: 1}))
    assert monitor.condition().status is True
    plugin.lists[A2_4Q] = 2  # an apply added one
    assert monitor.condition().reason is AllocatableReason.AWAITING_KUBELET
    assert monitor.tick() == pytest.approx(40)
    clock.now += 39
    assert monitor.condition().status is None
    clock.now += 1
    verdict = monitor.condition()
    assert verdict.status is False and verdict.message == f"{A2_4Q}: advertised 2, allocatable 1"
    assert monitor.tick() is None and plugin.asked == [], "1 of 2 is a mismatch, not a loss"


# the agent, in-process, with real parts --------------------------------------------------
def agent_requests(kube: ControlPlane, since: int) -> list[dict[str, Any]]:
    """What the agent's ServiceAccount asked the server since ``since``, from its audit log."""
    return kube.audit(since, AGENT_USER)


def writes(requests: list[dict[str, Any]]) -> list[str]:
    """The writes among ``requests``: ``"update vgpunodestates/status"`` and the like."""
    return [
        f"{e['verb']} {e['objectRef'].get('resource')}"
        + (f"/{e['objectRef']['subresource']}" if e["objectRef"].get("subresource") else "")
        for e in requests
        if e["verb"] in WRITE_VERBS
    ]


class StatusVersions:
    """Every version of the node's ``VGPUNodeState`` the server stores, in order, as an
    admin's watch delivers them (the watch ends every second and resumes where it was)."""

    def __init__(self, kube: ControlPlane) -> None:
        self.kube = kube
        self.versions: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._from = self._listed_version()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _listed_version(self) -> str:
        """Where the watch starts: the list's version."""
        listed = self.kube.request("GET", api_path(NODESTATES))
        return str(listed["metadata"]["resourceVersion"])

    def _run(self) -> None:
        while not self._stop.is_set():
            query = urllib.parse.urlencode(
                {
                    "watch": "1",
                    "fieldSelector": f"metadata.name={NODE}",
                    "resourceVersion": self._from,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": "1",
                }
            )
            url = f"{self.kube.url}{api_path(NODESTATES)}?{query}"
            with urllib.request.urlopen(url, timeout=10, context=self.kube.ssl_context()) as r:
                for line in r:
                    event = json.loads(line)
                    assert event["type"] != "ERROR", event
                    self._from = str(event["object"]["metadata"]["resourceVersion"])
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.versions.append(event["object"])

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)

    def upto_now(self) -> list[dict[str, Any]]:
        """Every version so far, the one the server holds now included."""
        found = self.kube.get(NODESTATES, NODE)
        assert found is not None
        now = found["metadata"]["resourceVersion"]
        wait_for(
            "the watch to deliver the stored version",
            lambda: any(v["metadata"]["resourceVersion"] == now for v in self.versions),
        )
        return list(self.versions)


class InProcess:
    """The agent's parts in this process, talking to the server as the agent's
    ServiceAccount (its token bound to a Pod on the node, as a DaemonSet's pod gets it)."""

    def __init__(self, kube: ControlPlane, tmp: Path) -> None:
        self.kube = kube
        self.plugin_dir = tempfile.mkdtemp(prefix="dp-", dir="/tmp")
        self.kubelet = DevicePluginKubelet(self.plugin_dir)
        self.kubelet.start()
        self.node_status = KubeletNodeStatus(kube, NODE, self.kubelet)
        self.sim = open_sim(A2_SPEC)
        token = kube.agent_token(NODE)
        self.api = KubeApi(kube.api_client(token), kube.url, (5.0, 10.0))
        self.cluster = AgentCluster(self.api, NODE, pod_resources=None, in_use_source=InUse)
        self.plugin = DevicePluginManager(
            self.plugin_dir, present=lambda device: True, poll_interval=0.02
        )
        self.monitor = allocatable_monitor(self.cluster, self.plugin, GRACE)
        sink = ClusterSink(self.cluster, self.plugin)
        config_dir = tmp / "config"
        config_dir.mkdir()
        (config_dir / "config.yaml").write_text(CONFIG)
        ports = Ports(
            self.sim.host,
            self.cluster,
            FileConfigSource(config_dir / "config.yaml", catalog=CATALOG),
            sink,
            sink.dra_channel(None),
        )
        parts = AgentParts(
            ports=ports,
            settings=Settings(catalog=CATALOG),
            config_dir=config_dir,
            mode="enforce",
            listen=None,
            resync_seconds=3600,
            trigger_sources=[
                node_watch_starter(kube.api_client(token), NODE, on_node=self.monitor.node_seen)
            ],
            services=[self.monitor.service()],
            shutdown=[("device plugin", self.plugin.stop)],
            allocatable=self.monitor,
        )
        self.agent = Agent(parts, settle=0.05)
        self.triggers: list[str] = []
        queue_trigger = self.agent.queue.trigger

        def trigger(reason: str) -> None:
            self.triggers.append(reason)
            queue_trigger(reason)

        self.agent.queue.trigger = trigger  # type: ignore[method-assign]
        self.thread = threading.Thread(
            target=self.agent.run, kwargs={"install_signals": False}, daemon=True
        )
        self.statuses = StatusVersions(kube)

    def close(self) -> None:
        self.agent.stop()
        self.thread.join(30)
        self.statuses.stop()
        self.kubelet.stop()
        self.sim.close()
        shutil.rmtree(self.plugin_dir, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        found = self.kube.get(NODESTATES, NODE)
        return dict((found or {}).get("status") or {})

    def condition(self) -> dict[str, Any]:
        by_type = {c["type"]: c for c in self.status().get("conditions", [])}
        return dict(by_type.get("KubeletAllocatable") or {})

    def versions(self) -> tuple[str, str]:
        node, state = self.kube.get("v1/nodes", NODE), self.kube.get(NODESTATES, NODE)
        assert node is not None and state is not None
        return node["metadata"]["resourceVersion"], state["metadata"]["resourceVersion"]

    def conditions_written(self) -> list[dict[str, Any]]:
        """Every ``KubeletAllocatable`` condition the status held, in order."""
        out: list[dict[str, Any]] = []
        for version in self.statuses.upto_now():
            for c in (version.get("status") or {}).get("conditions", []):
                if c["type"] == "KubeletAllocatable" and (not out or out[-1] != c):
                    out.append(c)
        return out

    def label(self, value: str) -> None:
        """``kubectl label node --overwrite`` by the cluster's admin."""
        self.kube.write("v1/nodes", NODE, {"metadata": {"labels": {LABEL: value}}})


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def running(cluster: ControlPlane, tmp_path: Path) -> Iterator[InProcess]:
    mark = cluster.audit_mark()
    cluster.write("v1/nodes", NODE, {"metadata": {"labels": {LABEL: "a2-4g"}}})
    agent = InProcess(cluster, tmp_path)
    agent.thread.start()
    try:
        yield agent
    finally:
        agent.close()
    refused = [
        f"{e['verb']} {e['requestURI']}: {e['responseStatus']['code']}"
        for e in agent_requests(cluster, mark)
        if e.get("responseStatus", {}).get("code") == 422
    ]
    assert not refused, f"the API server refused the agent's invalid writes: {refused}"


def true_with(agent: InProcess, text: str) -> Callable[[], bool]:
    return lambda: (
        agent.condition().get("status") == "True" and text in agent.condition().get("message", "")
    )


def test_after_a_label_change_the_kubelet_offers_the_new_counts(running: InProcess) -> None:
    wait_for("True at start", true_with(running, f"{A2_4Q}: 1"))
    assert running.condition()["reason"] == "AllocatableMatches"
    assert running.condition()["message"] == (
        "allocatable as advertised: nvidia.com/NVIDIA_A2-4A: 1, nvidia.com/NVIDIA_A2-4C: 1, "
        f"{A2_4Q}: 1"
    )

    running.label("grow")
    wait_for("True with two A2-4Q", true_with(running, f"{A2_4Q}: 2"))
    capacity = {c["resourceName"]: c["total"] for c in running.status()["capacity"]}
    assert capacity[A2_4Q] == 2
    node = running.kube.get("v1/nodes", NODE)
    assert node is not None and node["status"]["allocatable"][A2_4Q] == "2"


def test_a_lost_resource_turns_false_is_registered_again_and_turns_true(
    running: InProcess,
) -> None:
    wait_for("True at start", true_with(running, f"{A2_4Q}: 1"))
    registered = sum(r.resource == A2_4Q for r in running.kubelet.registrations)

    # The kubelet loses the A2-4Q plugin without telling it: allocatable 0.
    running.node_status.lose(A2_4Q)
    wait_for(
        "registered again",
        lambda: sum(r.resource == A2_4Q for r in running.kubelet.registrations) > registered,
    )
    wait_for("True again", true_with(running, f"{A2_4Q}: 1"))

    statuses = [(c["status"], c["reason"], c["message"]) for c in running.conditions_written()]
    lost = f"{A2_4Q}: advertised 1, allocatable 0, capacity 1"  # the kubelet still counts it
    assert ("False", "AllocatableMismatch", lost) in statuses
    assert statuses[-1][0] == "True"
    events = [e for e in running.kube.all("v1/events") if e["reason"] == "DevicePluginReregistered"]
    assert events and events[0]["type"] == "Warning"
    assert lost in events[0]["message"]
    assert events[0]["involvedObject"]["name"] == NODE
    assert set(running.monitor.reregistered) == {A2_4Q}, "only the lost resource"
    metrics = running.agent.metrics.render().decode()
    assert f'vgpu_state_device_plugin_reregistrations_total{{resource="{A2_4Q}"}}' in metrics


def test_a_heartbeat_costs_no_reconcile_no_check_no_write_and_a_resync_no_write(
    running: InProcess,
) -> None:
    wait_for("True at start", true_with(running, f"{A2_4Q}: 1"))
    quiet: list[tuple[str, str]] = []

    def settled() -> bool:  # nothing written for a few polls in a row
        quiet.append(running.versions())
        return len(quiet) >= 5 and len(set(quiet[-5:])) == 1 and not running.agent.queue.pending()

    wait_for("a quiet node", settled)
    node_rv, status_rv = running.versions()
    triggers, seen = len(running.triggers), running.monitor.nodes_seen
    evaluations = running.monitor.evaluations
    # The audit log names the agent's writes (its status, among others, before the quiet).
    before_quiet = writes(agent_requests(running.kube, running.kube.test_mark))
    assert "update vgpunodestates/status" in before_quiet
    mark = running.kube.audit_mark()

    heartbeat_rv = running.node_status.heartbeat()
    wait_for("the watch saw the heartbeat", lambda: running.monitor.node_version == heartbeat_rv)
    assert running.monitor.nodes_seen == seen + 1
    assert running.versions() == (heartbeat_rv, status_rv), "nothing but the heartbeat written"
    assert writes(agent_requests(running.kube, mark)) == [], "the agent wrote nothing"
    assert running.triggers[triggers:] == [], "no reconcile was asked for"
    assert running.monitor.evaluations == evaluations, "not even a check"
    assert heartbeat_rv != node_rv

    # A periodic reconcile of the steady node writes nothing either, condition included.
    before = running.agent.reconciler.last_report
    running.agent.trigger(Trigger.RESYNC)
    wait_for("the resync", lambda: running.agent.reconciler.last_report is not before)
    assert running.versions() == (heartbeat_rv, status_rv), "a steady node costs no write"
    assert writes(agent_requests(running.kube, mark)) == [], "the resync wrote nothing"
    assert running.condition()["status"] == "True"


def test_dra_published_vgpus_are_in_the_status_but_not_expected_in_allocatable(
    cluster: ControlPlane,
) -> None:
    cluster.write("v1/nodes", NODE, {"metadata": {"labels": {LABEL: "mixed"}}})
    a, b = "0000:08:00.0", "0000:41:00.0"
    snapshot = build_snapshot(
        build_gpu(a, "A2", vgpus=[V("A2-4Q", 0), V("A2-4Q", 1)]),
        build_gpu(b, "A2", vgpus=[V("A2-2Q", 0)]),
    )
    channels = split(
        snapshot, lambda address: Publish.DRA if address == b else Publish.DEVICE_PLUGIN
    )
    plugin_dir = tempfile.mkdtemp(prefix="dp-", dir="/tmp")
    kubelet = DevicePluginKubelet(plugin_dir)
    kubelet.start()
    node_status = KubeletNodeStatus(cluster, NODE, kubelet)
    plugin = DevicePluginManager(plugin_dir, present=lambda device: True, poll_interval=0.02)
    try:
        token = cluster.agent_token(NODE)
        agent = AgentCluster(
            KubeApi(cluster.api_client(token), cluster.url, (5.0, 10.0)), NODE, pod_resources=None
        )
        monitor = allocatable_monitor(agent, plugin, GRACE)
        sink = ClusterSink(agent, plugin)
        agent.last_in_use = InUse()
        # One reconcile's order: the device plugin, then DRA, then the status.
        sink.refresh(channels.device_plugin)
        sink.dra_channel(None).refresh(channels.dra)
        wait_for(
            "the kubelet's allocatable",
            lambda: node_status.allocatable.get("nvidia.com/A2-4Q") == 2,
        )
        found = cluster.get("v1/nodes", NODE)
        assert found is not None
        monitor.node_seen(found)  # what the Node watch delivers
        agent.report_status(
            NodeStatus(
                node=NODE,
                config="mixed",
                state=ConfigState.SUCCESS,
                conditions=(Condition(type=ConditionType.SYNCED, status=True, reason="Converged"),),
            )
        )
        stored = cluster.get(NODESTATES, NODE)
        assert stored is not None
        status = stored["status"]
        capacity = {c["resourceName"]: c["total"] for c in status["capacity"]}
        assert capacity == {"nvidia.com/A2-4Q": 2, "nvidia.com/A2-2Q": 1}, "DRA vGPUs are in it"
        assert "nvidia.com/A2-2Q" not in found["status"]["allocatable"]
        allocatable = {c["type"]: c for c in status["conditions"]}["KubeletAllocatable"]
        assert allocatable["status"] == "True", allocatable
        assert allocatable["message"] == "allocatable as advertised: nvidia.com/A2-4Q: 2"
    finally:
        plugin.stop()
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def test_an_api_server_that_refuses_the_status_delays_the_write_not_the_repair() -> None:
    plugin, clock = Plugin({A2_4Q: 2}), Clock()
    monitor = AllocatableMonitor(plugin, grace=40, clock=clock)
    attempts: list[bool | None] = []

    def publish() -> bool:
        attempts.append(monitor.condition().status)
        raise ConnectionError("the API server is away")

    def event(reason: str, message: str, kind: EventType) -> None:
        raise ConnectionError("the API server is away")

    monitor.publish, monitor.event = publish, event
    monitor.condition()  # the plugin's list, seen long before the kubelet loses it
    clock.now += 100
    monitor.node_seen(node({A2_4Q: 0}))
    assert monitor.tick() == pytest.approx(10), "the write is tried again in 10 s"
    assert attempts == [False]
    clock.now += 10
    monitor.tick()
    assert attempts == [False, False] and plugin.asked == []
    clock.now += 30
    monitor.tick()
    assert plugin.asked == [A2_4Q], "the repair does not wait for the API server"
