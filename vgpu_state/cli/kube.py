"""``--kubeconfig`` / ``--in-cluster``: plan, apply and assert a node of a Kubernetes cluster.

The node's labels come from its Node object; which vGPUs are held comes from
the host's ``/proc`` (processes holding a VFIO device open) and from the
kubelet (pod-resources); the KubeVirt CR changes a plan implies are shown as
the plan's cluster actions and made after the host's actions; the outcome
goes to the state label, the node's ``VGPUNodeState`` and Events. The
Kubernetes client is loaded only when one of these flags is given.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from vgpu_state.cli.common import SessionArgs, parse_labels
from vgpu_state.model.errors import SelectionError
from vgpu_state.model.inuse import InUse
from vgpu_state.model.plan import Action, ClusterPart, Plan
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import ConfigState, NodeEvent, NodeStatus
from vgpu_state.model.timestamps import rfc3339
from vgpu_state.ports import HostPort, NoProcesses, ProcessHolders
from vgpu_state.reconcile import Mode, Ports

if TYPE_CHECKING:
    from vgpu_state.compose import OpenNode
    from vgpu_state.executor import ApplyResult, StepResult
    from vgpu_state.kube.cluster import KubeCluster
    from vgpu_state.reconcile.report import Reporter

Warn = Callable[[str], None]


@dataclass
class KubeNodeCluster:
    """The :class:`~vgpu_state.ports.ClusterPort` of a node in a Kubernetes cluster."""

    kube: KubeCluster
    host: HostPort
    require_kubelet: bool
    processes: ProcessHolders = field(default_factory=NoProcesses)
    """The node's processes holding vGPUs; :meth:`holders` reads them for the reconcile."""
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    extra_in_use: Mapping[str, str] = field(default_factory=dict)
    warn: Warn = field(default=lambda message: None)
    started: datetime.datetime | None = None
    in_use_known: bool = True
    snapshot: NodeSnapshot | None = None
    held: dict[str, str] = field(default_factory=dict)
    """The holders the last reconcile found, processes and pods (the status reports them)."""
    process_held: Mapping[str, str] = field(default_factory=dict)
    plan: Plan | None = None
    final: NodeSnapshot | None = None
    """The fresh scan after an apply (what the status describes)."""

    def node_name(self) -> str:
        return self.kube.node_name()

    def labels(self) -> Mapping[str, str]:
        self.started = self.kube.clock()
        return {**self.kube.labels(), **self.extra_labels}

    def holders(self, snapshot: NodeSnapshot) -> tuple[Mapping[str, str], tuple[str, ...]]:
        """The reconcile's ``processes`` port: held by a process on the host (``/proc``)."""
        self.snapshot = snapshot
        found, warnings = self.processes.holders(snapshot)
        self.process_held = dict(found)
        return found, warnings

    def in_use(self) -> InUse:
        """Held by a pod (the kubelet says which), or given by flags; the status also
        counts what :meth:`holders` found."""
        from vgpu_state.kube.errors import PodResourcesUnavailableError

        held = dict(self.process_held)
        if self.kube.pod_resources is not None:
            try:
                held.update(self.kube.in_use())
            except PodResourcesUnavailableError as e:
                if self.require_kubelet:
                    raise
                self.in_use_known = False
                self.warn(f"{e}. The plan protects only the vGPUs the host shows in use")
        held.update(self.extra_in_use)
        self.held = dict(held)
        return InUse(held)

    def report_status(self, status: NodeStatus) -> None:
        from vgpu_state.kube.cluster import selection_kind
        from vgpu_state.kube.nodestate import LastApply, SelectedConfig

        now = self.kube.clock()
        plan = self.plan
        if plan is not None:
            result: Literal["success", "failed", "blocked", "no-changes"] = "success"
            if status.state is ConfigState.FAILED:
                result = "failed"
            elif plan.blocked:
                result = "blocked"
            elif not plan.has_changes:
                result = "no-changes"
            self.kube.observe_apply(
                LastApply(
                    plan_id=plan.snapshot_fingerprint,
                    start=rfc3339(self.started or now),
                    end=rfc3339(now),
                    result=result,
                )
            )
            self.kube.observe(
                self.final or self.kube.last_snapshot or self.snapshot or NodeSnapshot(),
                self.held,
                selected=SelectedConfig(
                    name=plan.selection.config,
                    source=selection_kind(plan.selection.source),
                    reason=f"selected by {plan.selection.source}",
                ),
                blocked=len(plan.blocked),
                in_use_known=self.in_use_known,
            )
        self.kube.report_status(status)

    def emit_event(self, event: NodeEvent) -> None:
        self.kube.emit_event(event)

    # the plan's cluster part ---------------------------------------------------------
    def cluster_plan(self, expected: NodeSnapshot, labels: Mapping[str, str]) -> ClusterPart:
        """The KubeVirt CR changes ``expected`` implies, and the CR's blockers (reads only)."""
        return self.kube.cluster_plan(expected, labels)

    def reporter(self, inner: Reporter) -> Reporter:
        return _ClusterReporter(self, inner)


