"""Withheld capacity on the real kube-apiserver: the node's status and its ResourceSlices.

Real parts: the kube-apiserver + etcd harness (``cluster``, ``tests/realcluster.py``)
with the shipped CRD, RBAC and admission policies; the agent talks to it as its
ServiceAccount with a token bound to a Pod on its Node. The node is a simulated
host; ``reconcile_once`` (the agent's reconcile) plans and reports.

* The status: while the A2's switch is deferred, ``gpus[].switch`` names it (state,
  policy, departing types, how many vGPUs are withheld, why), ``capacity[].withheld``
  counts the withheld vGPUs per resource and ``gpus[].vgpus[].vm`` names the VM of
  the held one; a revert removes the switch and every ``withheld``.
* The CRD bounds what an agent may claim: a ``withheld`` above ``free``, a message
  or list longer than the schema allows, are refused by the API server.
* DRA: the withheld vGPUs leave the node's ResourceSlices and come back.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import ControlPlane
from tests.withhold_support import (
    CATALOG,
    FREE_4A,
    FREE_4Q,
    GPU,
    HELD_4C,
    KEEP,
    NODE,
    R_4A,
    R_4C,
    R_4Q,
    SIM,
    SWITCH,
    VM_HOLDER,
    a2_host,
    config,
    settings,
)
from vgpu_state.agent.cluster import AgentCluster, ClusterSink
from vgpu_state.agent.dra import DraNode
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.dra.slices import PCI_BUS_ID
from vgpu_state.kube import nodestate
from vgpu_state.kube.api import InvalidError, KubeApi
from vgpu_state.model.inuse import InUse
from vgpu_state.reconcile import Mode, Ports, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.testing import FakeCluster, RecordingDevicePlugin, dra_paths

NODESTATES = "vgpu-state.io/v1alpha1/vgpunodestates"
SLICES = "resource.k8s.io/v1/resourceslices"


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="withhold-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _agent_api(cluster: ControlPlane, node: str, base: Path) -> KubeApi:
    kubeconfig = cluster.write_kubeconfig(
        base / f"{node}-kubeconfig", token=cluster.agent_token(node)
    )
    return KubeApi.connect(str(kubeconfig))


def _status(cluster: ControlPlane, node: str) -> dict[str, Any]:
    obj = cluster.get(NODESTATES, node)
    assert obj is not None
    return obj["status"]  # type: ignore[no-any-return]


def test_the_status_names_the_pending_switch_what_it_withholds_and_the_vm_in_its_way(
    cluster: ControlPlane, base: Path, tmp_path: Path
) -> None:
    host = SimHost(a2_host(tmp_path))
    api = _agent_api(cluster, NODE, base)
    agent = AgentCluster(
        api, NODE, pod_resources=None, in_use_source=lambda: InUse({HELD_4C: VM_HOLDER})
    )
    agent.set_mode("enforce")
    sink = ClusterSink(agent, RecordingDevicePlugin())

    def reconcile(layout: str) -> None:
        ports = Ports(host, agent, config(layout), sink, sink.dra_channel(None), processes=agent)
        reconcile_once(ports, settings(), mode=Mode.APPLY, config_name="a2", skip_blocked=True)

    try:
        reconcile(KEEP)
        status = _status(cluster, NODE)
        assert "switch" not in status["gpus"][0]
        assert all("withheld" not in c for c in status["capacity"])

        reconcile(SWITCH)
        status = _status(cluster, NODE)
        (gpu,) = status["gpus"]
        assert gpu["address"] == GPU
        switch = gpu["switch"]
        assert switch["state"] == "deferred"
        assert switch["departing"] == ["A2-4A", "A2-4C", "A2-4Q"]
        assert switch["withheld"] == 2
        assert "pod default/virt-launcher-win-1-x7k2p (VM default/win-1)" in switch["message"]
        assert "2 free vGPU(s) of departing types withheld" in switch["message"]
        capacity = {c["resourceName"]: c for c in status["capacity"]}
        assert capacity[R_4Q]["withheld"] == 1 and capacity[R_4A]["withheld"] == 1
        assert "withheld" not in capacity[R_4C]  # held, so not free: never withheld
        vms = {v["id"]: v.get("vm") for v in gpu["vgpus"]}
        assert vms == {HELD_4C: "default/win-1", FREE_4Q: None, FREE_4A: None}

        reconcile(KEEP)  # reverted: nothing pending, nothing withheld
        status = _status(cluster, NODE)
        assert "switch" not in status["gpus"][0]
        assert all("withheld" not in c for c in status["capacity"])
    finally:
        host.close()
        api.close()


def _hostile(status: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = dict(status)
    gpu = {**status["gpus"][0], **change.get("gpu", {})}
    out["gpus"] = [gpu]
    if "capacity" in change:
        out["capacity"] = change["capacity"]
    return out


@pytest.mark.parametrize(
    "change, refused",
    [
        (
            {"capacity": [{"resourceName": R_4Q, "total": 1, "free": 1, "withheld": 2}]},
            "withheld vGPUs are free vGPUs",
        ),
        ({"gpu": {"switch": {"state": "deferred", "policy": "evacuate", "withheld": 65}}}, "65"),
        (
            {"gpu": {"switch": {"state": "deferred", "policy": "evacuate", "message": "x" * 1025}}},
            "1024",
        ),
        (
            {
                "gpu": {
                    "switch": {
                        "state": "deferred",
                        "policy": "evacuate",
                        "departing": [f"A2-{i}Q" for i in range(65)],
                    }
                }
            },
            "64",
        ),
        ({"gpu": {"switch": {"state": "moving", "policy": "evacuate"}}}, "moving"),
        (
            {"gpu": {"vgpus": [{"id": HELD_4C, "type": "NVIDIA A2-4C", "vm": "n/" + "v" * 316}]}},
            "317",
        ),
    ],
    ids=["withheld-above-free", "switch-withheld", "message", "departing", "state", "vm"],
)
def test_the_crd_refuses_a_status_claiming_more_than_its_bounds(
    cluster: ControlPlane, base: Path, change: dict[str, Any], refused: str
) -> None:
    """A node's token may write its own status; the schema still bounds what it claims."""
    api = _agent_api(cluster, NODE, base)
    agent = AgentCluster(api, NODE, pod_resources=None, in_use_source=lambda: InUse({}))
    host = SimHost(SIM / "a2-host.yaml", in_memory=True)
    try:
        agent.observe(host.scan())
        agent.write_status(state=None)
        obj = api.get(nodestate.object_path(NODE))
        body = {**obj, "status": _hostile(obj["status"], change)}
        with pytest.raises(InvalidError, match=refused):
            api.replace(nodestate.object_path(NODE, status=True), body)
        # Within the bounds, the same write goes through: the bound refused it.
        api.replace(nodestate.object_path(NODE, status=True), {**obj, "status": obj["status"]})
    finally:
        host.close()
        api.close()


