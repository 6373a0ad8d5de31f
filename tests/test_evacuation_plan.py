"""``policy: {in-use: evacuate}`` in plans: the steps of ``protect``, plus the VMs that
would move and the capacity withheld while a switch is pending.

Under ``evacuate`` a held vGPU is never destroyed, exactly as under ``protect``; in
addition a deferred switch names each holder in its way (a VM when the holder is a
KubeVirt virt-launcher pod, with the resource its vGPU is offered as), and the free
vGPUs of the departing types are withheld (not offered) until the switch runs. The
nodes are simulated (the simulator's scan, its holders), the commands run as a person
runs them; ``fleet plan`` reads a fleet snapshot file whose statuses are built by the
status writer's own pieces (as ``tests/test_fleet_markdown.py`` does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings

from tests.builders import desired
from tests.test_deferred_switch import node_and_targets
from tests.test_fleet_markdown import _status
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.kube.podresources.client import PodHolder
from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.inuse import InUse, holder_vm
from vgpu_state.model.plan import ActionKind, Capacity, Move, Plan
from vgpu_state.model.policy import InUsePolicy, Policy
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.planner import plan as plan_of
from vgpu_state.planner.evacuation import NodeEvacuation, NodeMove, node_evacuation
from vgpu_state.ports import MemoryCluster
from vgpu_state.reconcile import Ports, Settings
from vgpu_state.reconcile.evacuation import MAX_MOVES, MAX_TARGETS, EvacuationSummary
from vgpu_state.reconcile.fleet import NodeOutcome, NodePlan, ReportedHost
from vgpu_state.reconcile.once import read_and_plan
from vgpu_state.reconcile.report import QuietReporter
from vgpu_state.render import render_json, render_text
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.node import held_vgpus
from vgpu_state.sim.spec import parse_spec

CATALOG = default_catalog()
GPU = "0000:41:00.0"
HELD = "5a294872-1856-55f3-a091-09cf44c0103b"
FREE = ("9a51921b-dbd6-5049-9bad-1a01f4ed1d83", "e0992c7c-da2c-5ca7-97ba-93aa3ab85483")
WIN7 = str(PodHolder("vms", "virt-launcher-win-7-x2k9p"))
"""``pod vms/virt-launcher-win-7-x2k9p (VM vms/win-7)``, as the agent names the holder."""
JOB = str(PodHolder("default", "cuda-job"))

A2_SPEC = """\
node: {node}
gpus:
  - address: "0000:41:00.0"
    model: A2
    vgpus:
      - {{type: A2-4Q, vf: 0, uuid: 5a294872-1856-55f3-a091-09cf44c0103b{held}}}
      - {{type: A2-4Q, vf: 1, uuid: 9a51921b-dbd6-5049-9bad-1a01f4ed1d83}}
      - {{type: A2-4Q, vf: 2, uuid: e0992c7c-da2c-5ca7-97ba-93aa3ab85483}}
"""

CONFIG = """\
version: v1
policy:
  in-use: {policy}
vgpu-configs:
  a2-4g:
    - devices: all
      vgpu-devices: {{A2-4Q: 3}}
  a2-2g:
    - devices: all
      vgpu-devices: {{A2-2Q: 8}}
