"""The agent's side of the cluster: :class:`~vgpu_state.kube.cluster.KubeCluster`, and what
follows every scan.

:class:`AgentCluster` is the cluster port the agent reconciles with: the
Kubernetes adapter (labels read fresh, the state label, the ``VGPUNodeState``
status, aggregated Events, held vGPUs from the kubelet's pod-resources API),
plus what only the agent reports: the ``Degraded`` condition of a config that
does not load (with every located error in the status and the Node's
``vgpu-state.io/last-plan`` annotation), and, where the kubelet cannot be
asked (a simulated node, a test), held vGPUs from another source.
:class:`ClusterSink` follows every reconcile's fresh scan: the device plugin
advertises it, the status describes it, the KubeVirt CR permits its types.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from vgpu_state.kube.cluster import KubeCluster
from vgpu_state.kube.errors import ClusterError, PodResourcesUnavailableError
from vgpu_state.model.inuse import InUse
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import ConditionType, NodeStatus

log = logging.getLogger(__name__)

InUseSource = Callable[[], InUse]
"""Reads which vGPUs a pod or VM holds now; raises when that is unknown."""


class AgentCluster(KubeCluster):
    """:class:`KubeCluster` with the agent's status details and an optional in-use source."""

    def __init__(self, *args: Any, in_use_source: InUseSource | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_use_source = in_use_source
        self.last_in_use: InUse | None = None

    def in_use(self) -> InUse:
        try:
            held = self._in_use_source() if self._in_use_source else super().in_use()
        except PodResourcesUnavailableError:
            self.last_in_use = None
            raise
        self.last_in_use = held
        return held

    def report_status(self, status: NodeStatus) -> None:
        shown = status.condition(ConditionType.DEGRADED) or status.condition(ConditionType.SYNCED)
        summary = (shown.message if shown is not None else "")[:1000] or None
        self.set_state(status.state, applied_config=status.config, plan_summary=summary)
        degraded = status.condition(ConditionType.DEGRADED)
        if degraded is None:
            super().report_status(status)
            return
        conditions: list[tuple[Any, bool | None, str, str]] = [
            (c.type.value, c.status, c.reason, c.message) for c in status.conditions
        ]
        self.write_status(state=status.state, conditions=conditions)


def in_use_from_file(path: str) -> InUseSource:
    """Held vGPUs from a file re-read every reconcile (JSON object, or ``KEY HOLDER`` lines)."""
    import json

    def read() -> InUse:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise PodResourcesUnavailableError(path, f"cannot read the in-use file: {e}") from e
        stripped = text.strip()
        if stripped.startswith("{"):
            try:
                data = json.loads(stripped)
            except ValueError as e:
                raise PodResourcesUnavailableError(path, f"invalid JSON: {e}") from e
            return InUse({str(k): str(v) for k, v in data.items()})
        held: dict[str, str] = {}
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                key, _, holder = line.partition(" ")
                held[key] = holder.strip() or "an unnamed holder"
        return InUse(held)

    return read


class PluginSink(Protocol):
    def refresh(self, snapshot: NodeSnapshot) -> None: ...


class ClusterSink:
    """The :class:`~vgpu_state.ports.DevicePluginSink`: device plugin, status, KubeVirt CR."""

    def __init__(
        self,
        cluster: AgentCluster,
        plugin: PluginSink | None = None,
        manage_kubevirt: bool = True,
    ) -> None:
        self.cluster = cluster
        self.plugin = plugin
        self._manage = manage_kubevirt
        self._warned: str | None = None

    def refresh(self, snapshot: NodeSnapshot) -> None:
        if self.plugin is not None:
            self.plugin.refresh(snapshot)
        held: Mapping[str, str] | None = self.cluster.last_in_use
        self.cluster.observe(snapshot, held, in_use_known=held is not None)
        if not self._manage:
            return
        try:
            result = self.cluster.sync_kubevirt(snapshot)
        except ClusterError as e:
            if self._warned != str(e):
                log.warning("KubeVirt CR not updated: %s", e)
                self._warned = str(e)
            return
        self._warned = None
        for problem in result.problems:
            log.warning("%s", problem)
