"""VGPUNodeState: the CRD generated from the models, and status written through /status.

The writes go to the real API server with the CRD from ``deploy/`` installed (its
schema and status subresource are the server's), as the agent (its
ServiceAccount's token bound to a Pod on the node, under the shipped RBAC).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.apiserver import NODES, NODESTATES
from tests.realcluster import ControlPlane
from vgpu_state.kube import crd, nodestate
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.nodestate import (
    LastApply,
    SelectedConfig,
    VGPUNodeStateStatus,
    layout_status,
    merge_conditions,
)
from vgpu_state.model.status import ConfigState
from vgpu_state.sim.host import SimHost

REPO = Path(__file__).resolve().parent.parent
CRD_FILE = REPO / "schemas" / "vgpunodestate.crd.yaml"
T0 = datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.UTC)


@pytest.fixture
def api(cluster: ControlPlane, tmp_path: Path) -> KubeApi:
    cluster.put(NODES, "gpu-node-1", {"metadata": {}})
    token = cluster.agent_token("gpu-node-1")
    return KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)))


def _mixed(sim_spec_paths: list[Path]) -> SimHost:
    return SimHost(next(p for p in sim_spec_paths if p.name == "mixed.yaml"), in_memory=True)


def test_the_checked_in_crd_is_generated_from_the_models() -> None:
    on_disk = YAML(typ="safe").load(CRD_FILE.read_text())
    assert on_disk == crd.crd(), "schemas/vgpunodestate.crd.yaml is stale: run scripts/gen_crd.py"


def test_crd_shape_kubectl_relies_on() -> None:
    doc = crd.crd()
    version = doc["spec"]["versions"][0]
    assert doc["metadata"]["name"] == "vgpunodestates.vgpu-state.io"
    assert doc["spec"]["scope"] == "Cluster"
    assert version["subresources"] == {"status": {}}
    assert [c["name"].upper() for c in version["additionalPrinterColumns"]] == [
        "CONFIG",
        "STATE",
        "MODE",
        "REASON",
        "VGPUS",
        "BLOCKED",
        "ALLOCATABLE",
        "AGE",
    ]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    # A structural schema: no references, no anyOf with null, no titles.
    text = str(status)
    assert "$ref" not in text and "'null'" not in text and "'title'" not in text
    # Every printer column points at a field the schema has.
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].strip(".").split(".")
        if path[0] == "status":
            assert path[1].split("[")[0] in status["properties"], column
    allocatable = version["additionalPrinterColumns"][6]["jsonPath"]
    assert allocatable == '.status.conditions[?(@.type=="KubeletAllocatable")].status'
    assert "KubeletAllocatable" in conditions["items"]["properties"]["type"]["enum"]


def test_layout_and_capacity_come_from_the_scan(sim_spec_paths: list[Path]) -> None:
    snapshot = _mixed(sim_spec_paths).scan()
    held = {"f715f63c-0d00-4007-9c5a-b07b0c6c05de": "pod default/virt-launcher-win-1-abcde"}
    gpus, capacity = layout_status(snapshot, held)
    a2 = gpus[0]
    assert (a2.address, a2.model, a2.layout) == ("0000:08:00.0", "A2", "mdev")
    assert [(v.type, v.holder) for v in a2.vgpus] == [
        ("NVIDIA A2-4C", "pod default/virt-launcher-win-1-abcde"),
        ("NVIDIA A2-4Q", None),
    ]
    assert {c.resource_name: (c.total, c.free) for c in capacity} == {
        "nvidia.com/GRID_T4-8C": (1, 1),
        "nvidia.com/NVIDIA_A2-4C": (1, 0),
        "nvidia.com/NVIDIA_A2-4Q": (1, 1),
        "nvidia.com/NVIDIA_L40S-12Q": (1, 1),
    }


def test_status_round_trip_through_the_status_subresource(
    cluster: ControlPlane, api: KubeApi, sim_spec_paths: list[Path]
) -> None:
    gpus, capacity = layout_status(_mixed(sim_spec_paths).scan())
    status = VGPUNodeStateStatus(
        state=ConfigState.SUCCESS,
        selected_config=SelectedConfig(
            name="mixed",
            source="label",
            reason="node label nvidia.com/vgpu.config=mixed",
            document_hash="sha256:0123",
        ),
        gpus=gpus,
        capacity=capacity,
        vgpu_count=4,
        blocked_count=1,
        conditions=merge_conditions(
            (), [("Synced", True, "Converged", ""), ("Blocked", True, "InUse", "1 held")], 0, T0
        ),
        last_apply=LastApply(
            plan_id="sha256:abcd",
            start="2026-11-23T10:00:00Z",
            end="2026-11-23T10:00:02Z",
            result="success",
        ),
    )
    nodestate.write_status(api, "gpu-node-1", status, node_uid="uid-1")
    stored = cluster.get(NODESTATES, "gpu-node-1")
    assert stored is not None
    assert stored["spec"] == {"nodeName": "gpu-node-1"}
    assert stored["metadata"]["ownerReferences"][0]["kind"] == "Node"
    read_back = nodestate.status_of(stored)
    assert read_back == status.model_copy(update={"observed_generation": 1})
    assert stored["status"]["selectedConfig"]["documentHash"] == "sha256:0123"
    assert stored["status"]["vgpuCount"] == 4

    # A write to the main resource cannot change the status (and vice versa); the agent
    # may not write the main resource at all (RBAC: get and create), so the admin tries.
    cluster.request(
        "PATCH",
        nodestate.object_path("gpu-node-1"),
        {"status": {"vgpuCount": 99}},
        "application/merge-patch+json",
    )
    again = cluster.get(NODESTATES, "gpu-node-1")
    assert again is not None and again["status"]["vgpuCount"] == 4

    # A later status without lastApply drops it: the status is replaced, not merged.
    nodestate.write_status(api, "gpu-node-1", VGPUNodeStateStatus(state=ConfigState.PENDING))
    latest = cluster.get(NODESTATES, "gpu-node-1")
    assert latest is not None
    assert latest["status"]["state"] == "pending"
    assert "lastApply" not in latest["status"] and "selectedConfig" not in latest["status"]
    assert latest["status"]["gpus"] == [] and latest["status"]["conditions"] == []


def test_transition_time_moves_only_when_a_condition_changes() -> None:
    first = merge_conditions((), [("Ready", True, "Reconciled", "")], 3, T0)
    later = T0 + datetime.timedelta(minutes=5)
    same = merge_conditions(first, [("Ready", True, "Reconciled", "again")], 4, later)
    assert same[0].last_transition_time == "2026-11-23T10:00:00Z"
    assert same[0].observed_generation == 4
    flipped = merge_conditions(same, [("Ready", False, "ApplyFailed", "EIO")], 4, later)
    assert flipped[0].last_transition_time == "2026-11-23T10:05:00Z"
    assert flipped[0].status == "False"


def test_kubectl_get_shows_the_agents_mode_and_why_it_failed(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """An agent started as by hand (no --mode) on a node whose GPUs are gone: ``kubectl
    get vgpunodestates`` says plan-only and NoGpus, on the real API server."""
    import threading
    import time

    from vgpu_state.agent.assemble import AgentFlags, build

    node = "gpu-gone-1"
    cluster.ensure_node(node, {"nvidia.com/vgpu.config": "a2"})
    spec = tmp_path / "node.yaml"
    spec.write_text(f"node: {node}\ngpus: []\nextra-pci-devices: 2\n")
    config = tmp_path / "config"
    config.mkdir()
    (config / "config.yaml").write_text(
        "version: v1\nvgpu-configs:\n  a2:\n    - devices: all\n"
        '      device-filter: "0x25B610DE"\n      vgpu-devices: {A2-4Q: 4}\n'
    )
    token = cluster.agent_token(node)
    flags = AgentFlags(
        node=node,
        config_file=config / "config.yaml",
        resync=300.0,
        listen="",
        kubeconfig=str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)),
        sim_spec=str(spec),
        state_dir=tmp_path / "state",
        device_plugin=False,
        manage_kubevirt=False,
    )
    agent = build(flags)
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while (cluster.get(NODESTATES, node) or {}).get("status", {}).get("state") != "failed":
            assert time.monotonic() < deadline, cluster.get(NODESTATES, node)
            time.sleep(0.2)
    finally:
        agent.stop()
        thread.join(30)
    header, row = cluster.kubectl("get", "vgpunodestates", node).splitlines()
    assert header.split()[:6] == ["NAME", "CONFIG", "STATE", "MODE", "REASON", "VGPUS"]
    assert row.split()[:6] == [node, "a2", "failed", "plan-only", "NoGpus", "0"]
