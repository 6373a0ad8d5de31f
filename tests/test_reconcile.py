"""``reconcile_once`` over the ports: the one path from inputs to a plan, an apply and a report.

The host is the simulator (in memory) wrapped in a ``RecordingHost``; the
cluster is a ``FakeCluster``; the device plugin records what it is given.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.config import FileConfigSource, StaticConfigSource, load_text
from vgpu_state.executor import ApplyError
from vgpu_state.model.errors import (
    BlockedReason,
    ErrorKind,
    Reason,
    SelectionError,
)
from vgpu_state.model.plan import Plan
from vgpu_state.model.status import ConditionType, ConfigState
from vgpu_state.reconcile import (
    Mode,
    NoConfigSelectedError,
    Ports,
    Settings,
    reconcile_once,
)
from vgpu_state.sim.node import open_sim
from vgpu_state.sim.spec import parse_spec
from vgpu_state.testing import FakeCluster, RecordingDevicePlugin, RecordingHost

CATALOG = default_catalog()

SPEC = """\
node: n1
labels: {nvidia.com/vgpu.config: small}
gpus:
  - address: "0000:3b:00.0"
    model: T4
    layout: mdev
    vgpus:
      - {type: T4-4Q, uuid: 11111111-1111-4111-8111-111111111111}
      - {type: T4-4Q, uuid: 22222222-2222-4222-8222-222222222222}
"""
CONFIG = """\
version: v1
policy: {prune: true}
vgpu-configs:
  small:
    - devices: all
      vgpu-devices: {T4-2Q: 8}
  keep:
    - devices: all
      vgpu-devices: {T4-4Q: 2}
