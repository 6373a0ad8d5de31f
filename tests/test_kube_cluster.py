"""KubeCluster, the cluster port on Kubernetes: the pieces together, against the real API
server (``tests/realcluster.py``: the CRDs of ``deploy/`` and KubeVirt, the agent's
ServiceAccount token under the shipped RBAC) and a fake kubelet."""

from __future__ import annotations

import datetime
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver import EVENTS, KUBEVIRT, NODES, NODESTATES
from tests.kubelet_podresources import PodDevices, PodResourcesKubelet, serving
from tests.realcluster import ControlPlane
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.cluster import KubeCluster
from vgpu_state.kube.errors import PodResourcesUnavailableError
from vgpu_state.kube.kubevirt import KubeVirtRef
from vgpu_state.kube.node import STATE_LABEL
from vgpu_state.kube.nodestate import SelectedConfig
from vgpu_state.model.status import (
    Condition,
    ConditionType,
    ConfigState,
    EventType,
    NodeEvent,
    NodeStatus,
)
from vgpu_state.ports import ClusterPort
from vgpu_state.sim.host import SimHost

T0 = datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.UTC)
REF = KubeVirtRef("kubevirt", "kubevirt")


def _cr() -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "spec": {
            "configuration": {
                "permittedHostDevices": {
                    "mediatedDevices": [
                        {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q"}
                    ]
                }
            }
        },
    }


@pytest.fixture
def apiserver(cluster: ControlPlane) -> ControlPlane:
    """The real control plane, under the name these tests use."""
    return cluster


@pytest.fixture
def kubeconfig(apiserver: ControlPlane, tmp_path: Path) -> str:
    """An agent's kubeconfig: its ServiceAccount's token, bound to a Pod on gpu-node-1."""
    for name in ("gpu-node-1", "gpu-node-2"):
        apiserver.put(
            NODES, name, {"metadata": {"labels": {"nvidia.com/vgpu.config": "mixed", "zone": "a"}}}
        )
    apiserver.put(KUBEVIRT, "kubevirt", _cr(), namespace="kubevirt")
    token = apiserver.agent_token("gpu-node-1")
    return str(apiserver.write_kubeconfig(tmp_path / "kubeconfig", token=token))


def _mixed(sim_spec_paths: list[Path]) -> SimHost:
    return SimHost(next(p for p in sim_spec_paths if p.name == "mixed.yaml"), in_memory=True)


def _cluster(kubeconfig: str, node: str, **options: Any) -> KubeCluster:
    return KubeCluster(KubeApi.connect(kubeconfig), node, clock=lambda: T0, **options)


def test_it_is_a_cluster_port(kubeconfig: str) -> None:
    assert isinstance(_cluster(kubeconfig, "gpu-node-1"), ClusterPort)


def test_labels_and_in_use_from_the_node_and_the_kubelet(kubeconfig: str) -> None:
    sock = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp")) / "kubelet.sock"
    kubelet = PodResourcesKubelet(
        [
            PodDevices(
                "vms",
                "virt-launcher-win-1-abcde",
                "compute",
                "nvidia.com/NVIDIA_A2-4C",
                ["f715f63c-0d00-4007-9c5a-b07b0c6c05de"],
            ),
        ]
    )
    cluster = _cluster(kubeconfig, "gpu-node-1", pod_resources=str(sock))
    assert cluster.labels() == {"nvidia.com/vgpu.config": "mixed", "zone": "a"}
    with serving(sock, kubelet):
        held = cluster.in_use()
    assert dict(held) == {
        "f715f63c-0d00-4007-9c5a-b07b0c6c05de": "pod vms/virt-launcher-win-1-abcde (VM vms/win-1)"
    }
    with pytest.raises(PodResourcesUnavailableError):
        cluster.in_use()  # the kubelet is gone


def test_report_status_writes_the_label_the_status_and_keeps_transition_times(
    apiserver: ControlPlane, kubeconfig: str, sim_spec_paths: list[Path]
) -> None:
    cluster = _cluster(kubeconfig, "gpu-node-1")
    snapshot = _mixed(sim_spec_paths).scan()
    cluster.observe(
        snapshot,
        {"f715f63c-0d00-4007-9c5a-b07b0c6c05de": "vm default/win-1"},
        selected=SelectedConfig(
            name="mixed", source="label", reason="label nvidia.com/vgpu.config=mixed"
        ),
        blocked=1,
    )
    status = NodeStatus(
        node="gpu-node-1",
        config="mixed",
        state=ConfigState.SUCCESS,
        conditions=(
            Condition(type=ConditionType.SYNCED, status=True, reason="Converged"),
            Condition(type=ConditionType.READY, status=True, reason="Reconciled"),
            Condition(type=ConditionType.BLOCKED, status=True, reason="InUse", message="1 held"),
        ),
    )
    cluster.report_status(status)
    node = apiserver.get(NODES, "gpu-node-1")
    assert node is not None and node["metadata"]["labels"][STATE_LABEL] == "success"
    stored = apiserver.get(NODESTATES, "gpu-node-1")
    assert stored is not None
    s = stored["status"]
    assert (s["state"], s["selectedConfig"]["name"], s["vgpuCount"], s["blockedCount"]) == (
        "success",
        "mixed",
        4,
        1,
    )
    assert {c["type"]: c["status"] for c in s["conditions"]} == {
        "Synced": "True",
        "Ready": "True",
        "Blocked": "True",
        "Degraded": "False",
    }
    # The status lists what a scan shows, GPU by GPU.
    assert [(g["address"], [v["id"] for v in g["vgpus"]]) for g in s["gpus"]] == [
        (g.address, [v.key for v in g.vgpus]) for g in snapshot.gpus
    ]
    held = [v for g in s["gpus"] for v in g["vgpus"] if v.get("holder")]
    assert held == [
        {
            "id": "f715f63c-0d00-4007-9c5a-b07b0c6c05de",
            "type": "NVIDIA A2-4C",
            "resourceName": "nvidia.com/NVIDIA_A2-4C",
            "holder": "vm default/win-1",
        }
    ]
    # A later report with the same condition values keeps their transition times.
    later = _cluster(kubeconfig, "gpu-node-1")
    later.clock = lambda: T0 + datetime.timedelta(hours=1)
    later.observe(snapshot)
    later.report_status(status)
    again = apiserver.get(NODESTATES, "gpu-node-1")
    assert again is not None
    times = {c["lastTransitionTime"] for c in again["status"]["conditions"]}
    assert times == {"2026-11-23T10:00:00Z"}


