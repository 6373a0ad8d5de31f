"""No silent "matches": what a user sees on a host with no GPU, with a mistyped
``--proc-root``, from an agent started by hand, and in the agent's log when a
reconcile fails."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from vgpu_state.agent.health import HealthState
from vgpu_state.agent.metrics import AgentMetrics
from vgpu_state.agent.queue import Batch, WorkQueue
from vgpu_state.agent.reconciler import NodeReconciler
from vgpu_state.agent.triggers import Trigger
from vgpu_state.agent.worker import PassResult, Worker
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.model.status import ConditionType, ConfigState
from vgpu_state.reconcile import Ports, Settings
from vgpu_state.sim.node import open_sim
from vgpu_state.testing import FakeCluster

REPO = Path(__file__).resolve().parent.parent
MIXED = REPO / "configs" / "examples" / "mixed-node.yaml"
SIM = REPO / "configs" / "sim" / "mixed.yaml"
NOTHING = "version: v1\nvgpu-configs:\n  empty:\n    - devices: all\n      vgpu-devices: {}\n"


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def no_gpus(tmp_path: Path) -> Path:
    """A readable sysfs with a PCI device that is no NVIDIA GPU (an Intel VGA)."""
    root = tmp_path / "sys"
    device = root / "bus" / "pci" / "devices" / "0000:00:02.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x8086\n")
    (device / "class").write_text("0x030000\n")
    return root


def _state(tmp_path: Path) -> list[str]:
    return ["--state-dir", str(tmp_path / "state")]


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_plan_and_apply_on_a_host_without_gpus_fail_naming_the_sysfs_root(
    command: str, no_gpus: Path, tmp_path: Path
) -> None:
    extra = ["--auto-approve", *_state(tmp_path)] if command == "apply" else []
    r = run(command, "-f", str(MIXED), "-c", "mixed", "--sysfs-root", str(no_gpus), *extra)
    assert r.exit_code == 1, r.output
    assert f"error: no NVIDIA GPUs found under {no_gpus}" in r.stderr
    assert 'configuration "mixed" lays out vGPUs' in r.stderr
    assert "matches" not in r.output and "No changes" not in r.output
    # The same as one JSON error document on stdout.
    r = run(command, "-f", str(MIXED), "-c", "mixed", "--sysfs-root", str(no_gpus), *extra,
            "-o", "json")  # fmt: skip
    assert r.exit_code == 1, r.output
    error = json.loads(r.stdout)["error"]
    assert error["reason"] == "NoGpus" and str(no_gpus) in error["message"]


def test_a_layout_of_nothing_still_matches_a_host_without_gpus(
    no_gpus: Path, tmp_path: Path
) -> None:
    config = tmp_path / "empty.yaml"
    config.write_text(NOTHING)
    r = run("plan", "-f", str(config), "-c", "empty", "--sysfs-root", str(no_gpus))
    assert r.exit_code == 0, r.output
    assert 'No changes. The node matches configuration "empty"' in r.stdout


def test_assert_names_the_sysfs_root_too(no_gpus: Path) -> None:
    r = run("assert", "-f", str(MIXED), "-c", "mixed", "--sysfs-root", str(no_gpus))
    assert r.exit_code == 1, r.output
    assert f"Assertion failure: no NVIDIA GPUs found under {no_gpus}" in r.stdout
    r = run("assert", "-f", str(MIXED), "-c", "mixed", "--sysfs-root", str(no_gpus), "-o", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["matches"] is False and doc["config"] == "mixed"
    assert str(no_gpus) in doc["differences"][0]


def test_doctor_on_a_host_without_gpus_points_at_the_host_not_the_config(
    no_gpus: Path,
) -> None:
    r = run("doctor", "-f", str(MIXED), "-c", "mixed", "--sysfs-root", str(no_gpus))
    assert r.exit_code == 1, r.output
    assert "no NVIDIA GPUs found" in r.stdout
    assert "fix the config" not in r.stdout
    assert "the host shows no NVIDIA GPU" in r.stdout


@pytest.mark.parametrize("mode", ["plan-only", "enforce"])
def test_the_agent_on_a_node_without_gpus_reports_it_not_converged(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text("node: n1\ngpus: []\nextra-pci-devices: 2\n")
    catalog = default_catalog()
    sim = open_sim(spec)
    try:
        cluster = FakeCluster("n1", {"nvidia.com/vgpu.config": "mixed"})
        document = load_text(MIXED.read_text(), str(MIXED), catalog=catalog)
        ports = Ports(sim.host, cluster, StaticConfigSource(document))
        reconciler = NodeReconciler(ports, Settings(catalog=catalog), AgentMetrics(), mode)
        worker = Worker(WorkQueue(), reconciler, HealthState())
        with caplog.at_level(logging.INFO, logger="vgpu_state.agent.worker"):
            worker._run_one(Batch((Trigger.RESYNC,), 1))
            worker._cancel_retry()
    finally:
        sim.close()
    status = cluster.last_status
    assert status is not None, "the failure reaches the node's status"
    assert status.state is ConfigState.FAILED
    ready = status.condition(ConditionType.READY)
    assert ready is not None and not ready.status and ready.reason == "NoGpus"
    assert "no NVIDIA GPUs found under /sim/sys" in ready.message
    assert status.condition(ConditionType.SYNCED) is None  # nothing claims "synced"
    (line,) = [r for r in caplog.records if r.message.startswith("reconcile (")]
    assert line.levelno == logging.WARNING and "no NVIDIA GPUs found" in line.message


def test_a_failed_reconcile_logs_a_warning_and_a_waiting_one_does_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes = iter(
        [
            PassResult(True, "failed: a config error, reported", failed=True),
            PassResult(False, "waiting for a rollout slot", retry_in=30.0),
            PassResult(True, "converged"),
        ]
    )
    worker = Worker(WorkQueue(), lambda batch, stop: next(outcomes), HealthState())
    with caplog.at_level(logging.INFO, logger="vgpu_state.agent.worker"):
        for _ in range(3):
            worker._run_one(Batch((Trigger.RESYNC,), 1))
            worker._cancel_retry()
    levels = [r.levelno for r in caplog.records if r.message.startswith("reconcile (")]
    assert levels == [logging.WARNING, logging.INFO, logging.INFO]


PROC_COMMANDS = [
    pytest.param(["plan", "-f", str(MIXED), "-c", "mixed", "--sim", str(SIM)], id="plan"),
    pytest.param(
        ["apply", "-f", str(MIXED), "-c", "mixed", "--sim", str(SIM), "--auto-approve"], id="apply"
    ),
    pytest.param(["assert", "-f", str(MIXED), "-c", "mixed", "--sim", str(SIM)], id="assert"),
    pytest.param(["doctor", "--sim", str(SIM)], id="doctor"),
    pytest.param(["scan", "--sim", str(SIM)], id="scan"),
    pytest.param(
        ["agent", "--node", "n1", "--sim", str(SIM), "--no-device-plugin", "--listen", ""],
        id="agent",
    ),
]


@pytest.mark.parametrize("args", PROC_COMMANDS)
@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_a_proc_root_that_is_no_proc_is_an_error_naming_it(
    args: list[str], kind: str, tmp_path: Path
) -> None:
    proc = tmp_path / ("prc" if kind == "missing" else "empty-proc")
    if kind == "empty":
        proc.mkdir()
        (proc / "self").mkdir()  # a name, but no process directory with a cmdline
    if args[0] == "agent":
        config = str(tmp_path / "config.yaml")
        args = [*args, "--config", config, "--state-dir", str(tmp_path / "state")]
    if args[0] == "apply":
        args = [*args, *_state(tmp_path)]
    spec = tmp_path / "node.yaml"
    spec.write_text(SIM.read_text())
    args = [str(spec) if a == str(SIM) else a for a in args]
    r = run(*args, "--proc-root", str(proc))
    assert r.exit_code == 1, r.output
    assert f"error: {proc}: " in r.stderr
    assert "it must be the host's /proc" in r.stderr
    assert spec.read_text() == SIM.read_text(), "nothing was applied"


def test_a_proc_root_with_processes_is_read(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "cmdline").write_bytes(b"/sbin/init\0")
    r = run("scan", "--sim", str(SIM), "--proc-root", str(proc))
    assert r.exit_code == 0, r.output


def test_the_agent_run_by_hand_plans_only_unless_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    help_text = run("agent", "--help").output
    assert "[default: plan-only]" in " ".join(help_text.split())
    seen: list[str] = []

    class Built:
        def run(self) -> int:
            return 0

    def build(flags: Any) -> Built:
        seen.append(flags.mode)
        return Built()

    monkeypatch.setattr("vgpu_state.agent.assemble.build", build)
    for extra in ([], ["--mode", "enforce"]):
        r = run("agent", "--node", "n1", "--config", str(tmp_path / "config.yaml"), *extra)
        assert r.exit_code == 0, r.output
    assert seen == ["plan-only", "enforce"]


def test_a_plan_only_agent_changes_nothing_on_its_node(tmp_path: Path) -> None:
    """The default mode, as the reconciler gets it: a plan with changes, no write."""
    catalog = default_catalog()
    spec = tmp_path / "node.yaml"
    spec.write_text(SIM.read_text())
    sim = open_sim(spec)
    try:
        cluster = FakeCluster(sim.cluster.node_name(), {"nvidia.com/vgpu.config": "mixed"})
        document = load_text(MIXED.read_text(), str(MIXED), catalog=catalog)
        ports = Ports(sim.host, cluster, StaticConfigSource(document))
        reconciler = NodeReconciler(ports, Settings(catalog=catalog), AgentMetrics())
        before = sim.host.scan()
        outcome = reconciler(Batch((Trigger.RESYNC,), 1), threading.Event())
        assert sim.host.scan().fingerprint() == before.fingerprint()
    finally:
        sim.close()
    assert "planned, not applied (plan-only)" in outcome.summary


def test_plan_json_with_out_writes_the_file_only(tmp_path: Path) -> None:
    saved = tmp_path / "plan.json"
    r = run("plan", "-f", str(MIXED), "--sim", str(SIM), "-c", "mixed", "-o", "json",
            "--out", str(saved))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and str(saved) in r.stderr
    assert json.loads(saved.read_text())["plan"]["selection"]["config"] == "mixed"


def test_fleet_plan_lists_a_node_without_gpus_as_an_error() -> None:
    import datetime

    from vgpu_state.model.fleet import ReportedNode
    from vgpu_state.model.snapshot import NodeSnapshot
    from vgpu_state.reconcile.fleet import NodeOutcome, plan_node

    catalog = default_catalog()
    document = load_text(MIXED.read_text(), str(MIXED), catalog=catalog)
    now = datetime.datetime(2026, 11, 28, tzinfo=datetime.UTC)
    node = ReportedNode(
        "n1",
        {"nvidia.com/vgpu.config": "mixed"},
        NodeSnapshot(node="n1", sysfs_root="/sys"),
        scanned_at=now,
    )
    planned = plan_node(document, node, Settings(catalog=catalog), now)
    assert planned.outcome is NodeOutcome.ERROR and planned.reason == "NoGpus"
    assert "no NVIDIA GPUs found under /sys on node n1" in (planned.message or "")
