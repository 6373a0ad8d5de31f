"""Build the agent from its command-line flags: the host, the cluster, the triggers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vgpu_state.agent.allocatable import AllocatableMonitor
from vgpu_state.agent.cluster import AgentCluster, ClusterSink, InUseSource, in_use_from_file
from vgpu_state.agent.holderwatch import DEFAULT_HOLDER_POLL_SECONDS
from vgpu_state.agent.reconciler import AgentMode
from vgpu_state.agent.rollout import LeaseRolloutGate
from vgpu_state.agent.run import (
    Agent,
    AgentParts,
    node_watch_starter,
    nodestate_watch_starter,
)
from vgpu_state.agent.triggers import Fire, Service, Stop, Trigger, TriggerSource
from vgpu_state.catalog import default_catalog
from vgpu_state.compose import NodeSettings, OpenNode, open_node
from vgpu_state.config import FileConfigSource
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.apihealth import ApiServerHealth, ApiServerProbe
from vgpu_state.kube.gpuoperator import SandboxOperands
from vgpu_state.kube.kubevirt import KubeVirtRef
from vgpu_state.kube.rollout import RolloutSlots
from vgpu_state.model.allocatable import DEFAULT_GRACE
from vgpu_state.ports import (
    ClusterPort,
    DevicePluginSink,
    NoClusterPlan,
)
from vgpu_state.reconcile import Ports, Settings
from vgpu_state.statefiles import StateDir, WithheldFile, WithheldRecorder
from vgpu_state.wellknown import (
    CDI_DIR,
    KUBELET_DEVICE_PLUGIN_DIR,
    KUBELET_PLUGIN_REGISTRY_DIR,
    KUBELET_PLUGINS_DIR,
    KUBELET_POD_RESOURCES_SOCKET,
    METRICS_LISTEN,
    STATE_DIR,
)

if TYPE_CHECKING:
    from vgpu_state.deviceplugin import DevicePluginManager

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentFlags:
    node: str
    config_file: Path
    """The layouts file (the mounted ConfigMap's); its directory is watched."""
    default_config: str | None = None
    """The config of an unlabelled node nothing else selects (``--default-config``)."""
    strict: bool = False
    """An entry that selects no GPU of the node is an error (``--strict``)."""
    mode: str = AgentMode.DEFAULT
    resync: float = 60.0
    holder_poll: float = DEFAULT_HOLDER_POLL_SECONDS
    listen: str = METRICS_LISTEN
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str = "vgpu-state"
    sysfs_root: str = "/sys"
    sim_spec: str | None = None
    state_dir: Path | None = None
    """``--state-dir``; ``None``: /var/lib/vgpu-state, or with --sim beside the spec."""
    in_use_file: str | None = None
    pod_resources: str = KUBELET_POD_RESOURCES_SOCKET
    kubevirt: str | None = None
    manage_kubevirt: bool = True
    lease_seconds: int = 120
    dra: bool = False
    dra_plugins_dir: Path = Path(KUBELET_PLUGINS_DIR)
    dra_registry_dir: Path = Path(KUBELET_PLUGIN_REGISTRY_DIR)
    cdi_dir: Path = Path(CDI_DIR)
    device_plugin: bool = True
    device_plugin_dir: str = KUBELET_DEVICE_PLUGIN_DIR
    allocatable_grace: float = DEFAULT_GRACE
    proc_root: str | None = None
    """The host's ``/proc`` (``/host/proc`` in the DaemonSet); ``None``: ``/proc``, or a
    simulated node's own."""
    sriov_manage: tuple[str, ...] | None = None
    """The sriov-manage command line (see ``Settings.sriov_manage``)."""
    nvidia_smi: tuple[str, ...] | None = None
    """The nvidia-smi command line (see ``Settings.nvidia_smi``)."""
    gpu_operator: bool = False
    """``--gpu-operator``: under NVIDIA's GPU Operator, whose sandbox device plugin
    advertises the vGPUs: no device plugin of ours, and the operator's sandbox operands
    are paused around every change (:mod:`vgpu_state.kube.gpuoperator`)."""
    gpu_operator_namespace: str = "gpu-operator"
    operand_timeout: float = 120.0
    """Seconds the operands' pods get to leave the node before a change."""

    @property
    def state(self) -> StateDir:
        """The node's state files: in ``--state-dir``, else beside a simulated node's spec
        (as ``vgpu-state apply --sim`` keeps them), else in /var/lib/vgpu-state."""
        if self.state_dir is not None:
            return StateDir.at(self.state_dir)
        if self.sim_spec:
            return StateDir.beside(self.sim_spec)
        return StateDir.at(STATE_DIR)


def build(flags: AgentFlags) -> Agent:
    """Connect to the cluster and assemble an :class:`Agent` (nothing runs yet)."""
    state = flags.state
    state.journal.parent.mkdir(parents=True, exist_ok=True)
    # The host flags (--proc-root, --sim, --sysfs-root) are checked before the cluster
    # is asked anything.
    node = open_agent_node(flags)
    api = KubeApi.connect(flags.kubeconfig, flags.context)
    in_use: InUseSource | None = node.held if node.sim is not None else None
    if flags.in_use_file:
        in_use = in_use_from_file(flags.in_use_file)
    cluster = AgentCluster(
        api,
        flags.node,
        pod_resources=flags.pod_resources,
        kubevirt_ref=KubeVirtRef.parse(flags.kubevirt) if flags.kubevirt else None,
        in_use_source=in_use,
        processes=node.processes,
    )
    port_cluster: ClusterPort = cluster
    dra_sink: DevicePluginSink | None = None
    plugin = _device_plugin(flags) if flags.device_plugin and not flags.gpu_operator else None
    monitor = None
    if plugin is not None:
        monitor = allocatable_monitor(cluster, plugin, flags.allocatable_grace)
    trigger_sources: list[TriggerSource] = [
        node_watch_starter(
            api.client, flags.node, on_node=monitor.node_seen if monitor is not None else None
        ),
        nodestate_watch_starter(api.client, flags.node),
    ]
    # /readyz fails while the API server or its storage does not answer.
    apiserver = ApiServerHealth(api.server)
    services: list[Service] = [ApiServerProbe(api, apiserver).service()]
    if flags.dra:
        from vgpu_state.agent.dra import ClaimsHoldVgpus, DraNode
        from vgpu_state.dra.prepare import DraPaths
        from vgpu_state.dra.slices import DRIVER

        paths = DraPaths(
            plugin_dir=flags.dra_plugins_dir / DRIVER,
            registry_dir=flags.dra_registry_dir,
            cdi_dir=flags.cdi_dir,
            sysfs_root=Path(flags.sysfs_root),
        )
        dra_node = DraNode(api, flags.node, paths, catalog=default_catalog())
        port_cluster = ClaimsHoldVgpus(cluster, dra_node)
        dra_sink = dra_node
        services.append(dra_node.service())
    shutdown: list[tuple[str, Callable[[], None]]] = []
    if plugin is not None:
        trigger_sources.append(_kubelet_restarts(plugin))
        # Last of all: every resource advertises an empty list, then the servers stop.
        shutdown.append(("device plugin", plugin.stop))
    sink = ClusterSink(cluster, plugin)
    dra: DevicePluginSink = sink.dra_channel(dra_sink)
    catalog = default_catalog()
    settings = Settings(
        catalog=catalog,
        journal_path=state.journal,
        driver_types_path=state.driver_types,
        lock_path=state.lock,
        command=f"vgpu-state agent --node {flags.node}",
        sriov_manage=flags.sriov_manage,
        nvidia_smi=flags.nvidia_smi,
        default_config=flags.default_config,
        strict=flags.strict,
    )
    ports = Ports(
        node.host,
        port_cluster,
        FileConfigSource(flags.config_file, catalog),
        sink,
        dra,
        processes=cluster,
        kubevirt=cluster if flags.manage_kubevirt else NoClusterPlan(),
        # What the device plugin and DRA withhold, for `vgpu-state scan` on the node.
        withheld=WithheldRecorder(
            WithheldFile(state.withheld), lambda message: log.warning("%s", message)
        ),
    )
    slots = RolloutSlots(api, flags.namespace, flags.node, lease_seconds=flags.lease_seconds)
    if node.sim is not None:

        def save_and_close() -> None:
            node.save()
            node.close()

        shutdown.insert(0, ("simulated node", save_and_close))
    parts = AgentParts(
        ports=ports,
        settings=settings,
        config_dir=flags.config_file.parent,
        config_file=flags.config_file,
        mode=flags.mode,
        resync_seconds=flags.resync,
        holder_poll_seconds=flags.holder_poll,
        listen=flags.listen or None,
        rollout=LeaseRolloutGate(slots),
        trigger_sources=trigger_sources,
        services=[*services, *([monitor.service()] if monitor is not None else [])],
        shutdown=shutdown,
        allocatable=monitor,
        apiserver=apiserver,
        on_mode=cluster.set_mode,
        operands=_operands(api, flags) if flags.gpu_operator else None,
    )
    return Agent(parts)


def _operands(api: KubeApi, flags: AgentFlags) -> SandboxOperands:
    return SandboxOperands(
        api, flags.node, flags.gpu_operator_namespace, timeout=flags.operand_timeout
    )


def allocatable_monitor(
    cluster: AgentCluster, plugin: DevicePluginManager, grace: float = DEFAULT_GRACE
) -> AllocatableMonitor:
    """Is the kubelet offering what ``plugin`` advertises? A monitor wired to both: the
    plugin wakes it, its condition goes into every status ``cluster`` writes, and it
    rewrites the status and records Events through ``cluster``. Feed it the Node watch
    (``on_node=monitor.node_seen``) and start it with the agent (``monitor.service()``)."""
    monitor = AllocatableMonitor(plugin, grace=grace)
    monitor.publish = cluster.rewrite_status
    monitor.event = cluster.event
    plugin.on_change = monitor.wake
    cluster.allocatable = monitor
    return monitor


def _device_plugin(flags: AgentFlags) -> DevicePluginManager:
    from vgpu_state.deviceplugin import DevicePluginManager

    if flags.sim_spec:
        # A simulated node changes only through this agent's applies, and every
        # reconcile refreshes the plugin from a fresh scan; there is no sysfs to probe.
        return DevicePluginManager(flags.device_plugin_dir, present=lambda device: True)
    return DevicePluginManager(flags.device_plugin_dir)


def _kubelet_restarts(plugin: DevicePluginManager) -> TriggerSource:
    """:attr:`Trigger.KUBELET`: the kubelet restarted (a new ``kubelet.sock``); re-read
    the node."""

    def start(fire: Fire) -> Stop:
        plugin.on_kubelet_restart = lambda: fire(Trigger.KUBELET)

        def stop() -> None:
            plugin.on_kubelet_restart = None

        return stop

    return start


def open_agent_node(flags: AgentFlags) -> OpenNode:
    """The node the agent keeps (``--sim`` or ``--sysfs-root``), with the driver's type
    lists in ``--state-dir``; a simulated node's spec follows every apply."""
    return open_node(
        NodeSettings(
            default_catalog(),
            sim_spec=flags.sim_spec,
            sysfs_root=None if flags.sim_spec else flags.sysfs_root,
            name=flags.node,
            driver_types=flags.state.driver_types,
            record=True,
            sriov_manage=flags.sriov_manage,
            nvidia_smi=flags.nvidia_smi,
            proc_root=flags.proc_root,
            autosave=True,
            spec_follows=True,
        ),
        lambda message: log.warning("%s", message),
    )