DRA_NODE = "l40s-node"
DRA_LAYOUT = """version: v1
policy:
  in-use: {policy}
vgpu-configs:
  layout:
    - devices: ["0000:a1:00.0"]
      vgpu-devices: {layout}
      publish: dra
"""


def test_withheld_vgpus_leave_the_resourceslices_and_come_back(
    cluster: ControlPlane, base: Path
) -> None:
    host = SimHost(SIM / "l40s-pair.yaml")
    api = _agent_api(cluster, DRA_NODE, base)
    dra = DraNode(api, DRA_NODE, dra_paths(base, host.root), resync_seconds=3600, catalog=CATALOG)
    node = FakeCluster(DRA_NODE)

    def reconcile(layout: str) -> Any:
        text = DRA_LAYOUT.format(policy="evacuate", layout=layout)
        source = StaticConfigSource(load_text(text, "layouts.yaml", catalog=CATALOG))
        ports = Ports(host, node, source, RecordingDevicePlugin(), dra)
        return reconcile_once(
            ports, settings(), mode=Mode.APPLY, config_name="layout", skip_blocked=True
        )

    def published() -> set[str]:
        return {
            d["attributes"][PCI_BUS_ID]["string"]
            for o in cluster.list(SLICES)
            if o["spec"]["nodeName"] == DRA_NODE
            for d in o["spec"]["devices"]
        }

    try:
        report = reconcile("{L40S-12Q: 4}")
        keys = {v.key for v in report.final.gpu("0000:a1:00.0").vgpus}  # type: ignore[union-attr]
        assert published() == keys and len(keys) == 4

        # A VM holds one: the switch to L40S-24Q is deferred, the other three are withheld.
        held = sorted(keys)[0]
        node.hold(held, "pod vms/virt-launcher-render-1-ab3cd (VM vms/render)")
        report = reconcile("{L40S-24Q: 2}")
        assert report.plan.gpus[-1].deferred_switch is not None or any(
            g.deferred_switch for g in report.plan.gpus
        )
        assert published() == {held}

        report = reconcile("{L40S-12Q: 4}")  # reverted
        assert published() == keys
    finally:
        host.close()
        api.close()