"""


def spec(holder: str | None = WIN7, node: str = "node-a") -> str:
    """An A2 with three A2-4Q; the first held by ``holder`` (if any)."""
    return A2_SPEC.format(node=node, held=f', in-use: "{holder}"' if holder else "")


def scanned(text: str) -> tuple[NodeSnapshot, InUse]:
    with SimHost(parse_spec(text, catalog=CATALOG), in_memory=True) as host:
        return host.scan(), held_vgpus(host)


def planned(policy: str, config: str = "a2-2g", holder: str | None = WIN7) -> Plan:
    """The plan of the simulated A2 node under ``config``, made as its agent makes it."""
    snapshot, in_use = scanned(spec(holder))
    ports = Ports(
        ReportedHost(snapshot),  # the scan as given; a write would raise
        MemoryCluster(snapshot.node, {}, in_use),
        StaticConfigSource(load_text(CONFIG.format(policy=policy), "c.yaml", catalog=CATALOG)),
    )
    _, made = read_and_plan(ports, Settings(catalog=CATALOG), QuietReporter(), config)
    return made


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.stdout


# the holder text ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("holder", "vm"),
    [
        (WIN7, "vms/win-7"),
        (str(PodHolder("a", "virt-launcher-db.eu-1-abcde")), "a/db.eu-1"),
        (JOB, None),
        ("vm default/win-1", None),  # free text (the command line, the simulator)
        ("VM win-7 (process 4000, qemu-system-x86_64)", None),  # a process on the host
        ("pod a/virt-launcher-x-abcde (VM b/x)", None),  # another namespace
        ("pod a/virt-launcher-x-abcde (VM a/y)", None),  # another VM than the pod's
        ("pod A/virt-launcher-x-abcde (VM A/x)", None),  # not a Kubernetes name
        (f"pod a/virt-launcher-{'v' * 254}-abcde (VM a/{'v' * 254})", None),  # too long
    ],
)
def test_only_a_virt_launcher_pod_holder_is_a_vm(holder: str, vm: str | None) -> None:
    assert holder_vm(holder) == vm


# the config file -------------------------------------------------------------------------------
def test_validate_accepts_evacuate_and_refuses_a_per_config_max_in_flight(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        CONFIG.format(policy="evacuate").replace(
            "  in-use: evacuate\n",
            "  in-use: evacuate\n  evacuation: {max-in-flight: 3, max-per-node: 2, timeout: 15m}\n",
        )
    )
    code, out = run("validate", "-f", str(good))
    assert code == 0, out
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        CONFIG.format(policy="evacuate").replace(
            "  a2-2g:\n    - devices: all\n      vgpu-devices: {A2-2Q: 8}\n",
            "  a2-2g:\n    policy:\n      evacuation: {max-in-flight: 3, timeout: 2d}\n"
            "    entries:\n      - devices: all\n        vgpu-devices: {A2-2Q: 8}\n",
        )
    )
    result = CliRunner().invoke(cli, ["validate", "-f", str(bad)])
    assert result.exit_code == 1
    assert f"{bad}:10:35: max-in-flight (found 3) counts VMs moving at once" in result.output
    assert (
        f"{bad}:10:47: timeout must be a duration such as 90s, 10m or 1h (a whole number with "
        "s, m or h), found '2d' (vgpu-configs.a2-2g.policy.evacuation.timeout)"
    ) in result.output


# one node's plan -----------------------------------------------------------------------------
def test_evacuate_takes_the_steps_of_protect_and_names_the_vm_and_the_withheld_vgpus() -> None:
    protect, evacuate = planned("protect"), planned("evacuate")
    assert evacuate.actions == protect.actions == ()
    assert [(b.address, b.kind, b.code, b.holder) for b in evacuate.blocked] == [
        (b.address, b.kind, b.code, b.holder) for b in protect.blocked
    ]
    assert evacuate.summary == protect.summary
    assert evacuate.disruption == protect.disruption

    (gpu,) = evacuate.gpus
    assert gpu.deferred_switch is not None
    assert gpu.deferred_switch.moves == (
        Move(
            holder=WIN7,
            vm="vms/win-7",
            vgpu=HELD,
            type_name="A2-4Q",
            resource="nvidia.com/NVIDIA_A2-4Q",
        ),
    )
    assert gpu.withheld == FREE
    four_q = next(c for c in evacuate.capacity if c.type_name == "NVIDIA A2-4Q")
    assert (four_q.before, four_q.after, four_q.held, four_q.withheld) == (3, 3, 1, 2)

    # protect: no moves, nothing withheld, and the JSON has none of the new keys.
    (kept,) = protect.gpus
    assert kept.deferred_switch is not None and kept.deferred_switch.moves == ()
    assert kept.withheld == ()
    assert all(c.withheld == 0 for c in protect.capacity)
    doc = json.loads(render_json(protect))
    assert "moves" not in doc["gpus"][0]["deferred_switch"]
    assert "withheld" not in doc["gpus"][0]
    assert all("withheld" not in c for c in doc["capacity"])
    assert "evacuation" not in doc["policy"]
    assert "would move" not in render_text(protect)


def test_a_reverted_layout_withholds_nothing() -> None:
    """While the switch to A2-2Q is pending the free A2-4Q are withheld; back to the layout
    the GPU has, no switch is pending and every free vGPU is offered again."""
    switching = planned("evacuate", config="a2-2g")
    assert switching.gpus[0].withheld == FREE
    assert node_evacuation(switching, scanned(spec())[0]).room == ()
    p = planned("evacuate", config="a2-4g")
    assert p.is_converged
    (gpu,) = p.gpus
    assert gpu.deferred_switch is None and gpu.withheld == ()
    assert all(c.withheld == 0 for c in p.capacity)
    assert node_evacuation(p).room == (("nvidia.com/NVIDIA_A2-4Q", p.gpus[0].publish, 2),)


def test_a_switch_that_runs_withholds_the_free_vgpus_it_destroys() -> None:
    """Nobody holds a vGPU: the switch runs (it waits for a rollout slot), and until it
    destroys them the free A2-4Q are not offered."""
    p = planned("evacuate", holder=None)
    assert p.summary.destroy == 3 and p.summary.create == 8
    (gpu,) = p.gpus
    assert gpu.deferred_switch is None
    assert gpu.withheld == tuple(sorted((HELD, *FREE)))
    four_q = next(c for c in p.capacity if c.type_name == "NVIDIA A2-4Q")
    assert (four_q.before, four_q.after, four_q.withheld) == (3, 0, 3)
    assert "[3 withheld: switch pending; none left" in render_text(p)
    assert planned("protect", holder=None).gpus[0].withheld == ()


def test_a_holder_that_is_not_a_vm_is_named_as_one_that_cannot_be_moved() -> None:
    p = planned("evacuate", holder=JOB)
    (gpu,) = p.gpus
    assert gpu.deferred_switch is not None
    (move,) = gpu.deferred_switch.moves
    assert (move.holder, move.vm) == (JOB, None)
    lines = render_text(p).splitlines()
    assert (
        f"  # pod default/cuda-job cannot be moved off GPU {GPU} (in-use: evacuate): it is "
        "not a KubeVirt VM; the switch waits until it releases A2-4Q"
    ) in lines
    assert "Cannot be moved (not a KubeVirt VM): pod default/cuda-job (1 vGPU)" in lines


def test_plan_names_the_vm_that_would_move_and_the_withheld_capacity(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(spec())
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.format(policy="evacuate"))
    args = ["plan", "-f", str(config), "-c", "a2-2g", "--sim", str(node)]
    code, text = run(*args)
    assert code == 0, text
    lines = text.splitlines()
    switch = lines.index(
        f"  # switch deferred: waits for {WIN7}; 2 free vGPUs kept; 8 to create then"
    )
    assert lines[switch + 1] == (
        f"  # vms/win-7 would move off GPU {GPU} (in-use: evacuate): it holds A2-4Q, "
        "which the new layout drops"
    )
    assert "  nvidia.com/NVIDIA_A2-4Q  3 → 3  [1 held; 2 withheld: switch pending]" in lines
    assert f"Protected (policy in-use: evacuate): {WIN7} (1 vGPU)" in lines
    assert "Would move (policy in-use: evacuate): vms/win-7 (1 vGPU)" in lines
    assert "will be destroyed" not in text

    code, out = run(*args, "-o", "json")
    assert code == 0, out
    doc = json.loads(out)
    (gpu,) = doc["gpus"]
    assert gpu["withheld"] == list(FREE)
    assert gpu["deferred_switch"]["moves"] == [
        {
            "holder": WIN7,
            "vm": "vms/win-7",
            "vgpu": HELD,
            "type_name": "A2-4Q",
            "resource": "nvidia.com/NVIDIA_A2-4Q",
        }
    ]
    four_q = next(c for c in doc["capacity"] if c["type_name"] == "NVIDIA A2-4Q")
    assert four_q["withheld"] == 2
    assert doc["policy"]["in_use"] == "evacuate"


def test_evacuation_limits_reach_the_plan_s_policy(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        CONFIG.format(policy="evacuate").replace(
            "  in-use: evacuate\n",
            "  in-use: evacuate\n  evacuation: {max-in-flight: 0, timeout: 90s, restart: true}\n",
        )
    )
    node = tmp_path / "node.yaml"
    node.write_text(spec())
    code, out = run("plan", "-f", str(config), "-c", "a2-2g", "--sim", str(node), "-o", "json")
    assert code == 0, out
    assert json.loads(out)["policy"]["evacuation"] == {
        "max_in_flight": 0,
        "max_per_node": 1,
        "timeout_seconds": 90,
        "restart": True,
    }


# fleet plan ----------------------------------------------------------------------------------
def write_fleet(path: Path, nodes: Mapping[str, tuple[str, str | None]]) -> Path:
    """A fleet snapshot: node name -> (config label, holder of its first A2-4Q)."""
    records: list[dict[str, Any]] = [
        {
            "kind": "vgpu-state-fleet-snapshot",
            "format_version": "1",
            "taken_at": "2026-11-25T06:00:00Z",
            "source": {"server": "https://prod.example:6443", "context": "prod"},
        },
        *(
            {"kind": "Node", "name": n, "labels": {"nvidia.com/vgpu.config": c}}
            for n, (c, _) in sorted(nodes.items())
        ),
    ]
    for name, (_, holder) in sorted(nodes.items()):
        snapshot, in_use = scanned(spec(holder, name))
        records.append(
            {"kind": "VGPUNodeState", "name": name, "status": _status(snapshot, dict(in_use))}
        )
    records.append({"kind": "end", "nodes": len(nodes), "states": len(nodes)})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def fleet_plan(tmp_path: Path, snapshot: Path, policy: str, *args: str) -> str:
    config = tmp_path / "layouts.yaml"
    config.write_text(CONFIG.format(policy=policy))
    argv = ["fleet", "plan", "-f", str(config), "--from", str(snapshot), "--jobs", "1", *args]
    code, out = run(*argv)
    assert code == 0, out
    return out


ROOM = {
    "node-a": ("a2-2g", WIN7),  # switches; its VM is in the way
    "node-b": ("a2-4g", None),  # keeps three free A2-4Q
    "node-c": ("a2-4g", JOB),  # two free A2-4Q
    "node-d": ("a2-2g", JOB),  # switches; a pod is in the way
}


def test_fleet_plan_lists_each_move_with_the_nodes_that_have_room(tmp_path: Path) -> None:
    snapshot = write_fleet(tmp_path / "fleet.jsonl", ROOM)
    lines = fleet_plan(tmp_path, snapshot, "evacuate", "--max-age", "0").splitlines()
    start = lines.index(
        "Moves (in-use: evacuate): 1 VM would move, 1 move cannot happen; at most 1 at a "
        "time fleet-wide (max-in-flight)."
    )
    assert lines[start + 1 : start + 6] == [
        "  vms/win-7 leaves node-a: A2-4Q free on node-b, node-c",
        f"  {JOB} on node-d cannot be moved: not a KubeVirt VM; GPU {GPU} switches once it lets go",
        "Withheld during the change (free vGPUs not offered while a switch is pending):",
        "  nvidia.com/NVIDIA_A2-4Q: 4 on 2 node(s)",
        "Fleet: 4 node(s): 2 with changes, 2 unchanged, 0 unknown, 0 error(s). 0 to create, "
        "0 to destroy, 0 SR-IOV to enable, 22 blocked.",
    ]

    doc = json.loads(fleet_plan(tmp_path, snapshot, "evacuate", "--max-age", "0", "-o", "json"))
    ev = doc["evacuation"]
    assert ev["max_in_flight"] == 1
    assert ev["totals"] == {"moves": 2, "possible": 1, "impossible": 1}
    first, second = ev["moves"]
    assert (first["vm"], first["node"], first["targets"], first["possible"]) == (
        "vms/win-7",
        "node-a",
        ["node-b", "node-c"],
        True,
    )
    assert first["resource"] == "nvidia.com/NVIDIA_A2-4Q" and first["vgpu"] == HELD
    assert (second["vm"], second["holder"], second["reason"]) == (None, JOB, "not a KubeVirt VM")
    # node-b: 3 free; node-c: 3 less 1 held; node-a: its 2 free are withheld.
    assert ev["resources"] == [
        {
            "resource": "nvidia.com/NVIDIA_A2-4Q",
            "publish": "device-plugin",
            "type_name": "A2-4Q",
            "moving": 1,
            "free": 5,
        }
    ]
    assert ev["withheld"] == [
        {"resource": "nvidia.com/NVIDIA_A2-4Q", "type_name": "NVIDIA A2-4Q", "withheld": 4,
         "nodes": 2}
    ]  # fmt: skip


def test_fleet_plan_says_when_no_node_has_room(tmp_path: Path) -> None:
    """The other node switches too: its A2-4Q are withheld, so no room for the VM."""
    nodes = {"node-a": ("a2-2g", WIN7), "node-e": ("a2-2g", JOB)}
    snapshot = write_fleet(tmp_path / "fleet.jsonl", nodes)
    text = fleet_plan(tmp_path, snapshot, "evacuate", "--max-age", "0")
    assert (
        "  vms/win-7 cannot leave node-a: no room elsewhere: no other node offers a free "
        "A2-4Q after its plan"
    ) in text.splitlines()
    assert "Moves (in-use: evacuate): 0 VMs would move, 2 moves cannot happen;" in text
    assert (
        "  warning: A2-4Q: 1 VM(s) would move but 0 free vGPU(s) of nvidia.com/NVIDIA_A2-4Q "
        "exist after the plans: some wait until more is free"
    ) in text.splitlines()


def test_fleet_plan_markdown_has_the_moves(tmp_path: Path) -> None:
    snapshot = write_fleet(tmp_path / "fleet.jsonl", ROOM)
    text = fleet_plan(tmp_path, snapshot, "evacuate", "--max-age", "0", "-o", "markdown")
    match = re.search(r"^#### Moves.*?(?=^#### |\Z)", text, re.M | re.S)
    assert match is not None, text
    section = match.group(0)
    assert section.startswith(
        "#### Moves (in-use: evacuate): 1 VM would move, 1 move cannot happen; at most 1 at "
        "a time fleet-wide (max-in-flight)."
    )
    assert (
        "| <code>vms/win-7</code> | <code>node-a</code> | <code>0000:41:00.0</code> | A2-4Q | "
        "<code>node-b</code>, <code>node-c</code> |"
    ) in section
    assert "| <code>node-d</code> | <code>0000:41:00.0</code> | A2-4Q | **cannot move**: not a" in (
        section
    )
    assert "**Withheld during the change**" in section
    assert "NVIDIA\\_A2-4Q: 4 on 2 node(s)" in section


def test_fleet_plan_has_moves_under_evacuate_and_none_under_protect(tmp_path: Path) -> None:
    snapshot = write_fleet(tmp_path / "fleet.jsonl", ROOM)
    evacuate = fleet_plan(tmp_path, snapshot, "evacuate", "--max-age", "0")
    assert "Moves (in-use: evacuate)" in evacuate
    text = fleet_plan(tmp_path, snapshot, "protect", "--max-age", "0")
    assert "Moves" not in text and "withheld" not in text.lower()
    doc = json.loads(fleet_plan(tmp_path, snapshot, "protect", "--max-age", "0", "-o", "json"))
    assert "evacuation" not in doc
    markdown = fleet_plan(tmp_path, snapshot, "protect", "--max-age", "0", "-o", "markdown")
    assert "#### Moves" not in markdown


def _node(name: str, moves: int, room: int = 0) -> NodePlan:
    """A node whose plan (evacuate) has ``moves`` VMs in the way and ``room`` free A2-4Q."""
    p = planned("evacuate")
    template = p.gpus[0].deferred_switch
    assert template is not None
    move = template.moves[0]
    ev = NodeEvacuation(
        moves=tuple(
            NodeMove(GPU, p.gpus[0].publish, move.model_copy(update={"vm": f"vms/vm-{i:04d}"}))
            for i in range(moves)
        ),
        room=(("nvidia.com/NVIDIA_A2-4Q", p.gpus[0].publish, room),) if room else (),
    )
    return NodePlan(name, NodeOutcome.CHANGES, plan=p, evacuation=ev)


def test_the_moves_section_is_bounded() -> None:
    """Many moves and many nodes with room: the first MAX_MOVES moves are listed, each with
    the first MAX_TARGETS nodes; the counts still cover every move."""
    parts = []
    for part in range(3):
        summary = EvacuationSummary()
        for i in range(40):
            summary.add(_node(f"src-{part}-{i:02d}", moves=5))
        for i in range(10):
            summary.add(_node(f"room-{part}-{i:02d}", moves=0, room=2))
        parts.append(summary)
    whole = parts[0]
    whole.merge(parts[1])
    whole.merge(parts[2])
    ev = whole.result()
    assert ev.total == ev.possible == 3 * 40 * 5
    assert len(ev.moves) == MAX_MOVES
    assert ev.left_out == 3 * 40 * 5 - MAX_MOVES
    assert [m.node for m in ev.moves] == sorted(m.node for m in ev.moves)
    assert ev.moves[0].node == "src-0-00"
    assert len(ev.moves[0].targets) == MAX_TARGETS
    assert ev.moves[0].more_targets == 30 - MAX_TARGETS
    (resource,) = ev.resources
    assert (resource.moving, resource.free) == (600, 60)
    assert InUsePolicy.EVACUATE.value == "evacuate"


def test_room_after_a_plan_leaves_out_held_and_withheld_vgpus() -> None:
    p = planned("evacuate")
    snapshot, _ = scanned(spec())
    ev = node_evacuation(p, snapshot)
    assert ev.room == ()  # 3 A2-4Q: 1 held, 2 withheld
    assert ev.withheld == (("nvidia.com/NVIDIA_A2-4Q", "NVIDIA A2-4Q", 2),)
    # Without the scan: no room either (every withheld vGPU counts as staying withheld).
    assert node_evacuation(p).room == ()
    assert isinstance(p.capacity[0], Capacity)


# the property ----------------------------------------------------------------------------------
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_and_targets())
def test_evacuate_plans_the_steps_of_protect_and_withholds_only_free_departing_vgpus(
    data: tuple[NodeSnapshot, dict[str, dict[str, int]], dict[str, str], Policy],
) -> None:
    """Over random layouts, holders and targets: the same steps and blocked items as
    ``protect``; moves are the holders in a deferred switch's way; withheld are free
    vGPUs the switch destroys (or keeps, deferred), counted per resource."""
    snapshot, targets, in_use, policy = data
    protect = policy.model_copy(update={"in_use": InUsePolicy.PROTECT})
    evacuate = policy.model_copy(update={"in_use": InUsePolicy.EVACUATE})
    p = plan_of(desired(targets, snapshot, protect), snapshot, in_use, catalog=CATALOG)
    e = plan_of(desired(targets, snapshot, evacuate), snapshot, in_use, catalog=CATALOG)
    assert e.actions == p.actions
    assert [(b.address, b.kind, b.code, b.holder) for b in e.blocked] == [
        (b.address, b.kind, b.code, b.holder) for b in p.blocked
    ]
    assert e.summary == p.summary
    assert [c.model_copy(update={"withheld": 0}) for c in e.capacity] == list(p.capacity)
    assert all(not g.withheld for g in p.gpus)
    for h in e.gpus:
        destroyed = {a.vgpu_key for a in e.gpu_actions(h.address) if a.kind is ActionKind.DESTROY}
        kept = {
            b.address.rsplit("[", 1)[-1].rstrip("]")
            for b in e.gpu_blocked(h.address)
            if b.code is BlockedReason.SWITCH_DEFERRED and b.kind is ActionKind.DESTROY
        }
        assert set(h.withheld) == destroyed | kept
        assert not set(h.withheld) & set(in_use)
        d = h.deferred_switch
        if d is not None:
            event("a switch deferred under evacuate")
            assert [m.vgpu for m in d.moves] == [k for k in d.in_the_way if k in in_use]
            assert all(m.holder == in_use[m.vgpu] for m in d.moves)
    assert sum(c.withheld for c in e.capacity) == sum(len(h.withheld) for h in e.gpus)
