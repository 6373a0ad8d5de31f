"""One compromised node against the controller, on the real API server: its agent's
pod-bound token writes its own VGPUNodeState (all the shipped RBAC and admission let it),
and the controller, as its own ServiceAccount, still permits only what the layouts
document can produce, of the kind the honest nodes report; the hostile report is named in
a Warning Event on that node's VGPUNodeState and counted in the controller's metrics.

The decision itself, on values: ``tests/test_controller_bounds.py``.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_reports import LAYOUT_TYPES, LAYOUTS, layouts, made_up_types, scan, vf_backed_a2
from tests.hostile_status import encode_snapshot_unbounded
from tests.realcluster import ApiError, ControlPlane
from tests.test_controller_real import FOREIGN, KUBEVIRT, _cr, _owned, _report
from vgpu_state.catalog import default_catalog
from vgpu_state.config import FileConfigSource
from vgpu_state.controller.run import Controller, ControllerSettings, FleetViewSettings
from vgpu_state.kube import nodestate
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.errors import ClusterError
from vgpu_state.kube.events import event_name
from vgpu_state.kube.nodestate import VGPUNodeStateStatus, encode_snapshot
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.reconcile.settings import Settings

GRACE = 300.0
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"
EVENTS = "/api/v1/namespaces/default/events"


def _controller(cluster: ControlPlane, tmp_path: Path, spec: dict[str, Any]) -> Controller:
    cluster.request(
        "POST",
        KUBEVIRT,
        {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt"}}
        | {"spec": spec},
    )
    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    # The layouts reach the controller as the fleet view's (the one mounted ConfigMap).
    fleet = FleetViewSettings(layouts=layouts(), settings=Settings(catalog=default_catalog()))
    return Controller(api, ControllerSettings("controller-0", grace=GRACE, fleet=fleet))


def _as_agent(cluster: ControlPlane, tmp_path: Path, node: str, snapshot: NodeSnapshot) -> None:
    """``node``'s agent writes ``snapshot`` as its status, with its own pod-bound token."""
    token = cluster.agent_token(node)
    api = KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / f"agent-{node}", token=token)))
    now = datetime.datetime.now(datetime.UTC)
    try:
        status = VGPUNodeStateStatus(snapshot=encode_snapshot(snapshot, now))
    except nodestate.StatusBoundError:
        # The agent refuses to report a scan this large; a compromised node writes it anyway.
        body = nodestate.ensure(api, node)
        body["status"] = {"snapshot": encode_snapshot_unbounded(snapshot)}
        api.replace(nodestate.object_path(node, status=True), body)
        return
    nodestate.write_status(api, node, status)


def _refusal_event(cluster: ControlPlane, node: str) -> dict[str, Any]:
    found = cluster.request("GET", f"{EVENTS}/{event_name(node, 'ReportRefused')}")
    assert found is not None, f"no Event names {node}'s refused report"
    return dict(found)


def _gauge(ctl: Controller, reason: str) -> float:
    value = ctl.metrics.registry.get_sample_value(
        "vgpu_state_controller_report_entries_refused", {"reason": reason}
    )
    return float(value or 0)


def _devices(cluster: ControlPlane) -> dict[str, list[dict[str, Any]]]:
    return dict(_cr(cluster)["spec"]["configuration"].get("permittedHostDevices") or {})


@pytest.mark.parametrize("count", [3_000, 10_000])
def test_made_up_types_never_reach_the_cr_and_never_stop_a_write(
    cluster: ControlPlane, tmp_path: Path, count: int
) -> None:
    """A node claims ``count`` made-up types of NVIDIA's grammar, one live vGPU of each (a
    gzip status of about 150 KiB for 3,000, 500 KiB for 10,000). Before the layouts bounded
    the CR, 3,000 became 3,002 entries (a 446 KiB CR) and 10,000 an ownership annotation past
    256 KiB that made every write fail with 422, so no honest type was ever added."""
    ctl = _controller(
        cluster,
        tmp_path,
        {"configuration": {"permittedHostDevices": {"mediatedDevices": [FOREIGN]}}},
    )
    _report(cluster, "gpu-1", scan("a2-host.yaml", "gpu-1"))
    try:
        _as_agent(cluster, tmp_path, "evil", made_up_types("evil", count))
        written = True
        print(f"the API server took the status with {count} made-up types")
    except (ApiError, ClusterError) as e:  # a status schema that refuses it is fine too
        assert "422" in str(e) or "413" in str(e) or "Invalid" in str(e), e
        written = False
    first = ctl.run_once()
    assert first is not None
    # What the document can produce: one resource per type it names and product prefix.
    producible = {f"nvidia.com/{p}_{t}" for p in ("NVIDIA", "GRID") for t in LAYOUT_TYPES}
    owned = _owned(cluster)
    assert owned == {"nvidia.com/NVIDIA_A2-4A", "nvidia.com/NVIDIA_A2-4C", A2_4Q}
    listed = {e["resourceName"] for entries in _devices(cluster).values() for e in entries}
    assert listed - {FOREIGN["resourceName"]} <= producible
    assert len(json.dumps(_cr(cluster))) < 16 * 1024

    # An honest node's new type is permitted on the next pass.
    _report(cluster, "gpu-2", scan("l40s-pair.yaml", "gpu-2"))
    second = ctl.run_once()
    assert second is not None and second.write.writes == 1
    pci = _devices(cluster)["pciHostDevices"]
    assert {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-4Q",
            "externalResourceProvider": True} in pci  # fmt: skip
    if written:
        event = _refusal_event(cluster, "evil")
        assert event["type"] == "Warning" and event["reason"] == "ReportRefused"
        assert event["involvedObject"]["kind"] == "VGPUNodeState"
        assert event["involvedObject"]["name"] == "evil"
        state = cluster.request("GET", "/apis/vgpu-state.io/v1alpha1/vgpunodestates/evil")
        assert event["involvedObject"]["uid"] == state["metadata"]["uid"], "kubectl describe"
        assert f"{count} vGPU(s) outside what the layouts document" in event["message"]
        assert len(event["message"]) <= 1024
        assert event["count"] == 1, "named once, not once per pass"
        assert _gauge(ctl, "layouts") == count


