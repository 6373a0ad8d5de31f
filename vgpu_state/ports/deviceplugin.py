"""``DevicePluginSink``: what advertises the node's vGPUs to the kubelet."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vgpu_state.model.snapshot import NodeSnapshot


@runtime_checkable
class DevicePluginSink(Protocol):
    """Learns the node's vGPUs after every reconcile (a fresh scan, never a plan), and
    which of them not to offer while their GPU's layout switch is pending."""

    def refresh(self, snapshot: NodeSnapshot) -> None: ...

    def withhold(self, keys: frozenset[str]) -> None:
        """Offer none of ``keys`` (vGPU keys: mdev UUIDs, VF addresses) until a later call
        no longer names them; each call replaces the previous set."""
        ...


class NoDevicePlugin:
    """A :class:`DevicePluginSink` that advertises nothing (the CLI, tests)."""

    def refresh(self, snapshot: NodeSnapshot) -> None:
        return None

    def withhold(self, keys: frozenset[str]) -> None:
        return None
