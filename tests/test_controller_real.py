"""The controller against the real API server, as its own ServiceAccount: one guarded JSON
Patch per change (the server's own ``test`` semantics, the writes counted in its audit log),
the second replica idle while the first holds the Lease, an unchanged status not decoded
again, entries kept through a node's status race and a newer agent's status, and no way in
for a non-NVIDIA device."""

from __future__ import annotations

import base64
import datetime
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_reports import bounding
from tests.realcluster import CONTROLLER_SA, CONTROLLER_USER, WRITE_VERBS, ApiError, ControlPlane
from vgpu_state.controller import run
from vgpu_state.controller.bounds import LayoutBounds
from vgpu_state.controller.reports import NodeReport
from vgpu_state.controller.run import Controller, ControllerSettings
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.nodestate import VGPUNodeStateStatus, encode_snapshot
from vgpu_state.kube.permitted import OWNERSHIP_ANNOTATION
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.sim.host import SimHost

REPO = Path(__file__).resolve().parent.parent
NODESTATES = "/apis/vgpu-state.io/v1alpha1/vgpunodestates"
KUBEVIRT = "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts"
POD_NAME = "authentication.kubernetes.io/pod-name"
FOREIGN = {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q"}
GRACE = 300.0


def _scan(spec: str, node: str) -> NodeSnapshot:
    with SimHost(REPO / "configs" / "sim" / spec, in_memory=True) as host:
        return host.scan().model_copy(update={"node": node})


def _report(cluster: ControlPlane, node: str, snapshot: NodeSnapshot | dict[str, Any]) -> None:
    """The node's VGPUNodeState with ``snapshot`` as its reported scan (written as the admin)."""
    if isinstance(snapshot, NodeSnapshot):
        now = datetime.datetime.now(datetime.UTC)
        status = VGPUNodeStateStatus(snapshot=encode_snapshot(snapshot, now)).to_json()
    else:
        status = snapshot
    if cluster.request("GET", f"{NODESTATES}/{node}") is None:
        cluster.request(
            "POST",
            NODESTATES,
            {
                "apiVersion": "vgpu-state.io/v1alpha1",
                "kind": "VGPUNodeState",
                "metadata": {"name": node},
                "spec": {"nodeName": node},
            },
        )
    current = cluster.request("GET", f"{NODESTATES}/{node}")
    current["status"] = status
    cluster.request("PUT", f"{NODESTATES}/{node}/status", current)


def _cr(cluster: ControlPlane) -> dict[str, Any]:
    found = cluster.request("GET", f"{KUBEVIRT}/kubevirt")
    assert found is not None
    return dict(found)


def _owned(cluster: ControlPlane) -> set[str]:
    annotations = _cr(cluster)["metadata"].get("annotations") or {}
    return set(json.loads(annotations.get(OWNERSHIP_ANNOTATION, "[]")))


def _requests(cluster: ControlPlane, mark: int, pod: str) -> list[dict[str, Any]]:
    """What the controller replica running in ``pod`` asked the server since ``mark``, as the
    server's audit log records it (the pod's name comes with its bound token)."""
    return [
        e
        for e in cluster.audit(mark, CONTROLLER_USER)
        if pod in (e.get("user", {}).get("extra", {}).get(POD_NAME) or [])
    ]


def _cr_patches(cluster: ControlPlane, mark: int, pod: str) -> list[int]:
    """The response codes of the replica's patches of the KubeVirt CR since ``mark``."""
    return [
        int(e.get("responseStatus", {}).get("code", 0))
        for e in _requests(cluster, mark, pod)
        if e["verb"] == "patch" and e.get("objectRef", {}).get("resource") == "kubevirts"
    ]


@pytest.fixture
def controller(
    cluster: ControlPlane, tmp_path: Path
) -> tuple[ControlPlane, Controller, list[float]]:
    cluster.request(
        "POST",
        KUBEVIRT,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt"},
            "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": [FOREIGN]}}},
        },
    )
    # The controller's own ServiceAccount, its token bound to its pod.
    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    clock = [0.0]
    settings = ControllerSettings(identity="controller-0", grace=GRACE, **bounding())
    return cluster, Controller(api, settings, clock=lambda: clock[0]), clock


