"""Never destroy what buys nothing: a layout switch a holder blocks is deferred.

Time-sliced vGPUs on one GPU share one framebuffer size, so while a VM holds
an A2-4Q no A2-2Q can be created on that GPU. Destroying its free A2-4Q then
would only lower capacity: the plan keeps them, says the switch is deferred
and names the holder it waits for; the switch runs once the holder goes.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests import test_holders_fuse as holders_fuse
from tests.builders import V, build_gpu, build_snapshot, desired
from tests.test_planner_properties import layout as one_size_layout
from vgpu_state.agent.run import Agent, AgentParts
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.config import FileConfigSource
from vgpu_state.host import scan
from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.plan import ActionKind, Capacity
from vgpu_state.model.policy import InUsePolicy, Policy
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, Vgpu
from vgpu_state.planner import plan
from vgpu_state.reconcile import Ports, Settings
from vgpu_state.render import render_text
from vgpu_state.sim.fuse import mounted
from vgpu_state.sim.node import open_sim
from vgpu_state.sim.tree import VFIO_NODES
from vgpu_state.testing import FakeCluster, RecordingDevicePlugin

CATALOG = default_catalog()
REPO = Path(__file__).resolve().parent.parent

HELD = "5a294872-1856-55f3-a091-09cf44c0103b"
A2_THREE_4Q = f"""\
node: a2-node
gpus:
  - address: "0000:08:00.0"
    model: A2
    vgpus:
      - {{type: A2-4Q, vf: 0, uuid: {HELD}HELD}}
      - {{type: A2-4Q, vf: 1, uuid: 9a51921b-dbd6-5049-9bad-1a01f4ed1d83}}
      - {{type: A2-4Q, vf: 2, uuid: e0992c7c-da2c-5ca7-97ba-93aa3ab85483}}
"""


def a2_spec(holder: str | None) -> str:
    """Three A2-4Q on one A2; the first held by ``holder`` (if any)."""
    return A2_THREE_4Q.replace("HELD}", f', in-use: "{holder}"}}' if holder else "}")


HOLDER = "vm default/win-1"
A2_CONFIG = """\
version: v1
vgpu-configs:
  a2-4g:
    - devices: all
      vgpu-devices: {A2-4Q: 3}
  a2-2g:
    - devices: all
      vgpu-devices: {A2-2Q: 8}
"""
L40S_CONFIG = """\
version: v1
vgpu-configs:
  l40s-8q:
    - devices: all
      vgpu-devices: {L40S-8Q: 6}
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout, result.stderr


def types(where: str | NodeSnapshot) -> dict[str, dict[str, int]]:
    """vGPU types per GPU of a sysfs root (scanned now) or of a snapshot."""
    snap = scan(where, catalog=CATALOG) if isinstance(where, str) else where
    out: dict[str, dict[str, int]] = {}
    for g in snap.gpus:
        counts = out.setdefault(g.address, {})
        for v in g.vgpus:
            counts[str(v.type_name)] = counts.get(str(v.type_name), 0) + 1
    return out


