"""The agent's Prometheus metrics, in a registry of its own (no process-global state),
written by :mod:`vgpu_state.agent.promtext`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vgpu_state.agent.promtext import Counter, Gauge, Histogram, Registry
from vgpu_state.agent.triggers import Trigger
from vgpu_state.kube.apihealth import OUTAGES_METRIC, REACHABLE_METRIC

PREFIX = "vgpu_state"


class AgentMetrics:
    """What an operator graphs and alerts on for one node's agent."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.reconcile_duration = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Time of one reconcile (read, plan, apply, report).",
            ["mode", "result"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.actions = Counter(
            f"{PREFIX}_actions",
            "Plan actions taken, by kind (create, destroy, sriov, ...) and result.",
            ["kind", "result"],
            registry=self.registry,
        )
        self.vgpus = Gauge(
            f"{PREFIX}_vgpus",
            "vGPUs on the node after the last reconcile, by type and state (free, in_use).",
            ["type", "state"],
            registry=self.registry,
        )
        self.blocked_items = Gauge(
            f"{PREFIX}_blocked_items",
            "Plan items the last reconcile could not carry out (held vGPU, no capacity, ...).",
            registry=self.registry,
        )
        self.last_success = Gauge(
            f"{PREFIX}_last_successful_reconcile_timestamp_seconds",
            "Unix time of the last reconcile that left the node matching its config.",
            registry=self.registry,
        )
        self.config_generation = Gauge(
            f"{PREFIX}_config_generation",
            "Times the config document changed since the agent started (1 = first load).",
            registry=self.registry,
        )
        self.reconciles = Counter(
            f"{PREFIX}_reconciles",
            "Reconciles run, by result (success, blocked, failed, degraded).",
            ["result"],
            registry=self.registry,
        )
        self.triggers = Counter(
            f"{PREFIX}_triggers",
            "Events that asked for a reconcile, by source, before coalescing.",
            ["source"],
            registry=self.registry,
        )
        for trigger in Trigger:  # every source has its series from the start
            self.triggers.labels(source=trigger.value)

        self.allocatable_mismatched = Gauge(
            f"{PREFIX}_kubelet_allocatable_mismatched_resources",
            "Device-plugin resources whose allocatable on the Node differs from what the "
            "plugin advertises, past the grace period (0 while the condition is True or Unknown).",
            registry=self.registry,
        )
        self.plugin_reregistrations = Counter(
            f"{PREFIX}_device_plugin_reregistrations",
            "Times the agent registered a resource with the kubelet again because the "
            "kubelet offered none of its advertised devices.",
            ["resource"],
            registry=self.registry,
        )
        self.node_state = Gauge(
            f"{PREFIX}_node_state",
            "1 for the state the agent last reported for its node (its state label: "
            "pending, success or failed) and the mode it ran in; no series while no "
            "config selects the node.",
            ["state", "mode"],
            registry=self.registry,
        )
        self.kubevirt_entries_missing = Gauge(
            f"{PREFIX}_kubevirt_cr_entries_missing",
            "KubeVirt CR permittedHostDevices entries the node's vGPU types need that the CR "
            "lacks or has out of date, as the last reconcile read the CR (enforce mode; 0 in "
            "plan-only mode). The cluster controller writes them.",
            registry=self.registry,
        )
        self.switch_deferred_since = Gauge(
            f"{PREFIX}_layout_switch_deferred_since_timestamp_seconds",
            "Unix time since which the agent has seen a GPU's layout switch deferred "
            "(held vGPUs in its way), by GPU; no series for a GPU whose switch is not deferred.",
            ["gpu"],
            registry=self.registry,
        )

        self.apiserver_reachable = Gauge(*REACHABLE_METRIC, registry=self.registry)
        self.apiserver_outages = Counter(*OUTAGES_METRIC, registry=self.registry)

    def apiserver_changed(self, reachable: bool) -> None:
        """The API server's readiness flipped (``ApiServerHealth.on_change``)."""
        self.apiserver_reachable.set(1 if reachable else 0)
        if not reachable:
            self.apiserver_outages.inc()

    def set_vgpus(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Replace the vGPU gauge with ``{(type, state): count}`` (types that vanished go)."""
        self.vgpus.clear()
        for (type_name, state), count in sorted(counts.items()):
            self.vgpus.labels(type=type_name, state=state).set(count)

    def set_node_state(self, state: str | None, mode: str) -> None:
        """Record the node's reported state (``None``: no state, the node is left alone)."""
        self.node_state.clear()
        if state is not None:
            self.node_state.labels(state=state, mode=mode).set(1)

    def set_switches_deferred(self, gpus: Iterable[str], now: float) -> None:
        """Keep the since-time of GPUs still deferred, start it at ``now`` for newly
        deferred ones, and drop the series of the GPUs no longer deferred."""
        wanted = set(gpus)
        known = {key[0]: value for key, value in self.switch_deferred_since.values().items()}
        for gpu in known.keys() - wanted:
            self.switch_deferred_since.remove(gpu)
        for gpu in sorted(wanted - known.keys()):
            self.switch_deferred_since.labels(gpu=gpu).set(now)

    def render(self) -> bytes:
        return self.registry.render()
