"""The agent's side of the cluster: its Node, its Events, the KubeVirt CR, held vGPUs.

:class:`NodeCluster` is the :class:`~vgpu_state.ports.ClusterPort` the agent
reconciles with, assembled from the Kubernetes adapters of
:mod:`vgpu_state.kube`: labels are read fresh from the Node for every
reconcile, the outcome goes to the Node's state label and annotations, and
Events are created on the Node. :class:`ClusterSink` follows every
reconcile's fresh scan: the device plugin advertises it and the KubeVirt CR
permits its vGPU types.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from vgpu_state.kube.api import KubeApi, path_of
from vgpu_state.kube.errors import ClusterError, PodResourcesUnavailableError
from vgpu_state.kube.kubevirt import KubeVirtRef, desired_entries, find, sync
from vgpu_state.kube.node import labels_of, read_node, write_state
from vgpu_state.model.inuse import InUse
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import ConditionType, NodeEvent, NodeStatus

log = logging.getLogger(__name__)

InUseSource = Callable[[], InUse]
"""Reads which vGPUs a pod or VM holds now; raises when that is unknown."""


class NodeCluster:
    """:class:`~vgpu_state.ports.ClusterPort` of one node over the Kubernetes API."""

    def __init__(
        self,
        api: KubeApi,
        node: str,
        in_use: InUseSource,
        component: str = "vgpu-state-agent",
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.api = api
        self.node = node
        self._in_use = in_use
        self._component = component
        self._clock = clock
        self.last_status: NodeStatus | None = None

    def node_name(self) -> str:
        return self.node

    def labels(self) -> Mapping[str, str]:
        return labels_of(read_node(self.api, self.node))

    def in_use(self) -> InUse:
        return self._in_use()

    def report_status(self, status: NodeStatus) -> None:
        self.last_status = status
        shown = status.condition(ConditionType.DEGRADED) or status.condition(ConditionType.SYNCED)
        summary = shown.message if shown is not None else None
        write_state(
            self.api,
            self.node,
            status.state,
            applied_config=status.config,
            plan_summary=(summary or "")[:1000] or None,
        )

    def emit_event(self, event: NodeEvent) -> None:
        now = self._clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.node}.", "namespace": "default"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": self.node,
            },
            "reason": event.reason,
            "message": event.message[:1024],
            "type": event.type.value,
            "source": {"component": self._component, "host": self.node},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.api.create(path_of("", "v1", "events", namespace="default"), body)
        except ClusterError as e:  # an Event that cannot be written must not fail a reconcile
            log.warning("cannot record Event %s on node %s: %s", event.reason, self.node, e)


def in_use_from_file(path: str) -> InUseSource:
    """Held vGPUs from a file re-read every reconcile (JSON object, or ``KEY HOLDER`` lines)."""
    import json
    from pathlib import Path

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


def unknown_in_use(where: str) -> InUseSource:
    """No source of held vGPUs: every reconcile fails before it could destroy a held one."""

    def read() -> InUse:
        raise PodResourcesUnavailableError(
            where, "no source of held vGPUs is configured (--in-use-file or --sim)"
        )

    return read


class PluginSink(Protocol):
    def refresh(self, snapshot: NodeSnapshot) -> None: ...


class ClusterSink:
    """:class:`~vgpu_state.ports.DevicePluginSink`: the device plugin, then the KubeVirt CR."""

    def __init__(
        self,
        api: KubeApi | None,
        plugin: PluginSink | None = None,
        kubevirt: KubeVirtRef | None = None,
        manage_kubevirt: bool = True,
    ) -> None:
        self.api = api
        self.plugin = plugin
        self._ref = kubevirt
        self._manage = manage_kubevirt and api is not None
        self._warned = False
        self.last: Any = None

    def refresh(self, snapshot: NodeSnapshot) -> None:
        if self.plugin is not None:
            self.plugin.refresh(snapshot)
        if not self._manage or self.api is None:
            return
        desired = desired_entries(snapshot)
        for problem in desired.problems:
            log.warning("%s", problem)
        try:
            ref = find(self.api, self._ref)
            self._ref = ref
            self.last = sync(self.api, ref, desired.entries)
        except ClusterError as e:
            if not self._warned:
                log.warning("KubeVirt CR not updated: %s", e)
                self._warned = True
            return
        self._warned = False
        for change in getattr(self.last, "changes", ()):
            log.info("KubeVirt CR %s: %s", ref, change)
