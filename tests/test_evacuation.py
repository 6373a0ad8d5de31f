"""The evacuation's pure decision (``vgpu_state.controller.evacuation``): what a node's
status is believed, where a VM goes, what the budget lets start."""

from __future__ import annotations

import datetime as dt
from typing import Any

from vgpu_state.controller import evacuation as ev
from vgpu_state.model.policy import Evacuation

NOW = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)
R = "nvidia.com/NVIDIA_A2-4Q"


def status(name: str, vms: list[str], switch: bool, free: int = 0, **extra: Any) -> dict[str, Any]:
    vgpus = [{"id": f"{name}-{i}", "type": "NVIDIA A2-4Q", "resourceName": R, "vm": vm,
              "holder": f"{vm}-pod"} for i, vm in enumerate(vms)]  # fmt: skip
    vgpus += [{"id": f"{name}-f{i}", "type": "NVIDIA A2-4Q", "resourceName": R}
              for i in range(free)]  # fmt: skip
    gpu: dict[str, Any] = {"address": "0000:41:00.0", "layout": "mdev", "vgpus": vgpus}
    cap: dict[str, Any] = {"resourceName": R, "total": len(vgpus), "free": free}
    if switch:
        gpu["switch"] = {"state": "deferred", "departing": ["A2-4Q"], "withheld": free}
        cap["withheld"] = free
    cap.update(extra)
    return {"metadata": {"name": name}, "status": {"gpus": [gpu], "capacity": [cap]}}


def vmi(key: str, node: str, migratable: bool = True, **meta: Any) -> ev.Vmi:
    ns, name = key.split("/")
    cond = {"type": "LiveMigratable", "status": "True" if migratable else "False",
            "reason": "HostDevice"}  # fmt: skip
    return ev.read_vmi({
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", **meta},
        "spec": {"domain": {"devices": {"gpus": [{"name": "g", "deviceName": R}]}}},
        "status": {"nodeName": node, "phase": "Running", "conditions": [cond]},
    })  # fmt: skip


def config(**limits: Any) -> ev.NodeConfig:
    return ev.NodeConfig(True, Evacuation(**limits), "fp")


def decide(nodes: list[dict[str, Any]], vmis: dict[str, ev.Vmi | None], **kw: Any) -> ev.Decision:
    read = [ev.read_node(n) for n in nodes]
    configs = kw.pop("configs", None) or {n.name: config() for n in read}
    return ev.decide(read, configs, kw.pop("top", Evacuation(max_in_flight=10)),
                     kw.pop("migrations", []), vmis, kw.pop("vms", {}), kw.pop("pdbs", {}),
                     NOW, **kw)  # fmt: skip


def test_the_target_is_the_node_with_most_room_ties_by_name_never_one_with_its_own_switch() -> None:
    nodes = [
        status("a", ["vms/x"], switch=True),
        status("b", [], switch=False, free=2),
        status("c", [], switch=False, free=2),
        status("d", [], switch=True, free=4),  # its own switch pending on the resource
    ]
    d = decide(nodes, {"vms/x": vmi("vms/x", "a")})
    assert [(s.held.vm, s.target, s.kind) for s in d.starts] == [("vms/x", "b", ev.Kind.MIGRATE)]


def test_withheld_capacity_is_no_room_and_moves_headed_there_count() -> None:
    nodes = [status("a", ["vms/x", "vms/y"], switch=True),
             status("b", [], switch=False, free=1)]  # fmt: skip
    vmis = {"vms/x": vmi("vms/x", "a"), "vms/y": vmi("vms/y", "a")}
    d = decide(nodes, vmis, configs={"a": config(max_per_node=5), "b": config()})
    assert [s.held.vm for s in d.starts] == ["vms/x"]
    assert [i.vm for i in d.impossible] == ["vms/y"]
    withheld = [status("a", ["vms/x"], switch=True), status("b", [], False, free=1, withheld=1)]
    d = decide(withheld, {"vms/x": vmi("vms/x", "a")})
    assert not d.starts and "no other node has a free" in d.impossible[0].reason


