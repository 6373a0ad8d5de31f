"""The agent's Prometheus metrics, in a registry of its own (no process-global state)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "vgpu_state"


class AgentMetrics:
    """What an operator graphs and alerts on for one node's agent."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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

    def set_vgpus(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Replace the vGPU gauge with ``{(type, state): count}`` (types that vanished go)."""
        self.vgpus.clear()
        for (type_name, state), count in sorted(counts.items()):
            self.vgpus.labels(type=type_name, state=state).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
