"""The agent's side of the cluster: :class:`~vgpu_state.kube.cluster.KubeCluster`, and what
follows every scan.

:class:`AgentCluster` is the cluster port the agent reconciles with: the
Kubernetes adapter (labels read fresh, the state label, the ``VGPUNodeState``
status, aggregated Events, held vGPUs from the kubelet's pod-resources API),
plus what only the agent reports: the ``Degraded`` condition of a config that
does not load (with every located error in the status and the Node's
``vgpu-state.io/last-plan`` annotation), the ``KubeletAllocatable``
condition of an :class:`~vgpu_state.agent.allocatable.AllocatableMonitor` on
every status it writes (and :meth:`AgentCluster.rewrite_status` when only that
condition changed), and, where the kubelet cannot be asked (a simulated node,
a test), held vGPUs from another source.
:class:`ClusterSink` follows every reconcile's fresh scan: the device plugin
advertises it, the status describes it (and the cluster controller permits its
types in the KubeVirt CR from that status).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from vgpu_state.inputfiles import InputFileError, read_in_use_list
from vgpu_state.kube.cluster import KubeCluster, StatusFields
from vgpu_state.kube.errors import (
    ClusterError,
    ContendedWriteError,
    PodResourcesUnavailableError,
)
from vgpu_state.kube.nodestate import VGPUNodeStateStatus
from vgpu_state.model.inuse import InUse
from vgpu_state.model.plan import ClusterPart
from vgpu_state.model.publish import join
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import ConditionType, ConfigState, EventType, NodeStatus
from vgpu_state.ports import NoProcesses, ProcessHolders

if TYPE_CHECKING:
    from vgpu_state.agent.allocatable import AllocatableMonitor

log = logging.getLogger(__name__)

InUseSource = Callable[[], InUse]
"""Reads which vGPUs a pod or VM holds now; raises when that is unknown."""


class AgentCluster(KubeCluster):
    """:class:`KubeCluster` with the agent's status details and an optional in-use source.

    It is also the reconcile's ``processes`` port (:meth:`holders`): the host's
    processes holding vGPUs (``/proc``) are read first, and the status reports
    them with the pods'.
    """

    def __init__(
        self,
        *args: Any,
        in_use_source: InUseSource | None = None,
        processes: ProcessHolders | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._in_use_source = in_use_source
        self.processes: ProcessHolders = processes or NoProcesses()
        self._process_held: Mapping[str, str] = {}
        self.last_in_use: InUse | None = None
        self.allocatable: AllocatableMonitor | None = None
        """When set, every status carries its ``KubeletAllocatable`` condition."""
        self._write_lock = threading.RLock()
        self._last_write: StatusFields | None = None

    def holders(self, snapshot: NodeSnapshot) -> tuple[Mapping[str, str], tuple[str, ...]]:
        """The vGPUs of ``snapshot`` a process on the host holds open (``/proc``)."""
        found, warnings = self.processes.holders(snapshot)
        self._process_held = dict(found)
        for message in warnings:
            log.warning("%s", message)
        return found, warnings

    def in_use(self) -> InUse:
        """Held by a pod (the kubelet, or the in-use source), and by the processes the last
        :meth:`holders` found; the pod names the holder when both know it."""
        try:
            held = self._in_use_source() if self._in_use_source else super().in_use()
        except PodResourcesUnavailableError:
            self.last_in_use = None
            raise
        merged = InUse({**self._process_held, **held})
        self.last_in_use = merged
        return merged

    def cluster_plan(
        self, expected: NodeSnapshot, labels: Mapping[str, str] | None = None
    ) -> ClusterPart:
        """:meth:`KubeCluster.cluster_plan`; a KubeVirt CR that cannot be found or read is
        a problem, not an error: with no CR there is no KubeVirt to hand the mdevs over.

        A transient failure (the API server unreachable) is raised: the reconcile is
        retried rather than run without knowing KubeVirt's settings.
        """
        try:
            return super().cluster_plan(expected, labels)
        except ContendedWriteError:
            raise
        except ClusterError as e:
            return ClusterPart(problems=(f"KubeVirt CR not read, its settings not checked: {e}",))

    def report_status(self, status: NodeStatus) -> None:
        degraded = status.condition(ConditionType.DEGRADED)
        if degraded is None:
            super().report_status(status)
            return
        self.write_state_label(status.state, status)
        conditions: list[tuple[Any, bool | None, str, str]] = [
            (c.type.value, c.status, c.reason, c.message) for c in status.conditions
        ]
        self.write_status(state=status.state, conditions=conditions)

    def write_state_label(self, state: ConfigState | None, status: NodeStatus) -> None:
        """The state label with the applied-config and plan-summary annotations; ``None``
        removes the label (no config selects the node)."""
        # The last-plan annotation always says what the latest reconcile said, a failed one
        # too (its Ready condition carries the error): never a stale "matches".
        shown = (
            status.condition(ConditionType.DEGRADED)
            or status.condition(ConditionType.SYNCED)
            or status.condition(ConditionType.READY)
        )
        summary = (shown.message if shown is not None else "")[:1000]
        if state is None:
            self.clear_state()
        self.set_state(state, applied_config=status.config, plan_summary=summary)

    def write_status(self, **fields: Unpack[StatusFields]) -> VGPUNodeStateStatus:
        """:meth:`KubeCluster.write_status` plus the ``KubeletAllocatable`` condition.

        One writer at a time: the reconcile and the allocatable monitor write from
        different threads.
        """
        with self._write_lock:
            self._last_write = fields
            wanted = [c for c in fields.get("conditions") or [] if c[0] != "KubeletAllocatable"]
            monitor = self.allocatable
            verdict = monitor.condition() if monitor is not None else None
            if verdict is not None:
                wanted.append(
                    ("KubeletAllocatable", verdict.status, verdict.reason.value, verdict.message)
                )
            passed: StatusFields = {**fields, "conditions": wanted}
            written = super().write_status(**passed)
            if monitor is not None and verdict is not None:
                monitor.written(verdict)
            return written

    def rewrite_status(self) -> bool:
        """Write the last status again, with the newest scan and a fresh
        ``KubeletAllocatable`` condition (no write when nothing changed); ``False`` when
        no status was written yet."""
        with self._write_lock:
            if self._last_write is None:
                return False
            # The newest scan observed (a reconcile may be on its way to report it).
            again: StatusFields = {**self._last_write, "snapshot": None}
            self.write_status(**again)
            return True


def in_use_from_file(path: str) -> InUseSource:
    """Held vGPUs from a file re-read every reconcile: the in-use list of the CLI's
    ``--in-use-file`` (:func:`~vgpu_state.inputfiles.read_in_use_list`), read as every
    input file is (a regular file, size-capped)."""

    def read() -> InUse:
        try:
            return InUse(read_in_use_list(path))
        except InputFileError as e:
            raise PodResourcesUnavailableError(path, str(e)) from e

    return read


class PluginSink(Protocol):
    def refresh(self, snapshot: NodeSnapshot) -> None: ...

    def withhold(self, keys: frozenset[str]) -> None: ...


class ClusterSink:
    """The device-plugin channel (``Ports.device_plugin``): the device plugin and the status.

    The status describes every vGPU of the node, so the DRA channel is passed
    through :meth:`dra_channel`, which lets the sink see both halves of the
    same fresh scan (a reconcile refreshes the device plugin first, then DRA,
    then reports the status).
    """

    def __init__(self, cluster: AgentCluster, plugin: PluginSink | None = None) -> None:
        self.cluster = cluster
        self.plugin = plugin
        self._advertised: NodeSnapshot | None = None
        self._plugin_failed: str | None = None

    def refresh(self, snapshot: NodeSnapshot) -> None:
        # The status describes the scan before the plugin advertises it: a status the
        # allocatable monitor writes meanwhile shows the layout its condition speaks of.
        self._advertised = snapshot
        self._observe(snapshot)
        if self.plugin is not None:
            self._refresh_plugin(self.plugin, snapshot)

    def withhold(self, keys: frozenset[str]) -> None:
        """The device plugin offers none of ``keys`` (their GPU's switch is pending)."""
        if self.plugin is not None:
            self._refresh_plugin(self.plugin, None, keys)

    def _refresh_plugin(
        self,
        plugin: PluginSink,
        snapshot: NodeSnapshot | None,
        withheld: frozenset[str] | None = None,
    ) -> None:
        """A device plugin that cannot serve never stops the status and the KubeVirt CR."""
        try:
            if snapshot is not None:
                plugin.refresh(snapshot)
            if withheld is not None:
                plugin.withhold(withheld)
        except (RuntimeError, OSError) as e:
            message = f"the device plugin could not advertise the node's vGPUs: {e}"
            if self._plugin_failed != message:
                log.error("%s", message)
                self.cluster.event("DevicePluginFailed", message[:1000], EventType.WARNING)
                self._plugin_failed = message
            return
        self._plugin_failed = None

    def dra_channel(self, inner: PluginSink | None = None) -> _DraChannel:
        """The ``Ports.dra`` sink: ``inner`` (the DRA publisher, if any) gets the DRA
        vGPUs, and the status gets them joined with the device plugin's."""
        return _DraChannel(self, inner)

    def _observe(self, snapshot: NodeSnapshot) -> None:
        held: Mapping[str, str] | None = self.cluster.last_in_use
        self.cluster.observe(snapshot, held, in_use_known=held is not None)

    def _dra_refreshed(self, snapshot: NodeSnapshot) -> None:
        if self._advertised is not None and snapshot.gpus:
            self._observe(join(self._advertised, snapshot))


class _DraChannel:
    def __init__(self, sink: ClusterSink, inner: PluginSink | None) -> None:
        self._sink = sink
        self.inner = inner

    def refresh(self, snapshot: NodeSnapshot) -> None:
        if self.inner is not None:
            self.inner.refresh(snapshot)
        self._sink._dra_refreshed(snapshot)

    def withhold(self, keys: frozenset[str]) -> None:
        if self.inner is not None:
            self.inner.withhold(keys)
