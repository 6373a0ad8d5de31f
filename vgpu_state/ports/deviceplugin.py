"""``DevicePluginSink``: what advertises the node's vGPUs to the kubelet."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vgpu_state.model.snapshot import NodeSnapshot


@runtime_checkable
class DevicePluginSink(Protocol):
    """Learns the node's vGPUs after every reconcile (a fresh scan, never a plan)."""

    def refresh(self, snapshot: NodeSnapshot) -> None: ...


class NoDevicePlugin:
    """A :class:`DevicePluginSink` that advertises nothing (the CLI, tests)."""

    def refresh(self, snapshot: NodeSnapshot) -> None:
        return None