def _success(message: str = "") -> NodeStatus:
    return NodeStatus(
        node="gpu-node-1",
        config="mixed",
        state=ConfigState.SUCCESS,
        conditions=(
            Condition(type=ConditionType.SYNCED, status=True, reason="Converged", message=message),
            Condition(type=ConditionType.READY, status=True, reason="Reconciled"),
        ),
    )


def test_events_go_to_the_node(apiserver: ControlPlane, kubeconfig: str) -> None:
    cluster = _cluster(kubeconfig, "gpu-node-1")
    for _ in range(3):
        cluster.emit_event(NodeEvent(type=EventType.WARNING, reason="ApplyFailed", message="EIO"))
    [event] = apiserver.all(EVENTS)
    assert event["count"] == 3
    node = apiserver.get(NODES, "gpu-node-1")
    assert node is not None
    assert event["involvedObject"]["uid"] == node["metadata"]["uid"]


def test_a_steady_node_costs_no_write(
    apiserver: ControlPlane, kubeconfig: str, sim_spec_paths: list[Path]
) -> None:
    """Reconciling an unchanged node every minute must not rewrite the Node or its status
    (every write is an etcd write and a watch event for every controller watching Nodes)."""
    snapshot = _mixed(sim_spec_paths).scan()
    status = NodeStatus(
        node="gpu-node-1",
        config="mixed",
        state=ConfigState.SUCCESS,
        conditions=(Condition(type=ConditionType.SYNCED, status=True, reason="Converged"),),
    )

    def versions() -> tuple[str, str]:
        node = apiserver.get(NODES, "gpu-node-1")
        stored = apiserver.get(NODESTATES, "gpu-node-1")
        assert node is not None and stored is not None
        return node["metadata"]["resourceVersion"], stored["metadata"]["resourceVersion"]

    def reconcile(clock: datetime.datetime) -> None:
        cluster = _cluster(kubeconfig, "gpu-node-1")
        cluster.clock = lambda: clock
        cluster.labels()  # every reconcile reads the Node first
        cluster.observe(snapshot, {})
        cluster.report_status(status)

    reconcile(T0)
    first = versions()
    reconcile(T0 + datetime.timedelta(minutes=1))
    assert versions() == first, "an unchanged node was written again"

    # A change is still written: one more vGPU held.
    cluster = _cluster(kubeconfig, "gpu-node-1")
    cluster.labels()
    cluster.observe(snapshot, {"f715f63c-0d00-4007-9c5a-b07b0c6c05de": "vm default/win-1"})
    cluster.report_status(status)
    node_rv, status_rv = versions()
    assert node_rv == first[0] and status_rv != first[1]
    # And the state label is written when it differs.
    cluster.report_status(status.model_copy(update={"state": ConfigState.PENDING}))
    node = apiserver.get(NODES, "gpu-node-1")
    assert node is not None and node["metadata"]["labels"][STATE_LABEL] == "pending"


def test_the_last_plan_annotation_follows_every_reconcile_a_failed_one_too(
    apiserver: ControlPlane, kubeconfig: str
) -> None:
    from vgpu_state.agent.cluster import AgentCluster
    from vgpu_state.kube.node import LAST_PLAN_ANNOTATION
    from vgpu_state.model.errors import HostError
    from vgpu_state.reconcile.status import failed_status

    agent = AgentCluster(KubeApi.connect(kubeconfig), "gpu-node-1", pod_resources=None)
    agent.labels()
    matched = NodeStatus(
        node="gpu-node-1",
        config="mixed",
        state=ConfigState.SUCCESS,
        conditions=(
            Condition(
                type=ConditionType.SYNCED,
                status=True,
                reason="Synced",
                message='the node matches configuration "mixed"',
            ),
        ),
    )
    agent.report_status(matched)

    def annotation() -> str:
        node = apiserver.get(NODES, "gpu-node-1")
        assert node is not None
        return str(node["metadata"]["annotations"][LAST_PLAN_ANNOTATION])

    assert annotation() == 'the node matches configuration "mixed"'
    agent.report_status(
        failed_status("gpu-node-1", "mixed", HostError("0000:3b:00.0: create failed: EBUSY"))
    )
    assert annotation() == "0000:3b:00.0: create failed: EBUSY"
    node = apiserver.get(NODES, "gpu-node-1")
    assert node is not None and node["metadata"]["labels"][STATE_LABEL] == "failed"
