"""``WithheldSink``: where an agent records the vGPUs it withholds, for ``vgpu-state scan``."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vgpu_state.model.withheld import WithheldVgpu


@runtime_checkable
class WithheldSink(Protocol):
    """Learns, each time the device plugin and DRA are told what to withhold, the same
    vGPUs with why (an empty tuple: nothing is withheld)."""

    def record(self, vgpus: tuple[WithheldVgpu, ...], snapshot_fingerprint: str | None) -> None:
        """``vgpus`` are withheld now, planned from the scan ``snapshot_fingerprint``;
        each call replaces the previous set. Must not raise."""
        ...


class NoWithheldRecord:
    """A :class:`WithheldSink` that keeps nothing (the CLI, a plan by hand, tests)."""

    def record(self, vgpus: tuple[WithheldVgpu, ...], snapshot_fingerprint: str | None) -> None:
        return None
