"""``ClusterPort``: the node as the cluster sees it, and an in-memory implementation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from vgpu_state.model.inuse import InUse
from vgpu_state.model.status import NodeEvent, NodeStatus


@runtime_checkable
class ClusterPort(Protocol):
    """The node's identity, its labels, the vGPUs held, and where status and Events go.

    Real: the Kubernetes adapter (node object, kubelet pod-resources, the
    ``VGPUNodeState`` resource, Events). In memory: :class:`MemoryCluster`.
    """

    def node_name(self) -> str:
        """The node's name (the Kubernetes Node's ``metadata.name``)."""
        ...

    def labels(self) -> Mapping[str, str]:
        """The node's labels now (they select the config)."""
        ...

    def in_use(self) -> InUse:
        """Which vGPUs a pod or VM holds now: key (mdev UUID or VF address) -> holder."""
        ...

    def report_status(self, status: NodeStatus) -> None:
        """Publish the outcome of a reconcile (state label, status conditions)."""
        ...

    def emit_event(self, event: NodeEvent) -> None:
        """Tell an operator something happened on the node."""
        ...


class MemoryCluster:
    """A :class:`ClusterPort` held in memory: a fixed identity, labels and holders.

    Status reports and Events are kept in :attr:`statuses` and :attr:`events`,
    newest last. The CLI uses it for a node given by flags or by a simulator
    spec; tests use it (or :class:`vgpu_state.testing.FakeCluster`) instead of
    a Kubernetes API server.
    """

    def __init__(
        self,
        node: str,
        labels: Mapping[str, str] | None = None,
        in_use: Mapping[str, str] | None = None,
    ) -> None:
        self.node = node
        self._labels = dict(labels or {})
        self._in_use = InUse(in_use)
        self.statuses: list[NodeStatus] = []
        self.events: list[NodeEvent] = []

    def node_name(self) -> str:
        return self.node

    def labels(self) -> Mapping[str, str]:
        return dict(self._labels)

    def in_use(self) -> InUse:
        return self._in_use

    def report_status(self, status: NodeStatus) -> None:
        self.statuses.append(status)

    def emit_event(self, event: NodeEvent) -> None:
        self.events.append(event)

    def with_overrides(
        self,
        node: str | None = None,
        labels: Mapping[str, str] | None = None,
        in_use: Mapping[str, str] | None = None,
    ) -> MemoryCluster:
        """A copy whose name, extra labels and extra holders are given explicitly."""
        return MemoryCluster(
            node or self.node,
            {**self._labels, **(labels or {})},
            self._in_use.merged(in_use or {}),
        )
