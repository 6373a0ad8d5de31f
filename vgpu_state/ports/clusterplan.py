"""``ClusterPlanner``: the cluster's part of a node's plan (the KubeVirt CR's view)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from vgpu_state.model.plan import ClusterPart
from vgpu_state.model.snapshot import NodeSnapshot


class ClusterPlanner(Protocol):
    """What the cluster needs once the host looks like ``expected``, and what forbids it.

    Real: the KubeVirt CR read by the Kubernetes adapter (entries the node's
    types need, KubeVirt's own mdev management as a blocker). Reads only.
    """

    def cluster_plan(self, expected: NodeSnapshot, labels: Mapping[str, str]) -> ClusterPart: ...


class NoClusterPlan:
    """A :class:`ClusterPlanner` of a node outside any cluster: no actions, no blockers."""

    def cluster_plan(self, expected: NodeSnapshot, labels: Mapping[str, str]) -> ClusterPart:
        return ClusterPart()