def test_one_guarded_write_per_change_entries_kept_through_races_and_upgrades(
    controller: tuple[ControlPlane, Controller, list[float]],
) -> None:
    cluster, ctl, clock = controller
    mixed = _scan("mixed.yaml", "gpu-1")
    _report(cluster, "gpu-1", mixed)
    _report(cluster, "gpu-2", _scan("a2-host.yaml", "gpu-2"))
    first = ctl.run_once()
    assert first is not None and first.write.writes == 1
    mdevs = _cr(cluster)["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    assert mdevs[0] == FOREIGN, "a foreign entry stays first and unchanged"
    wanted = {"nvidia.com/NVIDIA_A2-4Q", "nvidia.com/GRID_T4-8C", "nvidia.com/NVIDIA_L40S-12Q"}
    assert wanted <= _owned(cluster)
    rv = _cr(cluster)["metadata"]["resourceVersion"]
    steady = ctl.run_once()
    assert steady is not None and steady.write.writes == 0
    assert _cr(cluster)["metadata"]["resourceVersion"] == rv, "a steady fleet costs no write"

    # The race: gpu-1's status briefly lacks its L40S type (written before the scan that has
    # it again). Through the grace period the entry stays.
    without_l40s = mixed.model_copy(
        update={"gpus": tuple(g for g in mixed.gpus if g.model != "L40S")}
    )
    _report(cluster, "gpu-1", without_l40s)
    clock[0] = GRACE - 1
    assert ctl.run_once() is not None
    assert "nvidia.com/NVIDIA_L40S-12Q" in _owned(cluster)
    _report(cluster, "gpu-1", mixed)
    clock[0] = 2 * GRACE
    assert ctl.run_once() is not None
    assert "nvidia.com/NVIDIA_L40S-12Q" in _owned(cluster)

    # A rolling upgrade: gpu-2's agent is newer and its scan carries a field this controller
    # does not know. Its entries stay, whatever the grace period.
    status = cluster.request("GET", f"{NODESTATES}/gpu-2")["status"]
    raw = json.loads(gzip.decompress(base64.b64decode(status["snapshot"]["data"])))
    raw["gpus"][0]["futureField"] = {"x": 1}
    status["snapshot"]["data"] = base64.b64encode(gzip.compress(json.dumps(raw).encode())).decode()
    _report(cluster, "gpu-2", status)
    # (The CRD's structural schema prunes unknown fields at the top of the status; the
    # scan inside is opaque to it and carries the newer field through.)
    _report(cluster, "gpu-1", without_l40s.model_copy(update={"gpus": ()}))
    clock[0] = 10 * GRACE
    assert ctl.run_once() is not None
    clock[0] = 12 * GRACE
    gone = ctl.run_once()
    assert gone is not None
    owned = _owned(cluster)
    assert "nvidia.com/NVIDIA_A2-4Q" in owned, "gpu-2 (newer agent) still reports it"
    assert "nvidia.com/NVIDIA_L40S-12Q" not in owned, "nobody reports it for the grace period"
    assert {c.op for c in gone.write.changes} == {"remove"}


def test_a_nic_reported_as_a_gpu_has_no_way_into_the_cr(
    controller: tuple[ControlPlane, Controller, list[float]],
) -> None:
    cluster, ctl, _ = controller
    mixed = _scan("mixed.yaml", "gpu-1")
    nic = next(g for g in mixed.gpus if g.model == "L40S").model_copy(
        update={"vendor_id": 0x8086, "device_id": 0x1572}
    )
    _report(cluster, "gpu-1", mixed.model_copy(update={"gpus": (nic,)}))
    result = ctl.run_once()
    assert result is not None
    devices = _cr(cluster)["spec"]["configuration"]["permittedHostDevices"]
    assert not any("1572" in str(e) for e in devices.get("pciHostDevices") or [])
    assert _owned(cluster) == set()


def test_an_agent_cannot_do_the_controllers_job(
    controller: tuple[ControlPlane, Controller, list[float]],
) -> None:
    cluster, _, _ = controller
    cluster.refusals_expected = True
    token = cluster.agent_token("gpu-1")
    with pytest.raises(ApiError) as refused:
        cluster.request(
            "PATCH",
            f"{KUBEVIRT}/kubevirt",
            [{"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}],
            "application/json-patch+json",
            token=token,
        )
    assert refused.value.status == 403


def test_the_leader_writes_once_per_change_and_the_other_replica_waits(
    controller: tuple[ControlPlane, Controller, list[float]], tmp_path: Path
) -> None:
    """Two replicas (two pods of the controller's ServiceAccount) over two nodes: the one
    holding the Lease sends one patch for the whole fleet, the other sends no write at all;
    a steady fleet costs no CR write, a change one. The patch is guarded by the CR's
    ``resourceVersion``: an annotation another writer adds between the leader's read and
    its write makes the server refuse that write, and the leader's retry keeps it."""
    cluster, one, clock = controller
    token = cluster.agent_token("control-node-2", service_account=CONTROLLER_SA)
    two = Controller(
        KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "two", token=token))),
        ControllerSettings(identity="controller-1", grace=GRACE, **bounding()),
        clock=lambda: clock[0],
    )
    pod_one, pod_two = f"{CONTROLLER_SA}-control-node", f"{CONTROLLER_SA}-control-node-2"
    _report(cluster, "gpu-1", _scan("mixed.yaml", "gpu-1"))
    _report(cluster, "gpu-2", _scan("a2-host.yaml", "gpu-2"))
    start = cluster.audit_mark()
    assert one.lead()
    assert two.run_once() is None, "the other replica follows"
    assert "annotations" not in _cr(cluster)["metadata"], "the follower changed the CR"

    # Another writer annotates the CR right after the leader read it.
    real_get = one.api.get
    raced: list[str] = []

    def get_then_race(path: str) -> Any:
        obj = real_get(path)
        if path.endswith("/kubevirts/kubevirt") and not raced:
            raced.append(path)
            cluster.request(
                "PATCH",
                f"{KUBEVIRT}/kubevirt",
                {"metadata": {"annotations": {"example.com/owner": "ops"}}},
                "application/merge-patch+json",
            )
        return obj

    one.api.get = get_then_race  # type: ignore[method-assign]
    first = one.run_once()
    assert first is not None and first.write.writes == 1 and raced
    assert _cr_patches(cluster, start, pod_one) == [422, 200], (
        "the write planned on the older CR is refused; one write for the whole fleet"
    )
    cr = _cr(cluster)
    assert cr["metadata"]["annotations"]["example.com/owner"] == "ops"
    assert cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"][0] == FOREIGN
    assert {"nvidia.com/NVIDIA_A2-4Q", "nvidia.com/NVIDIA_L40S-12Q"} <= _owned(cluster)

    # Steady: no CR write, whichever replica passes.
    mark = cluster.audit_mark()
    steady = one.run_once()
    assert two.run_once() is None
    assert _cr_patches(cluster, mark, pod_one) == []
    assert steady is not None and steady.write.writes == 0

    # gpu-1 (the only node with the L40S types) loses its vGPUs: they stay for the grace
    # period, then go in one write; the A2 types gpu-2 still has stay.
    _report(cluster, "gpu-1", _scan("mixed.yaml", "gpu-1").model_copy(update={"gpus": ()}))
    mark = cluster.audit_mark()
    held = one.run_once()
    assert _cr_patches(cluster, mark, pod_one) == []
    assert held is not None and held.write.writes == 0 and held.decision.waiting
    clock[0] = GRACE + 1
    gone = one.run_once()
    assert gone is not None and {c.op for c in gone.write.changes} == {"remove"}
    assert _cr_patches(cluster, mark, pod_one) == [200]
    owned = _owned(cluster)
    assert "nvidia.com/NVIDIA_L40S-12Q" not in owned and "nvidia.com/NVIDIA_A2-4Q" in owned

    asked = _requests(cluster, start, pod_two)
    assert asked and {e["objectRef"]["resource"] for e in asked} == {"leases"}, (
        "the follower asks about the Lease only"
    )
    assert [e for e in asked if e["verb"] in WRITE_VERBS] == [], "the follower writes nothing"


def test_an_unchanged_status_is_not_decoded_again(
    controller: tuple[ControlPlane, Controller, list[float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass decodes and checks only the statuses whose ``resourceVersion`` changed since
    the last one (counted in-process; the versions are the server's)."""
    cluster, ctl, _ = controller
    mixed = _scan("mixed.yaml", "gpu-1")
    _report(cluster, "gpu-1", mixed)
    decoded: list[str] = []
    real = run.read_report

    def counting(obj: dict[str, Any], bounds: LayoutBounds) -> NodeReport:
        decoded.append(obj["metadata"]["name"])
        return real(obj, bounds)

    monkeypatch.setattr(run, "read_report", counting)
    first = ctl.run_once()
    again = ctl.run_once()
    assert first is not None and again is not None
    assert decoded == ["gpu-1"]
    assert again.reports == first.reports
    _report(cluster, "gpu-1", mixed.model_copy(update={"gpus": mixed.gpus[:1]}))
    changed = ctl.run_once()
    assert changed is not None and changed.reports != first.reports
    assert decoded == ["gpu-1", "gpu-1"]
