"""The controller moving VMs under ``in-use: evacuate``, on the real kube-apiserver with
KubeVirt's VirtualMachine, VirtualMachineInstance and VirtualMachineInstanceMigration CRDs
(KubeVirt's own schemas) and the shipped RBAC and admission policies.

The nodes' statuses are written directly in the shape their agents report (a light agent,
as bench/fleet_cluster.py's): a GPU whose switch waits (``switch.state: deferred``) for a
VM holding a vGPU of a departing type. KubeVirt itself does not run here:
:class:`StandInMigrations` is a small stand-in for KubeVirt's migration controller, written
for these tests. It completes a migration by moving the VM (its VMI's ``status.nodeName``,
and the holder in the simulated nodes' statuses), or fails it, or never finishes it.
"""

from __future__ import annotations

import copy
import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import CONTROLLER_SA, CONTROLLER_USER, ApiError, ControlPlane
from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.controller.run import Controller, ControllerSettings
from vgpu_state.kube.api import KubeApi

NODESTATES = "vgpu-state.io/v1alpha1/vgpunodestates"
VMIS = "kubevirt.io/v1/virtualmachineinstances"
VMS = "kubevirt.io/v1/virtualmachines"
VMIMS = "kubevirt.io/v1/virtualmachineinstancemigrations"
NS = "vms"
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"
LABEL = "nvidia.com/vgpu.config"
NODE_LABEL = "vgpu-state.io/node"
PAUSE_ANNOTATION = "vgpu-state.io/evacuation-paused"


def present(obj: dict[str, Any] | None) -> dict[str, Any]:
    """An object the test knows exists (``ControlPlane.get`` gives ``None`` for a 404)."""
    assert obj is not None
    return obj


def layouts(in_use: str = "evacuate", evacuation: str = "") -> str:
    block = f"  evacuation:\n{evacuation}" if evacuation else ""
    return (
        f"version: v1\npolicy:\n  in-use: {in_use}\n{block}vgpu-configs:\n"
        "  a2-4q:\n    - devices: all\n      vgpu-devices:\n        A2-4Q: 4\n"
        "  a2-2q:\n    - devices: all\n      vgpu-devices:\n        A2-2Q: 8\n"
    )


# the simulated fleet ---------------------------------------------------------------------------
def vgpu(node: str, i: int, vm: str | None = None) -> dict[str, Any]:
    v: dict[str, Any] = {
        "id": str(uuid.uuid5(uuid.NAMESPACE_OID, f"{node}/{i}")),
        "type": "NVIDIA A2-4Q",
        "resourceName": A2_4Q,
    }
    if vm is not None:
        v["holder"] = f"{vm.split('/')[0]}/virt-launcher-{vm.split('/')[1]}-x1"
        v["vm"] = vm
    return v


def status(node: str, held: list[str], switch: bool, free: int | None = None) -> dict[str, Any]:
    """A node with one A2 carrying four A2-4Q, ``held`` by these VMs; ``switch``: its switch
    to 8 × A2-2Q is deferred for them (the free A2-4Q withheld)."""
    vgpus = [vgpu(node, i, held[i] if i < len(held) else None) for i in range(4)]
    free = 4 - len(held) if free is None else free
    gpu: dict[str, Any] = {"address": "0000:41:00.0", "model": "A2", "layout": "mdev",
                           "vgpus": vgpus}  # fmt: skip
    capacity: dict[str, Any] = {"resourceName": A2_4Q, "total": 4, "free": free}
    if switch:
        gpu["switch"] = {"state": "deferred", "policy": "evacuate", "departing": ["A2-4Q"],
                         "withheld": free, "message": "held by " + ", ".join(held)}  # fmt: skip
        capacity["withheld"] = free
    return {"gpus": [gpu], "capacity": [capacity], "vgpuCount": 4}


def report(cluster: ControlPlane, node: str, body: dict[str, Any]) -> None:
    if cluster.get(NODESTATES, node) is None:
        cluster.write(NODESTATES, node, {"spec": {"nodeName": node}})
    current = cluster.get(NODESTATES, node)
    assert current is not None
    current["status"] = body
    cluster.request("PUT", f"/apis/{NODESTATES}/{node}/status", current)


