"""Withheld vGPUs against the kubelet's own device manager (``hack/k8s/cmd/kubelet-harness``).

A layout switch on a simulated A2 is planned by ``reconcile_once`` (the agent's
reconcile) with vgpu-state's device plugin as its device-plugin port and the
kubelet's ``pkg/kubelet/cm/devicemanager`` on the other end of the plugin's
socket: the free vGPUs of the departing types leave the kubelet's allocatable
as soon as the plan is made (before the rollout gate is asked), the plugin
refuses to allocate one by ID, and they come back when the layout is reverted.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.kubelet_harness import Harness, require_harness, running
from tests.withhold_support import (
    FREE_4A,
    FREE_4Q,
    HELD_4C,
    KEEP,
    NODE,
    R_2Q,
    R_4A,
    R_4C,
    R_4Q,
    SWITCH,
    VM_HOLDER,
    a2_host,
    config,
    settings,
)
from vgpu_state.deviceplugin import DevicePluginManager
from vgpu_state.deviceplugin.v1beta1 import api_pb2 as pb
from vgpu_state.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from vgpu_state.model.plan import Plan
from vgpu_state.reconcile import Mode, Ports, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.testing import FakeCluster


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kwh-", dir="/tmp"))  # unix socket paths stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _allocatable(k: Harness, want: dict[str, int], what: str) -> dict[str, Any]:
    return k.wait_for(
        what,
        "capacity",
        lambda a: {r: n for r, n in a["allocatable"].items() if n} == want,
    )


def _allocate_by_id(manager: DevicePluginManager, resource: str, key: str) -> grpc.RpcError:
    socket = manager.status()[resource].socket
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=[key])]
        )
        try:
            pb_grpc.DevicePluginStub(channel).Allocate(request, timeout=5)
        except grpc.RpcError as e:
            return e
    raise AssertionError(f"Allocate of withheld {key} was not refused")


def test_withheld_vgpus_leave_the_kubelets_allocatable_and_come_back_after_a_revert(
    tmp_path: Path, short_dir: Path
) -> None:
    require_harness()
    host = SimHost(a2_host(tmp_path))
    cluster = FakeCluster(NODE, in_use={HELD_4C: VM_HOLDER})
    plugin_dir = short_dir / "device-plugins"
    manager = DevicePluginManager(
        str(plugin_dir), poll_interval=0.05, iommufd=False, present=lambda d: True
    )

    def reconcile(layout: str, **options: Any) -> Any:
        ports = Ports(host, cluster, config(layout), manager)
        return reconcile_once(
            ports, settings(), mode=Mode.APPLY, config_name="a2", skip_blocked=True, **options
        )

    try:
        with running("devicemanager", "--dir", str(plugin_dir), log=tmp_path / "k.log") as k:
            reconcile(KEEP)
            _allocatable(k, {R_4C: 1, R_4Q: 1, R_4A: 1}, "the A2's three vGPUs")

            # A VM holds the A2-4C: the switch to A2-2Q is deferred, and the two free
            # vGPUs of departing types are withheld; the held one stays listed.
            report = reconcile(SWITCH)
            assert report.plan.gpus[0].deferred_switch is not None
            seen = _allocatable(k, {R_4C: 1}, "the free A2-4Q and A2-4A withheld")
            assert seen["capacity"].get(R_4Q, 0) == 0 and seen["capacity"].get(R_4A, 0) == 0
            refused = _allocate_by_id(manager, R_4Q, FREE_4Q)
            assert refused.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert FREE_4Q in (refused.details() or "") and "withheld" in (refused.details() or "")
            # The kubelet has none of them to give a new VM.
            got = k.ask("allocate", pod="new-vm", limits={R_4Q: 1})
            assert "error" in got, got

            # The layout is reverted: nothing is pending, everything is offered again.
            reconcile(KEEP)
            seen = _allocatable(k, {R_4C: 1, R_4Q: 1, R_4A: 1}, "the vGPUs back after the revert")
            assert seen["healthy"][R_4Q] == [FREE_4Q] and seen["healthy"][R_4A] == [FREE_4A]
            assert manager.withheld == frozenset()

            # The VM is gone; the switch destroys vGPUs, so it waits for a rollout slot.
            # Its departing vGPUs leave the kubelet before the slot is even asked for.
            cluster.release(HELD_4C)
            asked: list[dict[str, Any]] = []

            def no_slot(plan: Plan) -> bool:
                asked.append(_allocatable(k, {}, "everything withheld before the gate"))
                return False

            report = reconcile(SWITCH, gate=no_slot)
            assert report.declined and len(asked) == 1
            assert manager.withheld == {HELD_4C, FREE_4Q, FREE_4A}
            status = cluster.last_status
            assert status is not None and status.switches is not None
            (switch,) = status.switches
            assert switch.state == "planned" and "waiting for a rollout slot" in switch.message
            assert set(switch.withheld) == {HELD_4C, FREE_4Q, FREE_4A}

            # A slot: the switch runs, and the new layout is offered in full.
            report = reconcile(SWITCH)
            assert report.converged
            _allocatable(k, {R_2Q: 8}, "eight A2-2Q after the switch")
            assert manager.withheld == frozenset()
    finally:
        manager.stop()
        host.close()
