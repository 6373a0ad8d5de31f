"""Assemble and run the agent: ports, triggers, worker, probes; exit 0 on SIGTERM.

Threads (DESIGN.md, "Agent concurrency"): the config-directory watcher, the
Node watch, the VGPUNodeState watch, the periodic resync and the holder watch
(while a layout switch waits for a holder) feed one :class:`WorkQueue`; one
worker reconciles; the probes and metrics have their own small HTTP server,
fed by the API server's probe; the device plugin's gRPC servers run in their
own pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpu_state.agent.allocatable import AllocatableMonitor
from vgpu_state.agent.configwatch import ConfigDirWatcher
from vgpu_state.agent.health import HealthServer, HealthState, parse_listen
from vgpu_state.agent.holderwatch import DEFAULT_HOLDER_POLL_SECONDS, HolderWatch
from vgpu_state.agent.metrics import AgentMetrics
from vgpu_state.agent.queue import WorkQueue
from vgpu_state.agent.reconciler import AgentMode, NodeReconciler, Operands, RolloutGate
from vgpu_state.agent.resync import DEFAULT_RESYNC_SECONDS, Resync
from vgpu_state.agent.triggers import Fire, Service, Stop, Trigger, TriggerSource
from vgpu_state.agent.worker import Worker
from vgpu_state.kube.apihealth import ApiServerHealth
from vgpu_state.reconcile import Ports, Settings
from vgpu_state.wellknown import METRICS_LISTEN

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"


@dataclass
class AgentParts:
    """What the agent runs with; the CLI builds it from flags, tests from fakes."""

    ports: Ports
    settings: Settings
    config_dir: Path
    """The directory watched for layout changes (the mounted ConfigMap's)."""
    config_file: Path | None = None
    """The layouts file (for the log); ``None``: ``config_dir``'s config.yaml."""
    mode: str = AgentMode.DEFAULT
    resync_seconds: float = DEFAULT_RESYNC_SECONDS
    # While a layout switch waits for a holder: how often the holders are re-read.
    holder_poll_seconds: float = DEFAULT_HOLDER_POLL_SECONDS
    listen: str | None = METRICS_LISTEN
    rollout: RolloutGate | None = None
    # Trigger sources beside the agent's own (the Node watch, the kubelet's restarts).
    trigger_sources: list[TriggerSource] = field(default_factory=list)
    # Started with the agent, never ask for a reconcile (the DRA plugin, the allocatable
    # monitor).
    services: list[Service] = field(default_factory=list)
    # Run after the worker's last reconcile, in order (the device plugin last).
    shutdown: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    # Checks the kubelet's allocatable against the device plugin (started by a watch).
    allocatable: AllocatableMonitor | None = None
    # The API server's health (its probe is one of ``services``): /readyz follows it.
    apiserver: ApiServerHealth | None = None
    # Told the mode of each reconcile (the node's status shows it).
    on_mode: Callable[[str], None] | None = None
    operands: Operands | None = None
    """``--gpu-operator``: the operator's sandbox operands, paused around each change."""


class Agent:
    """One node's agent. :meth:`run` blocks until SIGTERM/SIGINT or :meth:`stop`."""

    def __init__(self, parts: AgentParts, settle: float = 0.2) -> None:
        self.parts = parts
        self.metrics = AgentMetrics()
        self.health = HealthState(apiserver=parts.apiserver)
        if parts.apiserver is not None:
            parts.apiserver.on_change = self.metrics.apiserver_changed
        self.queue = WorkQueue(settle=settle)
        self.reconciler = NodeReconciler(
            parts.ports, parts.settings, self.metrics, parts.mode, parts.rollout,
            on_mode=parts.on_mode, operands=parts.operands,
        )  # fmt: skip
        self.worker = Worker(self.queue, self.reconciler, self.health)
        if parts.allocatable is not None:
            parts.allocatable.metrics = self.metrics
        self.http: HealthServer | None = None
        self._stops: list[Callable[[], None]] = []

    def trigger(self, trigger: Trigger) -> None:
        self.queue.trigger(trigger)

    def stop(self) -> None:
        self.worker.request_stop("stop requested")

    def run(self, install_signals: bool = True) -> int:
        parts = self.parts
        if install_signals:
            self.worker.install_signal_handlers()
        if parts.listen:
            host, port = parse_listen(parts.listen)
            self.http = HealthServer(self.health, self.metrics, host, port).start()
            log.info("serving /healthz, /readyz and /metrics on %s:%d", host, self.http.port)
        # Every trigger is registered here (agent/triggers.py names them all): the
        # agent's own sources, then those the assembly adds; the worker fires RETRY.
        watcher = ConfigDirWatcher(parts.config_dir, lambda: self.trigger(Trigger.CONFIG)).start()
        # The first reconcile reads the config after the watch is in place, so a change
        # made right after it is never missed (the resync would be the only catch).
        if not watcher.armed(2.0):
            log.warning("the config directory %s is not watched yet", parts.config_dir)
        self._stops.append(lambda: watcher.stop(5))
        resync = Resync(lambda: self.trigger(Trigger.RESYNC), parts.resync_seconds).start()
        self._stops.append(lambda: resync.stop(5))
        holders = HolderWatch(
            self.reconciler.holders_changed,
            lambda: self.trigger(Trigger.HOLDERS),
            parts.holder_poll_seconds,
        ).start()
        self._stops.append(lambda: holders.stop(5))
        for source in parts.trigger_sources:
            self._stops.append(source(self.trigger))
        for service in parts.services:
            self._stops.append(service())
        self.worker.on_shutdown("watchers", self._stop_watchers)
        for name, hook in parts.shutdown:
            self.worker.on_shutdown(name, hook)
        if self.http is not None:
            http = self.http
            self.worker.on_shutdown("probes", http.stop)
        # The first reconcile restores the layout (after a reboot, a crash, an upgrade).
        self.trigger(Trigger.START)
        log.info(
            "agent for node %s started (%s; config %s; resync every %.0f s)",
            parts.ports.cluster.node_name(),
            parts.mode,
            parts.config_file or parts.config_dir / CONFIG_FILE,
            parts.resync_seconds,
        )
        self.worker.run()
        log.info("agent stopped")
        return 0

    def _stop_watchers(self) -> None:
        for stop in reversed(self._stops):
            stop()
        self._stops.clear()


def node_watch_starter(
    api_client: Any, node: str, on_node: Callable[[Mapping[str, Any]], None] | None = None
) -> TriggerSource:
    """:attr:`Trigger.NODE`: the Node's labels changed, or its UID (the Node was deleted and
    registered again: its ``VGPUNodeState`` must name the new one as its owner).
    ``on_node`` sees every Node object (the allocatable monitor keeps the Node's
    allocatable from it; no reconcile)."""

    def start(fire: Fire) -> Stop:
        from vgpu_state.kube.node import STATE_LABEL
        from vgpu_state.kube.watch import NodeWatch

        first = [True]
        uid: list[str | None] = [None]

        def on_labels(labels: Any) -> None:
            if first[0]:  # the start reconcile already reads them
                first[0] = False
                return
            fire(Trigger.NODE)

        def seen(obj: Mapping[str, Any]) -> None:
            now = (obj.get("metadata") or {}).get("uid")
            if now and uid[0] is not None and now != uid[0]:
                log.warning("node %s was registered again (uid %s, was %s)", node, now, uid[0])
                fire(Trigger.NODE)
            uid[0] = now or uid[0]
            if on_node is not None:
                on_node(obj)

        watch = NodeWatch(
            api_client, node, on_labels, ignore=frozenset({STATE_LABEL}), on_node=seen
        ).start()
        return lambda: watch.stop(5)

    return start


def nodestate_watch_starter(api_client: Any, node: str) -> TriggerSource:
    """:attr:`Trigger.NODESTATE`: the node's ``VGPUNodeState`` was deleted; the reconcile
    writes it again."""

    def start(fire: Fire) -> Stop:
        from vgpu_state.kube.watch import NodeStateWatch

        watch = NodeStateWatch(api_client, node, lambda: fire(Trigger.NODESTATE)).start()
        return lambda: watch.stop(5)

    return start