def place_vm(
    cluster: ControlPlane,
    name: str,
    node: str,
    migratable: bool = True,
    run_strategy: str = "Always",
    annotations: dict[str, str] | None = None,
) -> None:
    """A VM and its running VMI on ``node``, requesting one A2-4Q (as KubeVirt writes them)."""
    template = {"spec": {"domain": {"devices": {"gpus": [{"name": "gpu1", "deviceName": A2_4Q}]}}}}
    cluster.write(VMS, name, {"metadata": {"annotations": annotations or {}},
                              "spec": {"runStrategy": run_strategy, "template": template}},
                  NS)  # fmt: skip
    condition = {"type": "LiveMigratable", "status": "True" if migratable else "False"}
    if not migratable:
        condition |= {"reason": "HostDeviceNotLiveMigratable",
                      "message": "a host device is not live-migratable"}  # fmt: skip
    cluster.write(VMIS, name, {
        "metadata": {"labels": {"kubevirt.io/vm": name}},
        "spec": template["spec"],
        "status": {"nodeName": node, "phase": "Running", "conditions": [condition]},
    }, NS)  # fmt: skip


class StandInMigrations:
    """A stand-in for KubeVirt's migration controller (these tests' own, not KubeVirt's):
    each pending ``VirtualMachineInstanceMigration`` is completed (the VMI now runs on the
    target node its ``addedNodeSelector`` names, and the simulated nodes' statuses move the
    holder), failed, or left running, as the test says."""

    def __init__(self, cluster: ControlPlane, outcome: str = "Succeeded") -> None:
        self.cluster = cluster
        self.outcome = outcome
        self.moved: list[tuple[str, str, str]] = []

    def step(self, limit: int | None = None) -> int:
        done = 0
        for m in sorted(self.cluster.list(VMIMS, NS), key=lambda m: m["metadata"]["name"]):
            if (m.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if self.outcome == "Running" or (limit is not None and done >= limit):
                continue
            name = m["metadata"]["name"]
            vmi = m["spec"]["vmiName"]
            target = m["spec"]["addedNodeSelector"]["kubernetes.io/hostname"]
            source = m["metadata"]["labels"][NODE_LABEL]
            if self.outcome == "Succeeded":
                self.cluster.write(VMIS, vmi, {"status": {"nodeName": target}}, NS)
                self._move_holder(f"{NS}/{vmi}", source, target)
                self.moved.append((vmi, source, target))
            self.cluster.request(
                "PATCH",
                f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstancemigrations/{name}/status",
                {"status": {"phase": self.outcome}},
                "application/merge-patch+json",
            )
            done += 1
        return done

    def _move_holder(self, vm: str, source: str, target: str) -> None:
        for node, gone in ((source, True), (target, False)):
            obj = self.cluster.get(NODESTATES, node)
            assert obj is not None
            st = copy.deepcopy(obj["status"])
            gpu = st["gpus"][0]
            for v in gpu["vgpus"]:
                if gone and v.get("vm") == vm:
                    v.pop("vm"), v.pop("holder")
                    break
                if not gone and "holder" not in v:
                    v["holder"], v["vm"] = f"{vm}-launcher", vm
                    break
            st["capacity"][0]["free"] += 1 if gone else -1
            if gone and "switch" in gpu and not any("vm" in v for v in gpu["vgpus"]):
                gpu["switch"]["state"] = "planned"  # nothing in the way: the agent switches
            report(self.cluster, node, st)


# the controller -----------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.offset = dt.timedelta(0)
        self.mono = 0.0

    def wall(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.offset

    def clock(self) -> float:
        return self.mono


def controller(
    cluster: ControlPlane,
    tmp_path: Path,
    document: str,
    clock: Clock,
    identity: str = "controller-0",
) -> Controller:
    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    source = StaticConfigSource(load_text(document, "layouts.yaml", catalog=default_catalog()))
    settings = ControllerSettings(identity=identity, layouts=source,
                                  catalog=default_catalog())  # fmt: skip
    return Controller(api, settings, clock=clock.clock, wall=clock.wall)


@pytest.fixture
def fleet(kubevirt_vms: ControlPlane) -> ControlPlane:
    cluster = kubevirt_vms
    cluster.write("kubevirt.io/v1/kubevirts", "kubevirt", {"spec": {}}, "kubevirt")
    cluster.refusals_expected = False
    return cluster


def two_nodes(cluster: ControlPlane, room_on_b: int = 1, vm: str = "win-7",
              migratable: bool = True, **kw: Any) -> None:  # fmt: skip
    """node-a switches its A2 to 8 × A2-2Q, deferred for ``vm``; node-b runs A2-4Q with
    ``room_on_b`` free."""
    cluster.ensure_node("node-a", {LABEL: "a2-2q"})
    cluster.ensure_node("node-b", {LABEL: "a2-4q"})
    report(cluster, "node-a", status("node-a", [f"{NS}/{vm}"], switch=True))
    held_b = [f"{NS}/other-{i}" for i in range(4 - room_on_b)]
    report(cluster, "node-b", status("node-b", held_b, switch=False))
    place_vm(cluster, vm, "node-a", migratable=migratable, **kw)


def migrations(cluster: ControlPlane) -> list[dict[str, Any]]:
    return cluster.list(VMIMS, NS)


def events(cluster: ControlPlane, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for ns in (NS, "default")
        for e in cluster.list("v1/events", ns)
        if e.get("reason") == reason
    ]


def test_a_held_vm_is_migrated_to_the_node_with_room_only_under_evacuate(
    fleet: ControlPlane, tmp_path: Path
) -> None:
    cluster = fleet
    two_nodes(cluster)
    clock = Clock()
    # Under protect (the default) nothing moves, nothing KubeVirt's is even read.
    mark = cluster.audit_mark()
    protect = controller(cluster, tmp_path, layouts("protect"), clock)
    assert protect.run_once() is not None
    assert migrations(cluster) == []
    touched = [
        e
        for e in cluster.audit(mark, CONTROLLER_USER)
        if e.get("objectRef", {}).get("resource", "").startswith("virtualmachine")
    ]
    assert touched == []

    ctl = controller(cluster, tmp_path, layouts(), clock)
    assert ctl.run_once() is not None
    (m,) = migrations(cluster)
    assert m["spec"] == {
        "vmiName": "win-7",
        "addedNodeSelector": {"kubernetes.io/hostname": "node-b"},
    }
    assert m["metadata"]["labels"] == {"vgpu-state.io/evacuation": "true", NODE_LABEL: "node-a"}
    started = events(cluster, "EvacuationStarted")
    kinds = sorted(e["involvedObject"]["kind"] for e in started)
    assert kinds == ["VGPUNodeState", "VirtualMachineInstance"]
    assert all("vms/win-7" in e["message"] and "node-b" in e["message"] for e in started)
    # A second pass while it runs starts nothing more (counted from the cluster).
    ctl.run_once()
    assert len(migrations(cluster)) == 1

    stand_in = StandInMigrations(cluster)
    assert stand_in.step() == 1
    ctl.run_once()
    assert len(events(cluster, "EvacuationSucceeded")) == 2
    assert present(cluster.get(VMIS, "win-7", NS))["status"]["nodeName"] == "node-b"
    a = present(cluster.get(NODESTATES, "node-a"))["status"]["gpus"][0]
    assert a["switch"]["state"] == "planned" and not any("vm" in v for v in a["vgpus"])
    assert len(migrations(cluster)) == 1, "nothing left to move"
    moves = ctl.metrics.evacuation_moves
    assert moves.labels("migrate", "started")._value.get() == 1
    assert moves.labels("migrate", "succeeded")._value.get() == 1
    assert ctl.metrics.evacuation_in_flight._value.get() == 0


def test_no_room_elsewhere_moves_nothing_and_names_the_reason_once(
    fleet: ControlPlane, tmp_path: Path
) -> None:
    cluster = fleet
    two_nodes(cluster, room_on_b=0)
    ctl = controller(cluster, tmp_path, layouts(), Clock())
    for _ in range(3):
        ctl.run_once()
    assert migrations(cluster) == []
    impossible = events(cluster, "EvacuationImpossible")
    assert sorted(e["involvedObject"]["kind"] for e in impossible) == [
        "VGPUNodeState", "VirtualMachineInstance",
    ]  # fmt: skip
    for e in impossible:
        assert "vms/win-7" in e["message"] and "no other node has a free" in e["message"]
        assert e["count"] == 1, "named once, not every pass"
    assert cluster.get(VMIS, "win-7", NS) is not None


def test_a_node_lying_about_a_vm_of_another_node_moves_nothing(
    fleet: ControlPlane, tmp_path: Path
) -> None:
    cluster = fleet
    two_nodes(cluster)
    cluster.ensure_node("node-c", {LABEL: "a2-2q"})
    # node-c claims to hold win-7 (which KubeVirt runs on node-a).
    report(cluster, "node-c", status("node-c", [f"{NS}/win-7"], switch=True))
    report(cluster, "node-a", status("node-a", [], switch=False))
    ctl = controller(cluster, tmp_path, layouts(), Clock())
    ctl.run_once()
    assert migrations(cluster) == []
    (on_vmi,) = [e for e in events(cluster, "EvacuationImpossible")
                 if e["involvedObject"]["kind"] == "VirtualMachineInstance"]  # fmt: skip
    assert "runs on node-a, not on node-c" in on_vmi["message"]


def test_a_vm_that_cannot_migrate_is_not_moved_and_named(
    fleet: ControlPlane, tmp_path: Path
) -> None:
    cluster = fleet
    two_nodes(cluster, migratable=False)
    ctl = controller(cluster, tmp_path, layouts(), Clock())
    ctl.run_once()
    assert migrations(cluster) == []
    assert cluster.get(VMIS, "win-7", NS) is not None, "restart is off by default"
    (named, _) = events(cluster, "EvacuationImpossible")
    assert "cannot live-migrate" in named["message"]
    assert "HostDeviceNotLiveMigratable" in named["message"]


def test_a_vm_that_cannot_migrate_is_restarted_where_the_policy_allows(
    fleet: ControlPlane, tmp_path: Path
) -> None:
    cluster = fleet
    two_nodes(cluster, migratable=False)
    ctl = controller(cluster, tmp_path, layouts(evacuation="    restart: true\n"), Clock())
    ctl.run_once()
    assert migrations(cluster) == []
    assert cluster.get(VMIS, "win-7", NS) is None, "its VMI deleted: KubeVirt starts it again"
    assert any("restarted" in e["message"] for e in events(cluster, "EvacuationStarted"))


def test_a_pod_disruption_budget_that_allows_none_forbids_the_move(
    fleet: ControlPlane, tmp_path: Path
) -> None:
    cluster = fleet
    two_nodes(cluster)
    cluster.request("POST", f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-win-7"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"kubevirt.io/vm": "win-7"}}},
    })  # fmt: skip
    pdb = cluster.get("policy/v1/poddisruptionbudgets", "keep-win-7", NS)
    assert pdb is not None
    pdb["status"] = {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
                     "expectedPods": 1, "observedGeneration": 1}  # fmt: skip
    cluster.request(
        "PUT", f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/keep-win-7/status", pdb
    )
    ctl = controller(cluster, tmp_path, layouts(), Clock())
    ctl.run_once()
    assert migrations(cluster) == []
    assert any("PodDisruptionBudget vms/keep-win-7" in e["message"]
               for e in events(cluster, "EvacuationImpossible"))  # fmt: skip


@pytest.mark.parametrize("outcome", ["Failed", "Running"])
def test_a_failed_or_timed_out_migration_pauses_the_node_until_its_layout_changes(
    fleet: ControlPlane, tmp_path: Path, outcome: str
) -> None:
    cluster = fleet
    two_nodes(cluster)
    place_vm(cluster, "win-8", "node-a")
    report(cluster, "node-a", status("node-a", [f"{NS}/win-7", f"{NS}/win-8"], switch=True))
    report(cluster, "node-b", status("node-b", [], switch=False))
    clock = Clock()
    mark = cluster.audit_mark()
    ctl = controller(cluster, tmp_path, layouts(), clock)
    ctl.run_once()
    assert len(migrations(cluster)) == 1
    StandInMigrations(cluster, outcome).step()
    if outcome == "Running":
        clock.offset = dt.timedelta(minutes=11)  # past the 10 m timeout
    ctl.run_once()
    failed = events(cluster, "EvacuationFailed")
    assert sorted(e["involvedObject"]["kind"] for e in failed) == [
        "VGPUNodeState", "VirtualMachineInstance",
    ]  # fmt: skip
    assert all("vms/win-7" in e["message"] and "paused" in e["message"] for e in failed)
    if outcome == "Running":
        assert "did not finish within 600 s" in failed[0]["message"]
    state = present(cluster.get(NODESTATES, "node-a"))
    assert state["metadata"]["annotations"][PAUSE_ANNOTATION]
    ctl.run_once()
    assert len(migrations(cluster)) == 1, "win-8 stays: the node is paused"
    # KubeVirt gives up on a migration it still ran (it no longer holds the budget).
    StandInMigrations(cluster, "Failed").step()
    ctl.run_once()
    assert len(migrations(cluster)) == 1, "still paused"
    # A new leader (another replica, nothing in memory, the old one's Lease expired) keeps
    # the pause: it is in the cluster.
    clock.offset += dt.timedelta(minutes=1)
    again = controller(cluster, tmp_path, layouts(), clock, "controller-1")
    assert again.run_once() is not None
    assert len(migrations(cluster)) == 1
    # The node's layout changes (another config): evacuation resumes.
    other = layouts().replace("A2-2Q: 8", "A2-1Q: 16")
    clock.offset += dt.timedelta(minutes=1)
    assert controller(cluster, tmp_path, other, clock, "controller-2").run_once() is not None
    assert len(migrations(cluster)) == 2
    pauses = [
        e
        for e in cluster.audit(mark, CONTROLLER_USER)
        if e["verb"] == "patch" and e["objectRef"].get("resource") == "vgpunodestates"
    ]
    assert len(pauses) == 1, "the pause is written once"


def test_five_nodes_with_a_budget_of_one_never_have_two_migrations_in_flight(
    fleet: ControlPlane, tmp_path: Path
) -> None:
    cluster = fleet
    for spare in ("spare-a", "spare-b"):
        cluster.ensure_node(spare, {LABEL: "a2-4q"})
        report(cluster, spare, status(spare, [], switch=False))
    for i in range(5):
        node = f"node-{i}"
        cluster.ensure_node(node, {LABEL: "a2-2q"})
        report(cluster, node, status(node, [f"{NS}/vm-{i}"], switch=True))
        place_vm(cluster, f"vm-{i}", node)
    mark = cluster.audit_mark()
    ctl = controller(cluster, tmp_path, layouts(), Clock())
    stand_in = StandInMigrations(cluster)
    for _ in range(12):
        ctl.run_once()
        ctl.run_once()  # a second pass before KubeVirt finished: still one in flight
        stand_in.step()
    assert len(stand_in.moved) == 5, "every VM left its node, one at a time"
    # In flight, as the API server saw it: the controller's creates, the stand-in's ends.
    flight, most, reads_in_flight = 0, 0, 0
    for e in cluster.audit(mark):
        ref = e.get("objectRef", {})
        if ref.get("resource") == "virtualmachineinstances" and flight:
            reads_in_flight += e["user"]["username"] == CONTROLLER_USER
        if ref.get("resource") != "virtualmachineinstancemigrations":
            continue
        code = e.get("responseStatus", {}).get("code", 0)
        if e["verb"] == "create" and e["user"]["username"] == CONTROLLER_USER and code == 201:
            flight += 1
        elif e["verb"] == "patch" and ref.get("subresource") == "status" and code == 200:
            flight -= 1
        most = max(most, flight)
    assert most == 1
    assert reads_in_flight == 0, "with the budget spent no VM is read"


def test_only_labelled_steered_migrations_of_the_controller_and_no_pause_lifted_by_a_node(
    fleet: ControlPlane,
) -> None:
    cluster = fleet
    cluster.refusals_expected = True
    two_nodes(cluster)
    token = cluster.agent_token("control-node", service_account=CONTROLLER_SA)
    path = f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstancemigrations"

    def migration(labels: dict[str, str], target: str) -> dict[str, Any]:
        return {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstanceMigration",
            "metadata": {"generateName": "m-", "labels": labels},
            "spec": {"vmiName": "win-7", "addedNodeSelector": {"kubernetes.io/hostname": target}},
        }

    evac = {"vgpu-state.io/evacuation": "true"}
    for labels, target in ((evac, "node-b"), ({**evac, NODE_LABEL: "node-a"}, "node-a")):
        with pytest.raises(ApiError) as refused:
            cluster.request("POST", path, migration(labels, target), token=token)
        assert "vgpu-state controller migration must" in str(refused.value)
    cluster.request("POST", path, migration({**evac, NODE_LABEL: "node-a"}, "node-b"), token=token)
    # The agents' ServiceAccount moves no VM.
    agent = cluster.agent_token("node-a")
    with pytest.raises(ApiError) as refused:
        cluster.request("POST", path, migration({**evac, NODE_LABEL: "node-a"}, "node-b"),
                        token=agent)  # fmt: skip
    assert refused.value.status == 403
    # A node may not lift (or set) its own evacuation pause.
    cluster.request("PATCH", f"/apis/{NODESTATES}/node-a",
                    {"metadata": {"annotations": {PAUSE_ANNOTATION: "abc"}}},
                    "application/merge-patch+json")  # fmt: skip
    with pytest.raises(ApiError) as refused:
        cluster.request("PATCH", f"/apis/{NODESTATES}/node-a",
                        {"metadata": {"annotations": {PAUSE_ANNOTATION: None}}},
                        "application/merge-patch+json", token=agent)  # fmt: skip
    assert "evacuation-paused" in str(refused.value)


def test_the_watching_controller_moves_the_vm_from_its_watched_statuses(
    fleet: ControlPlane, tmp_path: Path
) -> None:
    """The controller's own loop (watches, passes every interval while a move is in flight):
    the VM moves, and the statuses come from the watched cache, not a list per pass."""
    import threading
    import time

    cluster = fleet
    two_nodes(cluster)
    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    source = StaticConfigSource(load_text(layouts(), "layouts.yaml", catalog=default_catalog()))
    settings = ControllerSettings(identity="controller-0", layouts=source,
                                  catalog=default_catalog(), interval=0.5)  # fmt: skip
    ctl = Controller(api, settings)
    mark = cluster.audit_mark()
    stop = threading.Event()
    thread = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
    thread.start()
    stand_in = StandInMigrations(cluster)
    try:
        deadline = time.monotonic() + 30
        while not stand_in.step():
            assert time.monotonic() < deadline, "no migration within 30 s"
            time.sleep(0.2)
        while not events(cluster, "EvacuationSucceeded"):
            assert time.monotonic() < deadline, "its success not named within 30 s"
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(30)
    assert present(cluster.get(VMIS, "win-7", NS))["status"]["nodeName"] == "node-b"
    lists = [
        e
        for e in cluster.audit(mark, CONTROLLER_USER)
        if e["verb"] == "list" and e["objectRef"].get("resource") == "vgpunodestates"
    ]
    passes = ctl.metrics.passes.labels("ok")._value.get()
    assert passes >= 2 and len(lists) == 1, (passes, len(lists))  # the watch's first list
