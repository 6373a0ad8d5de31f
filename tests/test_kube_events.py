"""Events on the Node: reason codes, and a count bump instead of a new Event on repeats.

On the real API server (its Event validation), as the agent (its ServiceAccount's
token, bound to a Pod on the node, under the shipped RBAC).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from tests.apiserver import EVENTS, NODES
from tests.realcluster import ControlPlane
from vgpu_state.kube import events
from vgpu_state.kube.api import KubeApi
from vgpu_state.model.errors import BlockedReason, Reason
from vgpu_state.model.status import EventType

T0 = datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.UTC)


@pytest.fixture
def api(cluster: ControlPlane, tmp_path: Path) -> KubeApi:
    cluster.put(NODES, "gpu-node-1", {"metadata": {}})
    token = cluster.agent_token("gpu-node-1")
    return KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)))


def test_an_event_names_the_node_and_the_reason(cluster: ControlPlane, api: KubeApi) -> None:
    events.record(
        api,
        "gpu-node-1",
        "Applied",
        "applying plan sha256:ab (3 actions)",
        node_uid="uid-1",
        now=T0,
    )
    [event] = cluster.all(EVENTS)
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-node-1",
        "uid": "uid-1",
    }
    assert (event["reason"], event["type"], event["count"]) == ("Applied", "Normal", 1)
    assert event["source"] == {"component": "vgpu-state", "host": "gpu-node-1"}
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-11-23T10:00:00Z"


def test_a_flapping_node_bumps_counts_instead_of_flooding(
    cluster: ControlPlane, api: KubeApi
) -> None:
    for i in range(25):
        now = T0 + datetime.timedelta(minutes=i)
        events.record(api, "gpu-node-1", "Applied", f"plan {i}", now=now)
        if i % 2:
            events.record(
                api,
                "gpu-node-1",
                Reason.DRIVER_ERROR,
                f"EIO on try {i}",
                EventType.WARNING,
                now=now,
            )
        else:
            events.record(api, "gpu-node-1", BlockedReason.IN_USE, "done", now=now)
    found = {e["reason"]: e for e in cluster.all(EVENTS)}
    assert set(found) == {"Applied", "DriverError", "InUse"}
    assert found["Applied"]["count"] == 25
    assert found["DriverError"]["count"] == 12
    assert found["InUse"]["count"] == 13
    failed = found["DriverError"]
    assert failed["type"] == "Warning"
    assert failed["message"] == "EIO on try 23"  # the newest message
    assert failed["firstTimestamp"] == "2026-11-23T10:01:00Z"
    assert failed["lastTimestamp"] == "2026-11-23T10:23:00Z"


def test_event_names_are_valid_object_names() -> None:
    name = events.event_name("GPU_Node.1", "NoCapacity")
    assert name == "gpu-node.1.vgpu-state.nocapacity"
    assert len(events.event_name("n" * 300, "DriverError")) <= 253
