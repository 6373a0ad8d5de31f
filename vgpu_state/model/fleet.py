"""What the cluster says about each node, as a fleet-wide plan reads it.

A :class:`ReportedNode` is one node's last report (its ``VGPUNodeState``
status) with the Node's live labels: the scan the node's agent last made and
the vGPUs held then. When the report cannot be planned against, ``unknown``
says why (no status, no scan in it, unreadable, the Node is gone).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from vgpu_state.model.snapshot import NodeSnapshot


class UnknownReason(StrEnum):
    """Why a node's plan cannot be made from what the cluster holds (stable codes)."""

    NO_STATUS = "NoStatus"
    """The ``VGPUNodeState`` has no status yet: the node's agent has not reported."""
    NO_SNAPSHOT = "NoSnapshot"
    """The status carries no scan (written by an agent older than the fleet plan)."""
    STATUS_UNREADABLE = "StatusUnreadable"
    """The status does not match the ``VGPUNodeState`` schema."""
    SNAPSHOT_UNREADABLE = "SnapshotUnreadable"
    """The reported scan cannot be decoded (bad encoding, truncated, invalid)."""
    NODE_MISSING = "NodeMissing"
    """The Node object no longer exists, so it has no labels to select a config by."""
    HOST_UNREADABLE = "HostUnreadable"
    """The agent's last scan could not read the host."""
    STALE = "Stale"
    """The last scan is older than the plan accepts."""
    SCAN_REFUSED = "ScanRefused"
    """The reported scan cannot be the node's own (another node's, or repeated addresses)."""


@dataclass(frozen=True)
class Unknown:
    reason: UnknownReason
    message: str


@dataclass(frozen=True)
class ReportedNode:
    """One node: its live labels and the scan and holders its agent last reported."""

    name: str
    labels: Mapping[str, str] | None
    """The Node's labels now; ``None`` when the Node does not exist."""
    snapshot: NodeSnapshot | None = None
    in_use: Mapping[str, str] = field(default_factory=dict)
    """vGPU key (mdev UUID or VF address) -> holder, as reported with the scan."""
    in_use_known: bool = True
    """False when the agent could not read who holds which vGPU at that scan."""
    scanned_at: datetime.datetime | None = None
    reported_config: str | None = None
    """The config the node's agent last selected (for comparison; not used to plan)."""
    reported_state: str | None = None
    """The node's config state at its last report: pending, success or failed."""
    unknown: Unknown | None = None
    """Set when the report cannot be planned against; the other fields may be empty."""
