"""A VGPUNodeState status the API server refuses never leaves ``success`` on the state label.

Runs on the suite's API server emulator: refusing one status write on purpose needs
its per-resource validator (a real server refuses a status only when its stored CRD
schema disagrees, which a shared control plane cannot be made to do for one test).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver import KUBEVIRT, NODES, NODESTATES, RunningApiServer, crd_validator
from vgpu_state.kube import crd
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.cluster import KubeCluster
from vgpu_state.kube.errors import ClusterError
from vgpu_state.kube.node import STATE_LABEL
from vgpu_state.model.status import Condition, ConditionType, ConfigState, NodeStatus
from vgpu_state.sim.host import SimHost

T0 = datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.UTC)


@pytest.fixture
def kubeconfig(apiserver: RunningApiServer, tmp_path: Path) -> str:
    apiserver.set_validator(NODESTATES, crd_validator(crd.crd()))
    apiserver.put(
        NODES,
        "gpu-node-1",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"labels": {"zone": "a"}}},
    )
    apiserver.put(
        KUBEVIRT,
        "kubevirt",
        {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "spec": {}},
        namespace="kubevirt",
    )
    return str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))


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


def test_a_status_that_cannot_be_written_leaves_failed_not_success_on_the_label(
    apiserver: RunningApiServer, kubeconfig: str, sim_spec_paths: list[Path]
) -> None:
    cluster = KubeCluster(KubeApi.connect(kubeconfig), "gpu-node-1", clock=lambda: T0)
    mixed = next(p for p in sim_spec_paths if p.name == "mixed.yaml")
    cluster.observe(SimHost(mixed, in_memory=True).scan())
    cluster.report_status(_success())
    node = apiserver.get(NODES, "gpu-node-1")
    assert node is not None and node["metadata"]["labels"][STATE_LABEL] == "success"

    def refuse(obj: dict[str, Any]) -> None:
        raise ValueError("status.state: the stored schema is older than the agent")

    # As a real API server refuses a status its CRD schema does not accept (422 Invalid).
    apiserver.set_validator(NODESTATES, refuse)
    with pytest.raises(ClusterError, match="older than the agent"):
        cluster.report_status(_success("a later reconcile"))
    node = apiserver.get(NODES, "gpu-node-1")
    assert node is not None and node["metadata"]["labels"][STATE_LABEL] == "failed"
    # The refusal was this test's doing, not an invalid write by the code under test.
    assert len(apiserver.rejected) == 1
    apiserver.rejected.clear()