"""
HELD = "11111111-1111-4111-8111-111111111111"


Node = tuple[RecordingHost, FakeCluster, RecordingDevicePlugin, Ports]


@pytest.fixture
def node() -> Node:
    sim = open_sim(parse_spec(SPEC, catalog=CATALOG))
    host = RecordingHost(sim.host)
    cluster = FakeCluster(sim.cluster.node_name(), sim.cluster.labels())
    plugin = RecordingDevicePlugin()
    config = StaticConfigSource(load_text(CONFIG, "c.yaml", catalog=CATALOG))
    return host, cluster, plugin, Ports(host, cluster, config, plugin)


def settings(tmp_path: Path | None = None) -> Settings:
    journal = tmp_path / "journal.jsonl" if tmp_path else None
    return Settings(catalog=default_catalog(), journal_path=journal, clock=lambda: 1000.0)


def test_plan_selects_by_the_clusters_labels_and_changes_nothing(node: Node) -> None:
    host, cluster, _plugin, ports = node
    report = reconcile_once(ports, settings())
    assert report.inputs.config == "small" and report.inputs.source == "label"
    assert report.plan.summary.destroy == 2 and report.plan.summary.create == 8
    assert host.calls == [] and not report.matches
    cluster.set_label("nvidia.com/vgpu.config", "keep")
    again = reconcile_once(ports, settings())
    assert again.inputs.config == "keep" and again.plan.is_converged and again.converged


def test_apply_converges_and_reports_to_cluster_and_device_plugin(
    node: Node, tmp_path: Path
) -> None:
    host, cluster, plugin, ports = node
    report = reconcile_once(ports, settings(tmp_path), mode=Mode.APPLY)
    assert report.converged and report.applied is not None
    assert [c.split()[0] for c in host.changes] == ["remove_mdev"] * 2 + ["create_mdev"] * 8
    # The report ends with a fresh scan, and that is what the device plugin gets.
    assert plugin.snapshots == [report.final] and report.final == host.inner.scan()
    status = cluster.last_status
    assert status is not None and status.state is ConfigState.SUCCESS
    synced = status.condition(ConditionType.SYNCED)
    assert synced is not None and synced.status and status.vgpus == (("T4-2Q", 8),)
    assert [e.reason for e in cluster.events] == ["Applied"]
    # Journal timestamps come from the settings' clock.
    assert '"ts": 1000.0' in (tmp_path / "journal.jsonl").read_text()


def test_a_held_vgpu_is_blocked_with_a_code_and_the_rest_applies(
    node: Node, tmp_path: Path
) -> None:
    host, cluster, _plugin, ports = node
    cluster.hold(HELD, "vm default/db")
    report = reconcile_once(ports, settings(tmp_path), mode=Mode.APPLY, skip_blocked=True)
    blocked = {b.code for b in report.plan.blocked}
    assert BlockedReason.IN_USE in blocked
    assert all(HELD not in c for c in host.changes)
    status = cluster.last_status
    assert status is not None and status.state is ConfigState.PENDING
    block = status.condition(ConditionType.BLOCKED)
    assert block is not None and block.status and block.reason == "InUse"
    assert "vm default/db" in block.message
    # Nothing left to do: the plan has no changes, yet the node is not converged.
    again = reconcile_once(ports, settings(tmp_path))
    assert not again.plan.has_changes and not again.plan.is_converged and not again.converged


def test_blocked_items_stop_the_apply_unless_allowed(node: Node) -> None:
    host, cluster, _plugin, ports = node
    cluster.hold(HELD, "vm default/db")
    with pytest.raises(Exception) as e:
        reconcile_once(ports, settings(), mode=Mode.APPLY)
    assert getattr(e.value, "reason", None) is Reason.BLOCKED
    assert "--" not in str(e.value)  # no command-line flags below the CLI
    assert host.calls == []
    assert cluster.last_status is not None and cluster.last_status.state is ConfigState.FAILED


def test_a_declining_gate_changes_nothing(node: Node) -> None:
    host, cluster, plugin, ports = node
    seen: list[Plan] = []

    def decline(p: Plan) -> bool:
        seen.append(p)
        return False

    report = reconcile_once(ports, settings(), mode=Mode.APPLY, gate=decline)
    assert report.declined and seen == [report.plan]
    assert host.calls == [] and plugin.snapshots == [] and cluster.statuses == []


def test_a_driver_failure_is_a_host_error_reported_with_its_reason(
    node: Node, tmp_path: Path
) -> None:
    _host, cluster, plugin, ports = node
    sim = open_sim(parse_spec(SPEC + "faults:\n  - {op: remove, errno: EBUSY}\n", catalog=CATALOG))
    ports = Ports(RecordingHost(sim.host), cluster, ports.config, plugin)
    with pytest.raises(ApplyError) as e:
        reconcile_once(ports, settings(tmp_path), mode=Mode.APPLY)
    assert e.value.kind is ErrorKind.HOST and e.value.reason is Reason.DEVICE_BUSY
    assert e.value.errno == 16
    status = cluster.last_status
    assert status is not None and status.state is ConfigState.FAILED
    ready = status.condition(ConditionType.READY)
    assert ready is not None and ready.reason == "DeviceBusy"
    assert cluster.events[-1].reason == "DeviceBusy"


def test_no_config_selected_is_a_user_error_with_its_reason(node: Node) -> None:
    _host, cluster, _plugin, ports = node
    cluster.set_label("nvidia.com/vgpu.config", None)
    with pytest.raises(NoConfigSelectedError) as e:
        reconcile_once(ports, settings())
    assert isinstance(e.value, SelectionError)
    assert e.value.kind is ErrorKind.USER and e.value.reason is Reason.NO_CONFIG_SELECTED


def test_a_bad_config_edit_keeps_the_last_good_document(node: Node, tmp_path: Path) -> None:
    _host, cluster, plugin, ports = node
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    source = FileConfigSource(path, catalog=CATALOG)
    ports = Ports(ports.host, cluster, source, plugin)
    first = reconcile_once(ports, settings())
    assert first.config_warning is None
    path.write_text(CONFIG.replace("T4-2Q: 8", "T4-2Q: [8"))
    second = reconcile_once(ports, settings())
    assert second.plan == first.plan
    assert second.config_warning is not None and "config.yaml:" in second.config_warning
    assert source.error is not None and source.error.reason is Reason.CONFIG_INVALID
    fresh = FileConfigSource(path, catalog=CATALOG)
    with pytest.raises(Exception) as e:
        fresh.document()
    assert getattr(e.value, "kind", None) is ErrorKind.USER