def test_a_status_is_bounded_before_it_is_believed() -> None:
    lying = status("a", ["vms/x"], switch=True, free=1, withheld=9)
    lying["status"]["gpus"][0]["vgpus"][0]["vm"] = "../../etc"
    node = ev.read_node(lying)
    assert node.held == () and node.room == {R: 0}
    assert any("withheld 9 is more than free 1" in p for p in node.problems)
    assert any("not namespace/name" in p for p in node.problems)
    many = status("a", [], switch=True)
    many["status"]["gpus"][0]["switch"]["departing"] = ["A2-4Q"] * 65
    assert ev.read_node(many).held == () and ev.read_node(many).problems


def test_the_vmi_decides_not_the_report() -> None:
    nodes = [status("a", ["vms/x"], switch=True), status("b", [], False, free=1)]
    for found, why in (
        (None, "does not exist"),
        (vmi("vms/x", "b"), "runs on b, not on a"),
        (vmi("vms/x", "a", annotations={ev.OPT_OUT_ANNOTATION: "never"}), "never"),
    ):
        d = decide(nodes, {"vms/x": found})
        assert not d.starts and why in d.impossible[0].reason


def test_restart_only_when_allowed_and_the_run_strategy_starts_it_again() -> None:
    nodes = [status("a", ["vms/x"], switch=True), status("b", [], False, free=1)]
    stuck = {"vms/x": vmi("vms/x", "a", migratable=False)}
    assert "restart: false" in decide(nodes, stuck).impossible[0].reason
    allowed = {"a": config(restart=True), "b": config()}
    manual = {"vms/x": ev.Vm("Manual", False)}
    d = decide(nodes, stuck, configs=allowed, vms=manual)
    assert "runStrategy Manual" in d.impossible[0].reason
    d = decide(nodes, stuck, configs=allowed, vms={"vms/x": ev.Vm("Always", False)})
    assert [s.kind for s in d.starts] == [ev.Kind.RESTART]


def test_a_budget_that_allows_no_disruption_forbids_kubevirts_own_does_not() -> None:
    nodes = [status("a", ["vms/x"], switch=True), status("b", [], False, free=1)]
    pdb = {"metadata": {"name": "p", "namespace": "vms"},
           "spec": {"selector": {"matchLabels": {"app": "x"}}},
           "status": {"disruptionsAllowed": 0}}  # fmt: skip
    vmis = {"vms/x": vmi("vms/x", "a", labels={"app": "x"})}
    d = decide(nodes, vmis, pdbs={"vms": [ev.read_pdb(pdb)]})
    assert "PodDisruptionBudget vms/p" in d.impossible[0].reason
    own = {**pdb, "metadata": {**pdb["metadata"], "ownerReferences": [{"uid": "uid-x"}]}}
    assert decide(nodes, vmis, pdbs={"vms": [ev.read_pdb(own)]}).starts


def test_the_budget_counts_migrations_in_the_cluster() -> None:
    nodes = [status(n, [f"vms/{n}"], switch=True) for n in "abc"]
    nodes.append(status("z", [], False, free=9))
    vmis = {f"vms/{n}": vmi(f"vms/{n}", n) for n in "abc"}
    running = ev.Migration("m", "vms", "other", "q", "z", R, "Running", NOW)
    d = decide(nodes, vmis, top=Evacuation(max_in_flight=2), migrations=[running])
    assert len(d.starts) == 1 and d.waiting == 2 and d.in_flight == 1
    assert not decide(nodes, vmis, top=Evacuation(max_in_flight=0)).starts


def test_a_failure_pauses_only_under_the_layout_it_was_started_for() -> None:
    nodes = [status("a", ["vms/x", "vms/y"], switch=True), status("b", [], False, free=2)]
    vmis = {"vms/y": vmi("vms/y", "a")}
    old = ev.Migration("m", "vms", "x", "a", "b", R, "Failed", NOW, layout="fp")
    d = decide(nodes, vmis, migrations=[old])
    assert d.pause == {"a": "fp"} and not d.starts
    stale = ev.Migration("m", "vms", "x", "a", "b", R, "Failed", NOW, layout="older")
    assert not decide(nodes, vmis, migrations=[stale]).pause
    late = ev.Migration("m", "vms", "x", "a", "b", R, "Running",
                        NOW - dt.timedelta(minutes=11), layout="fp")  # fmt: skip
    d = decide(nodes, vmis, migrations=[late])
    assert d.pause == {"a": "fp"} and "within 600 s" in d.finished[0].reason