def test_the_a2_switch_with_a_held_vgpu_destroys_nothing_and_names_its_holder(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(a2_spec(HOLDER))
    config = tmp_path / "c.yaml"
    config.write_text(A2_CONFIG)
    args = ["plan", "-f", str(config), "-c", "a2-2g", "--sim", str(spec)]
    code, text, err = run(*args)
    assert code == 0, err
    lines = text.splitlines()
    assert "will be destroyed" not in text and "will be created" not in text
    assert (
        "  # switch deferred: waits for vm default/win-1; 2 free vGPUs kept; 8 to create then"
        in lines
    )
    assert f"  ! gpu[0000:08:00.0].vgpu[{HELD}] A2-4Q cannot be destroyed" in lines
    kept = [line for line in lines if line.endswith("A2-4Q kept (destroy deferred)")]
    assert len(kept) == 2
    assert "      switch deferred until vm default/win-1 releases " in text
    cap = lines.index("Capacity (vGPUs per resource, now → after this plan):")
    assert lines[cap + 1 : cap + 3] == [
        "  nvidia.com/NVIDIA_A2-2Q  0 → 0  [8 more wanted, not created: switch deferred, "
        "waits for vm default/win-1]",
        "  nvidia.com/NVIDIA_A2-4Q  3 → 3  [1 held]",
    ]
    assert lines[-1] == "Plan: 0 to create, 0 to destroy, 11 blocked (1 GPU waiting to switch)."

    code, out, err = run(*args, "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format_version"] == "1.6"
    assert doc["actions"] == []
    (gpu,) = doc["gpus"]
    assert gpu["deferred_switch"] == {
        "waits_for": [HOLDER], "in_the_way": [HELD], "kept": 2, "creates": 8
    }  # fmt: skip
    codes = [(b["kind"], b["code"], b["holder"]) for b in doc["blocked"]]
    assert codes == [
        ("destroy", "InUse", HOLDER),
        ("destroy", "SwitchDeferred", None),
        ("destroy", "SwitchDeferred", None),
        *[("create", "SwitchDeferred", HOLDER)] * 8,
    ]
    assert doc["summary"]["switches_deferred"] == 1
    assert doc["disruption"]["level"] == "none"

    # The holder gone: the same switch runs in full.
    spec.write_text(a2_spec(None))
    code, text, err = run(*args)
    assert code == 0, err
    assert text.splitlines()[-1] == "Plan: 8 to create, 3 to destroy, 0 blocked."
    assert "switch deferred" not in text


def test_skip_blocked_on_an_l40s_keeps_the_held_gpu_and_switches_the_free_one(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "l40s.yaml"
    spec.write_text((REPO / "configs" / "sim" / "l40s-pair.yaml").read_text())
    config = tmp_path / "c.yaml"
    config.write_text(L40S_CONFIG)
    before = types(open_sim(spec).host.scan())
    assert before["0000:26:00.0"] == {"L40S-4Q": 2}
    code, out, err = run(
        "apply", "-f", str(config), "-c", "l40s-8q", "--sim", str(spec),
        "--skip-blocked", "--auto-approve",
    )  # fmt: skip
    assert code == 1, out + err  # blocked items are left: the node does not match yet
    assert "will be destroyed" not in out
    assert "# switch deferred: waits for vm default/render-1; 1 free vGPU kept" in out
    after = types(open_sim(spec).host.scan())
    assert after["0000:26:00.0"] == {"L40S-4Q": 2}, "the held GPU keeps both vGPUs"
    assert after["0000:a1:00.0"] == {"L40S-8Q": 6}


def test_a_prune_the_layout_asks_for_still_destroys(tmp_path: Path) -> None:
    """Fewer vGPUs wanted, no create: the destroys are what the layout says."""
    spec = tmp_path / "node.yaml"
    spec.write_text(a2_spec(HOLDER))
    config = tmp_path / "c.yaml"
    config.write_text(A2_CONFIG.replace("{A2-4Q: 3}", "{A2-4Q: 1}"))
    code, text, err = run("plan", "-f", str(config), "-c", "a2-4g", "--sim", str(spec))
    assert code == 0, err
    assert text.splitlines()[-1] == "Plan: 0 to create, 2 to destroy, 0 blocked."
    assert "switch deferred" not in text


def test_a_vgpu_of_unknown_type_in_the_way_defers_the_switch_too() -> None:
    g = build_gpu("0000:3b:00.0", "T4", vgpus=[V("T4-8C")])
    unknown = "11111111-2222-4333-8444-555555555555"
    g = g.model_copy(
        update={"vgpus": (*g.vgpus, Vgpu(kind="mdev", parent=g.address, uuid=unknown))}
    )
    snap = build_snapshot(g)
    p = plan(desired({g.address: {"T4-4Q": 4}}, snap), snap, catalog=CATALOG)
    assert p.actions == ()
    (header,) = p.gpus
    assert header.deferred_switch is not None
    assert header.deferred_switch.waits_for == ()
    assert header.deferred_switch.in_the_way == (unknown,)
    assert header.deferred_switch.kept == 1
    text = render_text(p)
    assert "  # switch deferred: waits while 1 vGPU stays in the way; 1 free vGPU kept" in text
    assert f"switch deferred while {unknown} (type unknown) stay(s) on the GPU" in text


def cli_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", *args], capture_output=True, text=True
    )


@pytest.mark.usefixtures("require_fuse")
def test_apply_on_a_fuse_simulated_a2_waits_for_the_holder_then_switches(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(a2_spec(None))
    config = tmp_path / "c.yaml"
    config.write_text(A2_CONFIG)
    with mounted(spec, tmp_path / "mnt") as m:
        root = str(m.root)
        common = [
            "-f", str(config), "-c", "a2-2g", "--sysfs-root", root, "--node", "a2-node",
            "--state-dir", str(tmp_path / "state"),
        ]  # fmt: skip
        held = cli_process(
            "apply", *common, "--in-use", f"{HELD}={HOLDER}", "--skip-blocked", "--auto-approve"
        )
        assert "will be destroyed" not in held.stdout, held.stdout
        assert "switch deferred: waits for vm default/win-1" in held.stdout
        assert types(root) == {"0000:08:00.0": {"A2-4Q": 3}}, "nothing destroyed on the GPU"

        gone = cli_process("apply", *common, "--auto-approve")
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert types(root) == {"0000:08:00.0": {"A2-2Q": 8}}


@pytest.mark.usefixtures("require_fuse")
def test_apply_skip_blocked_with_a_process_holding_a_vgpu_keeps_the_gpu(tmp_path: Path) -> None:
    """The holder is a QEMU-like process with the vGPU's VFIO node open (``/proc``)."""
    (tmp_path / "node.yaml").write_text(holders_fuse.SPEC)
    config = tmp_path / "layout.yaml"
    config.write_text(holders_fuse.LAYOUT)
    with mounted(tmp_path / "node.yaml", tmp_path / "mnt") as m:
        common = [
            "-f", str(config), "-c", "a2-2q", "--sysfs-root", str(m.root), "--node", "a2-node",
            "--state-dir", str(tmp_path / "state"),
        ]  # fmt: skip
        node = m.root / VFIO_NODES / holders_fuse._group(m.root, holders_fuse.HELD)
        with holders_fuse.qemu_holding(node) as qemu:
            done = cli_process("apply", *common, "--skip-blocked", "--auto-approve")
            holder = f"VM win-7 (process {qemu.pid}, qemu-system-x86_64)"
            assert f"# switch deferred: waits for {holder}; 2 free vGPUs kept" in done.stdout, (
                done.stdout + done.stderr
            )
            assert "will be destroyed" not in done.stdout
            assert types(str(m.root)) == {"0000:08:00.0": {"A2-4Q": 3}}
        # The process is gone: the switch runs in full.
        done = cli_process("apply", *common, "--auto-approve")
        assert done.returncode == 0, done.stdout + done.stderr
        assert types(str(m.root)) == {"0000:08:00.0": {"A2-2Q": 8}}


# The agent ---------------------------------------------------------------------------


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_agent_runs_a_deferred_switch_when_the_holder_goes_not_on_the_resync(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(a2_spec(None))
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "config.yaml").write_text(A2_CONFIG)
    sim = open_sim(spec)
    cluster = FakeCluster("a2-node", {"nvidia.com/vgpu.config": "a2-2g"}, {HELD: HOLDER})
    ports = Ports(
        sim.host,
        cluster,
        FileConfigSource(config_dir / "config.yaml", catalog=CATALOG),
        RecordingDevicePlugin(),
    )
    parts = AgentParts(
        ports=ports,
        settings=Settings(catalog=CATALOG),
        config_dir=config_dir,
        mode="enforce",
        resync_seconds=3600,  # never within this test
        holder_poll_seconds=0.1,
        listen=None,
    )
    agent = Agent(parts, settle=0.01)
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for("the first reconcile", lambda: agent.reconciler.last_report is not None)
        report = agent.reconciler.last_report
        assert report is not None and report.plan.summary.switches_deferred == 1
        assert types(sim.host.scan()) == {"0000:08:00.0": {"A2-4Q": 3}}
        time.sleep(0.5)  # several polls with the same holders: no reconcile asked for
        assert 'vgpu_state_triggers_total{source="holders"} 0.0' in agent.metrics.render().decode()

        cluster.release(HELD)
        wait_for("the switch", lambda: types(sim.host.scan()) == {"0000:08:00.0": {"A2-2Q": 8}})
        wait_for(
            "the metric",
            lambda: (
                'vgpu_state_triggers_total{source="holders"} 1.0' in agent.metrics.render().decode()
            ),
        )
        status = cluster.last_status
        assert status is not None and status.state.value == "success"
    finally:
        agent.stop()
        thread.join(10)
        sim.close()
    assert not thread.is_alive()


# The property ------------------------------------------------------------------------

MODELS = {  # model -> (PCI addresses of two such GPUs, layout)
    "A2": (("0000:08:00.0", "0000:09:00.0"), "mdev"),
    "T4": (("0000:3b:00.0", "0000:3c:00.0"), "mdev"),
    "L40S": (("0000:26:00.0", "0000:27:00.0"), "vendor-vfio"),
}


@functools.cache
def cached_gpu(address: str, model: str, vgpus: tuple[V, ...]) -> Gpu:
    """Snapshots are frozen values: build each GPU once (building is most of an example)."""
    return build_gpu(address=address, model=model, layout=MODELS[model][1], vgpus=vgpus)


@st.composite
def node_and_targets(
    draw: st.DrawFn,
) -> tuple[NodeSnapshot, dict[str, dict[str, int]], dict[str, str], Policy]:
    """Up to three GPUs (two may share a model, so they share resources), each with a
    random feasible layout; random holders; a random target per GPU (or none)."""
    slots = [(m, a) for m, (addresses, _) in sorted(MODELS.items()) for a in addresses]
    chosen = draw(st.lists(st.sampled_from(slots), min_size=1, max_size=3, unique=True))
    gpus = []
    targets: dict[str, dict[str, int]] = {}
    for model, address in chosen:
        existing = draw(one_size_layout(model))
        sriov = model != "T4"
        names = [n for n, c in sorted(existing.items()) for _ in range(c)]
        vgpus = tuple(V(n, i if sriov else None) for i, n in enumerate(names))
        gpus.append(cached_gpu(address, model, vgpus))
        if draw(st.integers(0, 4)):
            targets[address] = draw(one_size_layout(model))
    snapshot = build_snapshot(*gpus)
    keys = [v.key for g in snapshot.gpus for v in g.vgpus]
    held = draw(st.lists(st.sampled_from(keys), unique=True) if keys else st.just([]))
    in_use = {k: f"vm default/vm-{i % 2}" for i, k in enumerate(held)}
    policy = Policy(
        prune=draw(st.booleans()),
        in_use=draw(st.sampled_from([InUsePolicy.PROTECT] * 2 + [InUsePolicy.IGNORE])),
    )
    return snapshot, targets, in_use, policy


def short(c: Capacity) -> str:
    return c.type_name.split()[-1]


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_and_targets())
def test_no_plan_lowers_capacity_unless_it_raises_the_targets(
    data: tuple[NodeSnapshot, dict[str, dict[str, int]], dict[str, str], Policy],
) -> None:
    snapshot, targets, in_use, policy = data
    p = plan(desired(targets, snapshot, policy), snapshot, in_use, catalog=CATALOG)
    wanted = {name for counts in targets.values() for name, n in counts.items() if n}

    def prune_only(address: str) -> bool:
        """The layout wants no vGPU the GPU lacks: its destroys are what it asks for."""
        g = snapshot.gpu(address)
        assert g is not None
        have = {n: sum(v.type_name == n for v in g.vgpus) for n in targets.get(address, {})}
        return all(c <= have[n] for n, c in targets.get(address, {}).items())

    destroyed_on = {a.gpu for a in p.actions if a.kind is ActionKind.DESTROY}
    created_on = {a.gpu for a in p.actions if a.kind is ActionKind.CREATE}
    # Per GPU: a destroy makes room for a create of the same plan, or is a prune.
    for address in destroyed_on:
        assert address in created_on or prune_only(address), (address, p.actions, p.blocked)
    # Per resource, as the plan's capacity section shows it (a prune the layout asks
    # for may lower one anywhere; the line above covers plans that hold one).
    # Two GPUs that swap types lower one resource's total and leave the other's as
    # it was, yet each creates its target: what counts is a create of a wanted type.
    lowered = [c for c in p.capacity if c.after < c.before]
    raised = [c for c in p.capacity if c.after > c.before and short(c) in wanted]
    created = {
        a.type_name.split()[-1]
        for a in p.actions
        if a.kind is ActionKind.CREATE and a.type_name is not None
    }
    if lowered and not any(prune_only(a) for a in destroyed_on):
        event("capacity lowered to raise a target's")
        assert raised or created & wanted, (lowered, p.actions)
    # A GPU whose switch is deferred changes nothing and names only real holders.
    for h in p.gpus:
        if h.deferred_switch is not None:
            event("a switch deferred" + (" with free vGPUs kept" if h.deferred_switch.kept else ""))
            assert not p.gpu_actions(h.address)
            assert set(h.deferred_switch.waits_for) <= set(in_use.values())
            assert h.deferred_switch.kept == sum(
                b.code is BlockedReason.SWITCH_DEFERRED and b.kind is ActionKind.DESTROY
                for b in p.gpu_blocked(h.address)
            )