class _ClusterReporter:
    """Remembers the plan (the status reports its id and result); the rest goes to ``inner``."""

    def __init__(self, cluster: KubeNodeCluster, inner: Reporter) -> None:
        self.cluster = cluster
        self.inner = inner

    def warning(self, message: str) -> None:
        self.inner.warning(message)

    def planned(self, plan: Plan) -> None:
        self.cluster.plan = plan
        self.inner.planned(plan)

    def applying(self, plan: Plan) -> None:
        self.inner.applying(plan)

    def step(self, action: Action, result: StepResult) -> None:
        self.inner.step(action, result)

    def applied(self, plan: Plan, result: ApplyResult) -> None:
        self.inner.applied(plan, result)


class FinalScan:
    """:class:`~vgpu_state.ports.DevicePluginSink` that keeps the reconcile's fresh scan
    after the host's actions: the status that follows describes it."""

    def __init__(self, cluster: KubeNodeCluster) -> None:
        self.cluster = cluster

    def refresh(self, snapshot: NodeSnapshot) -> None:
        self.cluster.final = snapshot

    def withhold(self, keys: frozenset[str]) -> None:
        return None  # no device plugin here: the node's agent withholds them


def kube_ports(
    base: Ports,
    target: OpenNode,
    args: SessionArgs,
    flagged: Mapping[str, str],
    mode: Mode,
    warn: Warn,
) -> tuple[Ports, KubeNodeCluster]:
    """``base`` with the cluster port of the Node ``--node`` (default: the simulated node's).

    ``flagged``: the holders given by ``--in-use``/``--in-use-file``, parsed once.
    """
    from vgpu_state.kube.cluster import KubeCluster
    from vgpu_state.kube.kubevirt import KubeVirtRef
    from vgpu_state.kube.podresources.client import DEFAULT_SOCKET

    simulated = args.sim_spec is not None
    node = args.node or target.cluster.node_name()
    try:
        ref = KubeVirtRef.parse(args.kubevirt) if args.kubevirt else None
    except ValueError as e:
        raise SelectionError(f"--kubevirt {e}") from None
    kube = KubeCluster.connect(
        node,
        args.kubeconfig,
        context=args.context,
        in_cluster=True if args.in_cluster else None,
        pod_resources=args.pod_resources or (None if simulated else DEFAULT_SOCKET),
        kubevirt_ref=ref,
    )
    held = {**target.cluster.in_use(), **flagged}
    cluster = KubeNodeCluster(
        kube,
        target.host,
        require_kubelet=mode is Mode.APPLY,
        processes=base.processes,
        extra_labels=parse_labels(args.labels),
        extra_in_use=held,
        warn=warn,
    )
    sink = FinalScan(cluster) if mode is Mode.APPLY else base.device_plugin
    ports = Ports(target.host, cluster, base.config, sink, processes=cluster, kubevirt=cluster)
    return ports, cluster
