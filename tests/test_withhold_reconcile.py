"""When a reconcile tells the device plugin and DRA what to withhold, and what the status says.

A simulated A2 and the in-memory cluster port; ``tests/test_withhold_kubelet.py`` and
``tests/test_withhold_cluster.py`` run the same path against the kubelet's device
manager and the real API server.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

from tests.withhold_support import (
    CATALOG,
    FREE_4A,
    FREE_4Q,
    GPU,
    HELD_4C,
    KEEP,
    NODE,
    SWITCH,
    VM_HOLDER,
    a2_host,
    config,
    settings,
)
from vgpu_state.controller.bounds import LayoutBounds
from vgpu_state.controller.reports import read_report
from vgpu_state.kube import nodestate
from vgpu_state.kube.nodestate import VGPUNodeStateStatus, encode_snapshot, layout_status
from vgpu_state.model.plan import Plan
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.reconcile import Mode, Ports, Report, publish, reconcile_once
from vgpu_state.reconcile.status import pending_switches, still_withheld
from vgpu_state.sim.host import SimHost
from vgpu_state.testing import FakeCluster, RecordingDevicePlugin

NOW = datetime.datetime(2026, 11, 29, 0, 0, tzinfo=datetime.UTC)


def _ports(
    host: SimHost, cluster: FakeCluster, layout: str, policy: str = "evacuate"
) -> tuple[Ports, RecordingDevicePlugin, RecordingDevicePlugin]:
    plugin, dra = RecordingDevicePlugin(), RecordingDevicePlugin()
    return Ports(host, cluster, config(layout, policy), plugin, dra), plugin, dra


def test_the_plugin_and_dra_learn_what_is_withheld_before_the_rollout_gate(tmp_path: Path) -> None:
    host = SimHost(a2_host(tmp_path))
    cluster = FakeCluster(NODE)
    ports, plugin, dra = _ports(host, cluster, SWITCH)
    at_gate: list[tuple[frozenset[str], frozenset[str]]] = []

    def no_slot(plan: Plan) -> bool:
        at_gate.append((plugin.withheld[-1], dra.withheld[-1]))
        return False

    try:
        report = reconcile_once(
            ports, settings(), mode=Mode.APPLY, config_name="a2", skip_blocked=True, gate=no_slot
        )
        everything = frozenset({HELD_4C, FREE_4Q, FREE_4A})
        assert report.declined and at_gate == [(everything, everything)]
        assert plugin.snapshots == []  # nothing else was published: the host did not change
        status = cluster.last_status
        assert status is not None and status.state is not None
        assert status.state.value == "pending"
        assert status.switches is not None and len(status.switches) == 1
        assert status.switches[0].state == "planned"
        assert status.switches[0].departing == ("A2-4A", "A2-4C", "A2-4Q")
    finally:
        host.close()


def test_under_protect_a_deferred_switch_is_reported_and_nothing_is_withheld(
    tmp_path: Path,
) -> None:
    host = SimHost(a2_host(tmp_path))
    cluster = FakeCluster(NODE, in_use={HELD_4C: VM_HOLDER})
    ports, plugin, dra = _ports(host, cluster, SWITCH, "protect")
    try:
        reconcile_once(ports, settings(), mode=Mode.APPLY, config_name="a2", skip_blocked=True)
        assert set(plugin.withheld) == {frozenset()} and set(dra.withheld) == {frozenset()}
        status = cluster.last_status
        assert status is not None and status.switches is not None
        (switch,) = status.switches
        assert (switch.gpu, switch.state, switch.policy) == (GPU, "deferred", "protect")
        assert switch.withheld == ()
        assert (
            VM_HOLDER in switch.message and "nothing is moved (in-use: protect)" in switch.message
        )

        ports, plugin, dra = _ports(host, cluster, KEEP, "protect")
        reconcile_once(ports, settings(), mode=Mode.APPLY, config_name="a2", skip_blocked=True)
        assert cluster.last_status is not None and cluster.last_status.switches == ()
    finally:
        host.close()


def test_a_plan_only_report_withholds_nothing_and_names_no_switch(tmp_path: Path) -> None:
    host = SimHost(a2_host(tmp_path))
    cluster = FakeCluster(NODE, in_use={HELD_4C: VM_HOLDER})
    ports, plugin, dra = _ports(host, cluster, SWITCH)
    try:
        report = reconcile_once(ports, settings(), mode=Mode.PLAN, config_name="a2")
        assert report.plan.gpus[0].withheld == (FREE_4A, FREE_4Q)
        assert plugin.withheld == []  # planning alone tells nobody
        publish(ports, report, enforcing=False)  # what a plan-only agent reports
        assert plugin.withheld == [frozenset()] and dra.withheld == [frozenset()]
        assert cluster.last_status is not None and cluster.last_status.switches == ()
    finally:
        host.close()


def _retyped(snapshot: NodeSnapshot, key: str, type_name: str) -> NodeSnapshot:
    gpus = []
    for g in snapshot.gpus:
        vgpus = tuple(
            v.model_copy(update={"type_name": type_name, "type_id": 999}) if v.key == key else v
            for v in g.vgpus
        )
        gpus.append(g.model_copy(update={"vgpus": vgpus}))
    return snapshot.model_copy(update={"gpus": tuple(gpus)})


def test_a_key_reused_by_a_vgpu_of_another_type_is_not_withheld_after_the_switch(
    tmp_path: Path,
) -> None:
    host = SimHost(a2_host(tmp_path))
    cluster = FakeCluster(NODE, in_use={HELD_4C: VM_HOLDER})
    ports, _, _ = _ports(host, cluster, SWITCH)
    try:
        report = reconcile_once(ports, settings(), mode=Mode.PLAN, config_name="a2")
        assert still_withheld(report) == {FREE_4Q, FREE_4A}
        # mdev UUIDs are derived from the GPU's slots: a new vGPU may carry a departed key.
        after: Report = dataclasses.replace(report, final=_retyped(report.final, FREE_4Q, "A2-2Q"))
        assert still_withheld(after) == {FREE_4A}
    finally:
        host.close()


def test_the_controller_reads_a_report_with_a_pending_switch_as_one_without(
    tmp_path: Path,
) -> None:
    """The status fields of a pending switch add nothing the controller must trust or refuse:
    the KubeVirt CR entries a report justifies stay those of its scan."""
    host = SimHost(a2_host(tmp_path))
    cluster = FakeCluster(NODE, in_use={HELD_4C: VM_HOLDER})
    ports, _, _ = _ports(host, cluster, SWITCH)
    try:
        report = reconcile_once(ports, settings(), mode=Mode.PLAN, config_name="a2")
    finally:
        host.close()
    switches = pending_switches(report)
    assert switches and switches[0].withheld == (FREE_4A, FREE_4Q)
    bounds = LayoutBounds(frozenset({"A2-4A", "A2-4C", "A2-4Q"}), CATALOG)

    def state(with_switch: bool) -> dict[str, Any]:
        snapshot = report.inputs.snapshot
        gpus, capacity = layout_status(
            snapshot, report.inputs.in_use, switches if with_switch else ()
        )
        status = VGPUNodeStateStatus(
            gpus=gpus, capacity=capacity, snapshot=encode_snapshot(snapshot, NOW)
        )
        return {
            "apiVersion": nodestate.API_VERSION,
            "kind": nodestate.KIND,
            "metadata": {"name": NODE},
            "spec": {"nodeName": NODE},
            "status": status.to_json(),
        }

    with_switch = state(True)
    assert with_switch["status"]["gpus"][0]["switch"]["withheld"] == 2
    assert with_switch["status"]["gpus"][0]["vgpus"][0]["vm"] == "default/win-1"
    read = read_report(with_switch, bounds)
    assert read.refused is None and read.unreadable is None
    assert read == read_report(state(False), bounds)
    assert nodestate.status_of(with_switch) is not None  # the agent reads its own back