@pytest.mark.parametrize("vf_device", [0x1234, 0x25B6], ids=["chosen-id", "catalog-id"])
def test_one_node_cannot_move_the_honest_nodes_mdev_entry(
    cluster: ControlPlane, tmp_path: Path, vf_device: int
) -> None:
    """``a-evil`` (first by name) reports one VF-backed ``NVIDIA A2-4Q``, with a VF device id
    of its choice or the catalog's own; two honest nodes have it as an mdev. On a fresh CR
    and on one that lists it, the entry is the honest nodes' mdev entry, and the hostile
    report is named and counted."""
    ctl = _controller(cluster, tmp_path, {})
    for node in ("gpu-1", "gpu-2"):
        _report(cluster, node, scan("a2-host.yaml", node))
    _as_agent(cluster, tmp_path, "a-evil", vf_backed_a2("a-evil", vf_device))
    mdev = {"mdevNameSelector": "NVIDIA A2-4Q", "resourceName": A2_4Q,
            "externalResourceProvider": True}  # fmt: skip
    result = ctl.run_once()
    assert result is not None
    devices = _devices(cluster)
    assert mdev in devices["mediatedDevices"]
    assert not any(e.get("resourceName") == A2_4Q for e in devices.get("pciHostDevices") or [])
    event = _refusal_event(cluster, "a-evil")
    assert event["involvedObject"]["kind"] == "VGPUNodeState" and event["type"] == "Warning"
    if vf_device == 0x1234:
        assert "its VF's device id 1234 is not the GPU's 25b6" in event["message"]
        assert _gauge(ctl, "layouts") == 1
    else:
        assert "2 other node(s) report it as mediatedDevices" in event["message"]
        assert _gauge(ctl, "conflict") == 1

    # The entry exists now: the hostile report, written again, changes nothing in the CR.
    rv = _cr(cluster)["metadata"]["resourceVersion"]
    _as_agent(cluster, tmp_path, "a-evil", vf_backed_a2("a-evil", 0x25B6 ^ 0x1234 ^ vf_device))
    again = ctl.run_once()
    assert again is not None and again.write.writes == 0
    assert _cr(cluster)["metadata"]["resourceVersion"] == rv
    assert _refusal_event(cluster, "a-evil")["count"] == 2, "its new report is named again"


def test_a_pass_writes_a_bounded_number_of_refusal_events(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """60 nodes refused at once (as after a layouts edit): the first pass names 50, the next
    the other 10, and a third pass, with nothing new to say, writes no Event."""
    ctl = _controller(cluster, tmp_path, {})
    nodes = [f"gpu-{i:02d}" for i in range(60)]
    for node in nodes:
        _report(cluster, node, made_up_types(node, 1))

    def named() -> int:
        listed = cluster.request("GET", f"{EVENTS}?fieldSelector=reason%3DReportRefused")
        return len(listed["items"])

    assert ctl.run_once() is not None
    assert named() == 50
    assert ctl.run_once() is not None
    assert named() == 60
    written = "vgpu_state_controller_refusal_events_total"
    assert ctl.metrics.registry.get_sample_value(written) == 60
    assert ctl.run_once() is not None
    assert ctl.metrics.registry.get_sample_value(written) == 60, "nothing new to say"
    assert named() == 60


def test_a_type_the_admin_adds_to_the_layouts_is_permitted_on_the_next_pass(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """The layouts file is read every pass: a node's type the document did not name is
    refused, and permitted once the admin's edit names it (the unchanged status is checked
    again against the new document)."""
    path = tmp_path / "config.yaml"
    path.write_text(LAYOUTS.replace("  l40s-4q:\n", "  l40s-4q-off:\n").replace(
        "        L40S-4Q: 1\n", "        L40S-12Q: 1\n"
    ))  # fmt: skip
    cluster.request("POST", KUBEVIRT, {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                                       "metadata": {"name": "kubevirt"}, "spec": {}})  # fmt: skip
    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    catalog = default_catalog()
    settings = ControllerSettings(
        "controller-0", grace=GRACE, layouts=FileConfigSource(path, catalog), catalog=catalog
    )
    ctl = Controller(api, settings)
    _report(cluster, "gpu-1", scan("l40s-pair.yaml", "gpu-1"))
    assert ctl.run_once() is not None
    assert _owned(cluster) == set()
    assert "type 'L40S-4Q' is not one" in _refusal_event(cluster, "gpu-1")["message"]
    path.write_text(LAYOUTS)
    again = ctl.run_once()
    assert again is not None and again.write.writes == 1
    assert _owned(cluster) == {"nvidia.com/NVIDIA_L40S-4Q"}
    assert _gauge(ctl, "layouts") == 0
