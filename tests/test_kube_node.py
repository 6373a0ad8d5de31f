"""The Node's labels and the keys vgpu-state writes on it, through the official client.

On the real API server, as the agent (its ServiceAccount's token bound to a Pod
on the node, under the shipped RBAC).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.apiserver import NODES, closed_port_url
from tests.realcluster import ControlPlane
from vgpu_state.kube import node
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.errors import ClusterUnreachableError, NotFoundError
from vgpu_state.kube.node import (
    APPLIED_CONFIG_ANNOTATION,
    CONFIG_HASH_ANNOTATION,
    LAST_PLAN_ANNOTATION,
    STATE_LABEL,
)
from vgpu_state.model.status import ConfigState

FOREIGN_LABELS = {
    "kubernetes.io/hostname": "gpu-node-1",
    "nvidia.com/vgpu.config": "a2-mixed",
    "nvidia.com/gpu.deploy.sandbox-device-plugin": "true",
}
FOREIGN_ANNOTATIONS = {"node.alpha.kubernetes.io/ttl": "0"}


@pytest.fixture
def api(cluster: ControlPlane, tmp_path: Path) -> KubeApi:
    cluster.put(
        NODES,
        "gpu-node-1",
        {"metadata": {"labels": FOREIGN_LABELS, "annotations": FOREIGN_ANNOTATIONS}},
    )
    token = cluster.agent_token("gpu-node-1")
    return KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)))


def test_labels_are_read_from_the_node(api: KubeApi) -> None:
    assert node.labels_of(node.read_node(api, "gpu-node-1")) == FOREIGN_LABELS


def test_state_label_goes_pending_then_success_or_failed(
    cluster: ControlPlane, api: KubeApi
) -> None:
    def state() -> str | None:
        found = cluster.get(NODES, "gpu-node-1")
        assert found is not None
        return found["metadata"]["labels"].get(STATE_LABEL)

    assert state() is None
    node.write_state(api, "gpu-node-1", ConfigState.PENDING)
    assert state() == "pending"
    node.write_state(
        api,
        "gpu-node-1",
        ConfigState.SUCCESS,
        applied_config="a2-mixed",
        config_hash="sha256:abc",
        plan_summary="Plan: 2 to add, 0 to change, 1 to destroy.",
    )
    assert state() == "success"
    found = cluster.get(NODES, "gpu-node-1")
    assert found is not None
    final = found["metadata"]
    # Only our keys were added; every other label and annotation is as it was.
    assert final["labels"] == {**FOREIGN_LABELS, STATE_LABEL: "success"}
    assert final["annotations"] == {
        **FOREIGN_ANNOTATIONS,
        APPLIED_CONFIG_ANNOTATION: "a2-mixed",
        CONFIG_HASH_ANNOTATION: "sha256:abc",
        LAST_PLAN_ANNOTATION: "Plan: 2 to add, 0 to change, 1 to destroy.",
    }
    node.write_state(api, "gpu-node-1", ConfigState.FAILED)
    after = cluster.get(NODES, "gpu-node-1")
    assert after is not None
    assert after["metadata"]["labels"][STATE_LABEL] == "failed"
    assert after["metadata"]["annotations"][APPLIED_CONFIG_ANNOTATION] == "a2-mixed"


def test_the_patch_names_only_our_keys() -> None:
    assert node.state_patch(ConfigState.PENDING) == {
        "metadata": {"labels": {STATE_LABEL: "pending"}}
    }
    assert node.state_patch() == {}


def test_missing_node_is_not_found(api: KubeApi) -> None:
    with pytest.raises(NotFoundError, match="404"):
        node.read_node(api, "no-such-node")


def test_unreachable_api_server_is_a_clear_error(tmp_path: Path, cluster: ControlPlane) -> None:
    closed = closed_port_url().replace("http:", "https:")
    config = cluster.write_kubeconfig(tmp_path / "dead", server=closed)
    dead = KubeApi.connect(str(config), timeout=(1.0, 1.0))
    with pytest.raises(ClusterUnreachableError, match=r"unreachable \(GET /api/v1/nodes/n1\)"):
        node.read_node(dead, "n1")


def test_unreadable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [")
    with pytest.raises(
        ClusterUnreachableError, match=f"cannot load Kubernetes credentials from {bad}"
    ):
        KubeApi.connect(str(bad))
    with pytest.raises(ClusterUnreachableError, match="cannot load"):
        KubeApi.connect(str(tmp_path / "missing"))
