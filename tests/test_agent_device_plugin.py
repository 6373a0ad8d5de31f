"""The device plugin inside the agent: what the kubelet, the status and the operator see.

The agent's end-to-end test (``test_agent_e2e.py``) runs the whole process
against a fake kubelet; these tests pin the pieces it is built from: the
status describes every vGPU even when some are published through DRA, a
device plugin that cannot serve never hides the rest of the report, a kubelet
restart wakes the agent, and a directory too long for unix sockets is refused
with a clear message.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.builders import V, build_gpu, build_snapshot
from vgpu_state.agent.cluster import ClusterSink
from vgpu_state.deviceplugin import DevicePluginManager
from vgpu_state.model.errors import UserError
from vgpu_state.model.policy import Publish
from vgpu_state.model.publish import join, split
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import EventType
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet

Q = "nvidia.com/A2-4Q"
A = "0000:08:00.0"
B = "0000:41:00.0"


def two_gpus() -> NodeSnapshot:
    return build_snapshot(
        build_gpu(A, "A2", vgpus=[V("A2-4Q", 0), V("A2-4Q", 1)]),
        build_gpu(B, "A2", vgpus=[V("A2-2Q", 0)]),
    )


def by_gpu(snapshot: NodeSnapshot) -> dict[str, set[str]]:
    return {g.address: {v.key for v in g.vgpus} for g in snapshot.gpus}


class Cluster:
    """What :class:`ClusterSink` uses of the agent's cluster, recorded."""

    def __init__(self) -> None:
        self.observed: list[NodeSnapshot] = []
        self.events: list[tuple[str, str, EventType]] = []
        self.last_in_use: Mapping[str, str] | None = {}

    def observe(self, snapshot: NodeSnapshot, held: Any, *, in_use_known: bool) -> None:
        self.observed.append(snapshot)

    def event(self, reason: str, message: str, type: EventType) -> None:
        self.events.append((reason, message, type))


class Plugin:
    def __init__(self, fail: Exception | None = None) -> None:
        self.seen: list[NodeSnapshot] = []
        self.fail = fail

    def refresh(self, snapshot: NodeSnapshot) -> None:
        if self.fail is not None:
            raise self.fail
        self.seen.append(snapshot)


def test_split_and_join_are_inverse() -> None:
    snapshot = two_gpus()
    for dra_gpus in (set(), {A}, {B}, {A, B}):
        dra = frozenset(dra_gpus)
        channels = split(snapshot, lambda a: Publish.DRA if a in dra else Publish.DEVICE_PLUGIN)  # noqa: B023
        assert join(channels.device_plugin, channels.dra) == snapshot


def test_the_status_describes_dra_vgpus_too_but_the_plugin_never_sees_them() -> None:
    snapshot = two_gpus()
    channels = split(snapshot, lambda a: Publish.DRA if a == B else Publish.DEVICE_PLUGIN)
    cluster, plugin, dra = Cluster(), Plugin(), Plugin()
    sink = ClusterSink(cluster, plugin)  # type: ignore[arg-type]
    dra_port = sink.dra_channel(dra)

    # The order of one reconcile: device plugin, then DRA, then the status.
    sink.refresh(channels.device_plugin)
    dra_port.refresh(channels.dra)

    assert by_gpu(plugin.seen[-1])[B] == set()
    assert by_gpu(dra.seen[-1])[A] == set() and len(by_gpu(dra.seen[-1])[B]) == 1
    assert by_gpu(cluster.observed[-1]) == by_gpu(snapshot)


def test_without_dra_the_status_is_the_device_plugin_snapshot() -> None:
    snapshot = two_gpus()
    cluster = Cluster()
    sink = ClusterSink(cluster, Plugin())  # type: ignore[arg-type]
    dra_port = sink.dra_channel(None)
    sink.refresh(snapshot)
    dra_port.refresh(split(snapshot, lambda a: Publish.DEVICE_PLUGIN).dra)
    assert cluster.observed[-1] == snapshot


def test_a_device_plugin_that_cannot_serve_is_an_event_not_a_lost_status() -> None:
    cluster = Cluster()
    sink = ClusterSink(cluster, Plugin(fail=RuntimeError("Failed to bind to address unix:/x")))  # type: ignore[arg-type]
    sink.refresh(two_gpus())
    sink.refresh(two_gpus())
    assert len(cluster.observed) == 2
    assert len(cluster.events) == 1, "one Event per distinct failure, not one per reconcile"
    reason, message, kind = cluster.events[0]
    assert reason == "DevicePluginFailed" and kind is EventType.WARNING
    assert "Failed to bind" in message


def test_a_plugin_directory_too_long_for_unix_sockets_is_refused() -> None:
    with pytest.raises(UserError, match=r"too long for the unix sockets .*at most 74 bytes"):
        DevicePluginManager("/tmp/" + "d" * 120)
    DevicePluginManager("/var/lib/kubelet/device-plugins")  # the kubelet's own is fine


def test_a_kubelet_restart_wakes_the_agent_once_and_the_first_kubelet_does_not() -> None:
    with tempfile.TemporaryDirectory(prefix="dp-", dir="/tmp") as d:
        kubelet = DevicePluginKubelet(d)
        kubelet.start()
        manager = DevicePluginManager(d, present=lambda device: True, poll_interval=0.02)
        restarts: list[int] = []
        woke = threading.Event()

        def restarted() -> None:
            restarts.append(1)
            woke.set()

        manager.on_kubelet_restart = restarted
        try:
            manager.refresh(two_gpus())
            kubelet.wait_registered(Q)
            assert not woke.wait(0.3) and restarts == []
            kubelet.restart()
            assert woke.wait(5), "no wake-up after the kubelet restarted"
            kubelet.wait_registered(Q, count=2)
            assert restarts == [1]
        finally:
            manager.stop()
            kubelet.stop()
    assert not Path(d).exists()
