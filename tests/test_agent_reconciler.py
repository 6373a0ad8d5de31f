"""The agent's reconcile of one node: enforce, plan-only, config errors, rollout gate, stop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vgpu_state.agent.metrics import AgentMetrics
from vgpu_state.agent.queue import Batch
from vgpu_state.agent.reconciler import MODE_LABEL, SLOT_POLL, AgentMode, NodeReconciler
from vgpu_state.agent.rollout import disruptive
from vgpu_state.agent.triggers import Trigger
from vgpu_state.catalog import default_catalog
from vgpu_state.config import FileConfigSource, load_text
from vgpu_state.config.document import ConfigDocument
from vgpu_state.model.errors import ConfigError
from vgpu_state.model.plan import Plan
from vgpu_state.model.status import ConditionType, ConfigState
from vgpu_state.reconcile import Ports, Settings
from vgpu_state.sim.node import open_sim
from vgpu_state.testing import FakeCluster, RecordingDevicePlugin, RecordingHost

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
A2_SPEC = REPO / "configs" / "sim" / "a2-host.yaml"
HELD = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"  # A2-4C, held by vm default/win-1

CONFIG = """\
version: v1
vgpu-configs:
  grow:            # keeps all three, adds one A2-4Q: creates only
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 2, A2-4A: 1}
  swap:            # the A2-4A goes, two A2-4Q come: destroys
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 3}
"""
BATCH = Batch((Trigger.RESYNC,), 1)


class Gate:
    def __init__(self, admit: bool) -> None:
        self.admit_answer = admit
        self.asked: list[bool] = []
        self.finished_with: list[bool] = []

    def admit(self, plan: Plan) -> bool:
        self.asked.append(disruptive(plan))
        return self.admit_answer or not disruptive(plan)

    def finished(self, converged: bool) -> None:
        self.finished_with.append(converged)


class Node:
    def __init__(self, tmp: Path, label: str, config: str = CONFIG, spec: Path = A2_SPEC) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.config_path = tmp / "config.yaml"
        self.config_path.write_text(config)
        self.sim = open_sim(spec)
        self.host = RecordingHost(self.sim.host)
        self.cluster = FakeCluster(
            "a2-node", {"nvidia.com/vgpu.config": label}, {HELD: "vm default/win-1"}
        )
        self.plugin = RecordingDevicePlugin()
        self.source = FileConfigSource(self.config_path, catalog=CATALOG)
        self.ports = Ports(self.host, self.cluster, self.source, self.plugin)
        self.metrics = AgentMetrics()

    def reconciler(self, mode: str = AgentMode.ENFORCE, gate: Gate | None = None) -> NodeReconciler:
        settings = Settings(catalog=default_catalog())
        return NodeReconciler(self.ports, settings, self.metrics, mode, gate, clock=lambda: 1e9)

    def layout(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for gpu in self.sim.host.scan().gpus:
            for v in gpu.vgpus:
                counts[str(v.type_name)] = counts.get(str(v.type_name), 0) + 1
        return counts


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path, "grow")
    yield n
    n.sim.close()


def metric(node: Node, text: str) -> bool:
    return text in node.metrics.render().decode()


def test_enforce_applies_reports_and_refreshes_the_device_plugin(node: Node) -> None:
    outcome = node.reconciler()(BATCH, threading.Event())
    assert outcome.ok and "converged" in outcome.summary
    assert node.layout() == {"A2-4C": 1, "A2-4Q": 2, "A2-4A": 1}
    status = node.cluster.last_status
    assert status is not None and status.state is ConfigState.SUCCESS
    assert node.plugin.snapshots, "the device plugin learned the new vGPUs"
    assert sum(len(g.vgpus) for g in node.plugin.snapshots[-1].gpus) == 4
    assert metric(node, 'vgpu_state_vgpus{state="in_use",type="NVIDIA A2-4C"} 1.0') or metric(
        node, 'vgpu_state_vgpus{state="in_use",type="A2-4C"} 1.0'
    )
    assert metric(node, 'vgpu_state_actions_total{kind="create",result="ok"} 1.0')
    assert metric(node, "vgpu_state_last_successful_reconcile_timestamp_seconds 1e+09")
    assert metric(node, "vgpu_state_config_generation 1.0")
    # Nothing left to do: a second reconcile changes nothing.
    before = list(node.host.changes)
    assert node.reconciler()(BATCH, threading.Event()).ok
    assert node.host.changes == before


def test_plan_only_changes_nothing_and_reports_the_plan(node: Node) -> None:
    outcome = node.reconciler(AgentMode.PLAN_ONLY)(BATCH, threading.Event())
    assert outcome.ok and "1 change(s) planned, not applied (plan-only)" in outcome.summary
    assert node.host.changes == []
    status = node.cluster.last_status
    assert status is not None and status.state is ConfigState.PENDING
    assert node.plugin.snapshots, "the device plugin still advertises what exists"


def test_the_node_mode_label_promotes_or_holds_one_node(node: Node) -> None:
    """``--mode plan-only`` (the shipped install) and ``vgpu-state.io/mode=enforce`` on the
    node: that node applies; removing the label makes it plan-only again."""
    reconcile = node.reconciler(AgentMode.PLAN_ONLY)
    node.cluster.set_label(MODE_LABEL, "enforce")
    outcome = reconcile(BATCH, threading.Event())
    assert outcome.ok and "converged" in outcome.summary
    assert node.layout() == {"A2-4C": 1, "A2-4Q": 2, "A2-4A": 1}
    assert metric(node, 'vgpu_state_reconcile_duration_seconds_count{mode="enforce"')
    made = len(node.host.changes)
    # Back to plan-only: the next change is planned, not applied.
    node.cluster.set_label(MODE_LABEL, None)
    node.cluster.set_label("nvidia.com/vgpu.config", "swap")
    outcome = reconcile(BATCH, threading.Event())
    assert "planned, not applied (plan-only)" in outcome.summary
    assert node.layout() == {"A2-4C": 1, "A2-4Q": 2, "A2-4A": 1}
    # An enforce agent is held in plan-only on a labelled node; a label value it does not
    # know leaves --mode in force.
    held = node.reconciler(AgentMode.ENFORCE)
    node.cluster.set_label(MODE_LABEL, "plan-only")
    assert "plan-only" in held(BATCH, threading.Event()).summary
    node.cluster.set_label(MODE_LABEL, "enforced")
    assert "plan-only" in reconcile(BATCH, threading.Event()).summary
    assert len(node.host.changes) == made  # nothing written since the label went


@pytest.mark.parametrize("mode", AgentMode.ALL)
def test_a_node_nothing_selects_is_left_alone_and_reports_its_scan(node: Node, mode: str) -> None:
    node.cluster.set_label("nvidia.com/vgpu.config", None)
    outcome = node.reconciler(mode)(BATCH, threading.Event())
    assert outcome.ok and outcome.summary.startswith("left alone: no config selected")
    assert node.host.changes == []
    status = node.cluster.last_status
    assert status is not None and (status.config, status.state) == (None, None)
    ready = status.condition(ConditionType.READY)
    assert ready is not None and (ready.status, ready.reason) == (True, "NoConfigSelected")
    assert node.plugin.snapshots, "the vGPUs that exist are still advertised"
    assert node.cluster.events == []


def test_an_invalid_config_is_degraded_with_its_location_and_nothing_is_written(
    node: Node,
) -> None:
    assert node.reconciler()(BATCH, threading.Event()).ok  # a good document first
    node.cluster.set_label("nvidia.com/vgpu.config", "swap")  # would destroy and create
    node.config_path.write_text(CONFIG.replace("A2-4Q: 3", "A2-4Q: three"))
    writes = list(node.host.changes)
    outcome = node.reconciler()(BATCH, threading.Event())
    assert outcome.ok and outcome.summary.startswith("degraded: config invalid:")
    assert node.host.changes == writes, "no host write with an invalid config"
    status = node.cluster.last_status
    assert status is not None and status.state is ConfigState.FAILED
    degraded = status.condition(ConditionType.DEGRADED)
    assert degraded is not None and degraded.status and degraded.reason == "ConfigInvalid"
    assert f"{node.config_path}:8:39:" in degraded.message and "three" in degraded.message
    assert node.cluster.events[-1].reason == "ConfigInvalid"


def test_a_config_that_never_loaded_is_degraded_too(tmp_path: Path) -> None:
    n = Node(tmp_path, "grow", config="version: v1\nvgpu-configs: {grow: [{devices: al}]}\n")
    try:
        outcome = n.reconciler()(BATCH, threading.Event())
        assert outcome.ok and "degraded" in outcome.summary
        assert n.host.changes == []
    finally:
        n.sim.close()


def test_a_disruptive_plan_waits_for_a_rollout_slot(node: Node) -> None:
    node.cluster.set_label("nvidia.com/vgpu.config", "swap")
    refused = Gate(admit=False)
    outcome = node.reconciler(gate=refused)(BATCH, threading.Event())
    assert not outcome.ok and "waiting for a rollout slot" in outcome.summary
    # Asked again within seconds (jittered), not after the failures' growing backoff.
    assert outcome.retry_in is not None and SLOT_POLL / 2 <= outcome.retry_in <= SLOT_POLL
    assert refused.asked == [True]
    assert node.host.changes == []
    granted = Gate(admit=True)
    assert node.reconciler(gate=granted)(BATCH, threading.Event()).ok
    assert node.layout() == {"A2-4C": 1, "A2-4Q": 3}
    assert granted.finished_with == [True], "the slot goes back once the node matches"


def test_a_plan_that_only_creates_needs_no_slot(node: Node) -> None:
    refused = Gate(admit=False)
    assert node.reconciler(gate=refused)(BATCH, threading.Event()).ok
    assert refused.asked == [False]
    assert node.layout() == {"A2-4C": 1, "A2-4Q": 2, "A2-4A": 1}


def test_a_stop_request_ends_the_apply_after_the_current_step(node: Node) -> None:
    node.cluster.set_label("nvidia.com/vgpu.config", "swap")  # three steps
    stopping = threading.Event()
    stopping.set()
    outcome = node.reconciler()(BATCH, stopping)
    assert outcome.ok and outcome.summary.startswith("stopped after")
    assert len(node.host.changes) == 1
    # The next start finishes the job.
    assert node.reconciler()(BATCH, threading.Event()).ok
    assert node.layout() == {"A2-4C": 1, "A2-4Q": 3}


CONFIGS = "vgpu-configs: {a: [{devices: all, vgpu-devices: {A2-4Q: 1}}]}\n"


def test_max_unavailable_is_a_policy_key() -> None:
    doc = load_text("version: v1\npolicy: {max-unavailable: 3}\n" + CONFIGS, catalog=CATALOG)
    assert doc.policy_for("a").max_unavailable == 3
    plain = load_text("version: v1\n" + CONFIGS, catalog=CATALOG)
    assert plain.policy_for("a").max_unavailable == 1
    for bad in ("0", "two", "1.5"):
        with pytest.raises(ConfigError) as err:
            load_text(
                f"version: v1\npolicy: {{max-unavailable: {bad}}}\n" + CONFIGS, catalog=CATALOG
            )
        assert str(err.value).startswith("<config>:2:27: max-unavailable must be a whole number")


class _EditedAfterEachRead:
    """The mounted ConfigMap changes right after every read of it (a ConfigMap update
    racing the reconcile); counts the reads."""

    def __init__(self, inner: FileConfigSource, edited: str) -> None:
        self.inner = inner
        self.edited = edited
        self.reads = 0

    @property
    def error(self) -> ConfigError | None:
        return self.inner.error

    def document(self) -> ConfigDocument:
        document = self.inner.document()
        self.reads += 1
        self.inner.path.write_text(self.edited)
        return document


def test_one_reconcile_reads_the_config_once_and_applies_what_it_checked(node: Node) -> None:
    # The edit would keep the node as it is; the document read (and checked) grows it.
    source = _EditedAfterEachRead(node.source, CONFIG.replace("A2-4Q: 2", "A2-4Q: 1"))
    node.ports = Ports(node.host, node.cluster, source, node.plugin)
    outcome = node.reconciler()(BATCH, threading.Event())
    assert outcome.ok, outcome.summary
    assert source.reads == 1
    assert node.layout() == {"A2-4C": 1, "A2-4Q": 2, "A2-4A": 1}


def series(node: Node, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one metric as the /metrics page shows them: labels -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(node.metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_the_node_state_and_a_deferred_switch_are_exported_with_their_since_time(
    tmp_path: Path,
) -> None:
    """What the alerts read: the state label the node got (with the agent's mode), and
    since when a GPU's layout switch has waited for its holder; the since-time stays
    while the switch waits and the series goes once the switch runs."""
    # The cluster says who holds the A2-4C; the simulated driver holds nothing itself,
    # so once the holder goes the vGPU can be destroyed.
    spec = tmp_path / "a2.yaml"
    spec.write_text(A2_SPEC.read_text().replace(', in-use: "vm default/win-1"', ""))
    eight = CONFIG + "  eight:\n    - devices: all\n      vgpu-devices: {A2-8Q: 2}\n"
    node = Node(tmp_path / "node", "grow", eight, spec)
    try:
        now = [1e9]
        settings = Settings(catalog=default_catalog())
        reconcile = NodeReconciler(
            node.ports, settings, node.metrics, AgentMode.ENFORCE, clock=lambda: now[0]
        )
        assert reconcile(BATCH, threading.Event()).ok
        state = "vgpu_state_node_state"
        assert series(node, state) == {(("mode", "enforce"), ("state", "success")): 1.0}
        since = "vgpu_state_layout_switch_deferred_since_timestamp_seconds"
        assert series(node, since) == {}

        node.cluster.set_label("nvidia.com/vgpu.config", "eight")  # the held A2-4C is in the way
        reconcile(BATCH, threading.Event())
        assert node.layout() == {"A2-4C": 1, "A2-4Q": 2, "A2-4A": 1}, "the switch waits"
        assert series(node, state) == {(("mode", "enforce"), ("state", "pending")): 1.0}
        gpu = str(node.sim.host.scan().gpus[0].address)
        assert series(node, since) == {(("gpu", gpu),): 1e9}
        now[0] = 1e9 + 600
        reconcile(BATCH, threading.Event())
        assert series(node, since) == {(("gpu", gpu),): 1e9}, "still waiting since the first time"
        # The same plan in plan-only mode waits for nobody: no switch is deferred there.
        node.cluster.set_label(MODE_LABEL, "plan-only")
        reconcile(BATCH, threading.Event())
        assert series(node, since) == {}
        assert series(node, state) == {(("mode", "plan-only"), ("state", "pending")): 1.0}
        node.cluster.set_label(MODE_LABEL, None)
        now[0] = 1e9 + 900
        reconcile(BATCH, threading.Event())
        assert series(node, since) == {(("gpu", gpu),): 1e9 + 900}, "waiting again, since now"
        node.cluster.release(HELD)
        assert reconcile(BATCH, threading.Event()).ok
        assert node.layout() == {"A2-8Q": 2}
        assert series(node, since) == {}, "a switch that ran is no longer deferred"
        assert series(node, state) == {(("mode", "enforce"), ("state", "success")): 1.0}
    finally:
        node.sim.close()


def test_the_node_state_series_says_plan_only_failed_and_left_alone(node: Node) -> None:
    state = "vgpu_state_node_state"
    node.reconciler(AgentMode.PLAN_ONLY)(BATCH, threading.Event())
    assert series(node, state) == {(("mode", "plan-only"), ("state", "pending")): 1.0}
    node.config_path.write_text(CONFIG.replace("A2-4Q: 3", "A2-4Q: three"))
    node.reconciler()(BATCH, threading.Event())
    assert series(node, state) == {(("mode", "enforce"), ("state", "failed")): 1.0}
    node.config_path.write_text(CONFIG)
    node.cluster.set_label("nvidia.com/vgpu.config", None)
    node.reconciler()(BATCH, threading.Event())
    assert series(node, state) == {}, "a node nothing selects has no state"
