"""``KubeCluster``: the :class:`~vgpu_state.ports.ClusterPort` on a Kubernetes cluster.

One object per node. It reads the Node's labels, asks the kubelet which vGPUs
pods hold, and writes what the node reports, to its own objects only: the
state label and annotations on the Node, the ``VGPUNodeState`` status and
Events. It reads the KubeVirt CR (the plan's cluster part and KubeVirt's
blockers) and never writes it: the cluster controller derives the CR's
permitted devices from every node's ``VGPUNodeState``.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Required, TypedDict

from vgpu_state.kube import events, kubevirt, nodestate
from vgpu_state.kube import node as node_api
from vgpu_state.kube.api import JsonObject, KubeApi
from vgpu_state.kube.errors import PodResourcesUnavailableError
from vgpu_state.kube.kubevirt import Blocker, KubeVirtPlan, KubeVirtRef
from vgpu_state.kube.nodestate import (
    ConditionKind,
    LastApply,
    SelectedConfig,
    VGPUNodeStateStatus,
)
from vgpu_state.kube.podresources.client import DEFAULT_SOCKET, list_holders
from vgpu_state.model.errors import BlockedReason, VgpuStateError
from vgpu_state.model.inuse import InUse
from vgpu_state.model.plan import ActionKind, Blocked, ClusterPart
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import (
    ConditionType,
    ConfigState,
    EventType,
    NodeEvent,
    NodeStatus,
    PendingSwitch,
)

log = logging.getLogger(__name__)

Clock = Callable[[], datetime.datetime]


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


_BLOCKED_CODES = {
    "KubeVirtMdevManagementActive": BlockedReason.KUBEVIRT_MDEV_MANAGEMENT,
    "KubeVirtManagedByHCO": BlockedReason.KUBEVIRT_MANAGED_BY_HCO,
    "KubeVirtAdvertisesVFs": BlockedReason.KUBEVIRT_ADVERTISES_VFS,
}


@dataclass(frozen=True)
class KubeVirtView:
    """What a write to the KubeVirt CR would do for this node, and what blocks vGPU changes."""

    ref: KubeVirtRef
    plan: KubeVirtPlan
    blockers: tuple[Blocker, ...]
    problems: tuple[str, ...] = ()


class StatusFields(TypedDict, total=False):
    """What a writer gives :meth:`KubeCluster.write_status` (its keyword arguments), for a
    writer that passes them on."""

    state: Required[ConfigState | None]
    selected: SelectedConfig | None
    conditions: list[tuple[ConditionKind, bool | None, str, str]] | None
    snapshot: NodeSnapshot | None
    last_apply: LastApply | None
    blocked: int | None
    switches: tuple[PendingSwitch, ...] | None


class KubeCluster:
    """The cluster as one node sees it. Every method talks to the API server when called.

    ``pod_resources``: the kubelet's pod-resources socket; ``None`` when the
    kubelet is not reachable from here (then :meth:`in_use` raises).
    ``kubevirt``: the KubeVirt CR to manage; ``None`` finds the single one.
    ``identity``: the reporting instance of its Events (default: the node name).
    """

    def __init__(
        self,
        api: KubeApi,
        node: str,
        *,
        pod_resources: str | None = DEFAULT_SOCKET,
        kubevirt_ref: KubeVirtRef | None = None,
        identity: str | None = None,
        event_namespace: str = events.EVENT_NAMESPACE,
        clock: Clock = _utcnow,
    ) -> None:
        self.api = api
        self.node = node
        self.pod_resources = pod_resources
        self._kubevirt_ref = kubevirt_ref
        self.identity = identity or node
        self.event_namespace = event_namespace
        self.clock = clock
        self.mode: nodestate.AgentModeName | None = None
        """The agent's mode, written into every status (``None``: not an agent's)."""
        self._node_obj: JsonObject | None = None
        self._snapshot: NodeSnapshot | None = None
        self._snapshot_at: datetime.datetime | None = None
        self._in_use: Mapping[str, str] = {}
        self._in_use_known = True
        self._selected: SelectedConfig | None = None
        self._last_apply: LastApply | None = None
        self._blocked = 0
        self._switches: tuple[PendingSwitch, ...] = ()

    @classmethod
    def connect(
        cls,
        node: str,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        in_cluster: bool | None = None,
        **options: object,
    ) -> KubeCluster:
        """Load credentials (``kubeconfig``, else in-cluster or the default file)."""
        api = KubeApi.connect(kubeconfig, context, in_cluster=in_cluster)
        return cls(api, node, **options)  # type: ignore[arg-type]

    def set_mode(self, mode: str) -> None:
        """The agent's mode from now on (``enforce`` or ``plan-only``), for the statuses."""
        if mode == "enforce":
            self.mode = "enforce"
        elif mode == "plan-only":
            self.mode = "plan-only"
        else:
            raise ValueError(f"mode must be enforce or plan-only, got {mode!r}")

    # ClusterPort ------------------------------------------------------------------
    def node_name(self) -> str:
        return self.node

    def labels(self) -> Mapping[str, str]:
        """The Node's labels now (read from the API server)."""
        self._node_obj = node_api.read_node(self.api, self.node)
        return node_api.labels_of(self._node_obj)

    def in_use(self) -> InUse:
        """vGPUs held by pods, from the kubelet.

        Raises :class:`PodResourcesUnavailableError` when the kubelet cannot say.
        """
        if self.pod_resources is None:
            raise PodResourcesUnavailableError("(none)", "no pod-resources socket configured")
        held = list_holders(self.pod_resources)
        return InUse({key: str(holder) for key, holder in held.items()})

    def report_status(self, status: NodeStatus) -> None:
        """The ``VGPUNodeState`` status built from ``status`` and the last :meth:`observe`d
        scan, then the state label.

        The label never says ``success`` for a node the cluster cannot see converged:
        when the status cannot be written the label is set to ``failed`` before the
        error is raised.
        """
        state = status.state
        conditions: list[tuple[ConditionKind, bool | None, str, str]] = []
        for kind in ConditionType:
            c = status.condition(kind)
            if c is not None:
                conditions.append((kind.value, c.status, c.reason, c.message))
        selected = self._selected
        if status.config is not None and status.selected_by:
            selected = SelectedConfig(
                name=status.config,
                source=selection_kind(status.selected_by),
                reason=status.selected_detail or "selected",
            )
        elif selected is None or selected.name != status.config:
            selected = SelectedConfig(
                name=status.config,
                source="none" if status.config is None else "explicit",
                reason="no config selected" if status.config is None else "selected",
            )
        try:
            self.write_status(
                state=state,
                selected=selected,
                conditions=conditions,
                snapshot=self._snapshot,
                switches=status.switches,
            )
        except VgpuStateError:
            if state is ConfigState.SUCCESS:
                try:
                    self.write_state_label(ConfigState.FAILED, status)
                except VgpuStateError as e:
                    log.warning("state label not written: %s", e)
            raise
        self.write_state_label(state, status)

    def write_state_label(self, state: ConfigState | None, status: NodeStatus) -> None:
        """The state label of a reported status (the agent adds its annotations);
        ``None`` removes it (no config selects the node)."""
        if state is None:
            self.clear_state()
        self.set_state(state)

    def clear_state(self) -> None:
        """Remove the state label, when the Node (as last read) carries one."""
        current = self._node_obj if self._node_obj is not None else None
        if current is not None and node_api.STATE_LABEL not in node_api.labels_of(current):
            return
        self._node_obj = self.api.patch(
            node_api.node_path(self.node),
            {"metadata": {"labels": {node_api.STATE_LABEL: None}}},
            "merge",
        )

    def emit_event(self, event: NodeEvent) -> None:
        self.event(event.reason, event.message, event.type)

    # what the reconcile tells us ------------------------------------------------
    def observe(
        self,
        snapshot: NodeSnapshot,
        in_use: Mapping[str, str] | None = None,
        *,
        in_use_known: bool = True,
        selected: SelectedConfig | None = None,
        last_apply: LastApply | None = None,
        blocked: int | None = None,
    ) -> None:
        """Remember the newest scan (and selection, apply, blocked count) for the status."""
        if snapshot is not self._snapshot:
            self._snapshot_at = self.clock()
        self._snapshot = snapshot
        self._in_use = dict(in_use or {})
        self._in_use_known = in_use_known
        if selected is not None:
            self._selected = selected
        if last_apply is not None:
            self._last_apply = last_apply
        if blocked is not None:
            self._blocked = blocked

    def observe_apply(self, last_apply: LastApply) -> None:
        """The last apply (plan id, start, end, result) for the next status."""
        self._last_apply = last_apply

    @property
    def last_snapshot(self) -> NodeSnapshot | None:
        """The scan the next status describes."""
        return self._snapshot

    # the Node ---------------------------------------------------------------------
    def node_uid(self) -> str | None:
        if self._node_obj is None:
            self._node_obj = node_api.read_node(self.api, self.node)
        uid = (self._node_obj.get("metadata") or {}).get("uid")
        return str(uid) if uid else None

    def set_state(
        self,
        state: ConfigState | None,
        *,
        applied_config: str | None = None,
        config_hash: str | None = None,
        plan_summary: str | None = None,
    ) -> None:
        written = node_api.write_state(
            self.api,
            self.node,
            state,
            applied_config=applied_config,
            config_hash=config_hash,
            plan_summary=plan_summary,
            current=self._node_obj,
        )
        if written is not None:
            self._node_obj = written

    # Events -----------------------------------------------------------------------
    def event(self, reason: str, message: str, type: EventType = EventType.NORMAL) -> None:
        events.record(
            self.api,
            self.node,
            reason,
            message,
            type,
            node_uid=self.node_uid(),
            instance=self.identity,
            namespace=self.event_namespace,
            now=self.clock(),
        )

    # VGPUNodeState -----------------------------------------------------------------
    def write_status(
        self,
        *,
        state: ConfigState | None,
        selected: SelectedConfig | None = None,
        conditions: list[tuple[ConditionKind, bool | None, str, str]] | None = None,
        snapshot: NodeSnapshot | None = None,
        last_apply: LastApply | None = None,
        blocked: int | None = None,
        switches: tuple[PendingSwitch, ...] | None = None,
    ) -> VGPUNodeStateStatus:
        """Write the node's ``VGPUNodeState`` status; conditions keep their transition times.

        ``switches``: the GPUs whose layout switch is pending; ``None`` keeps the last ones
        given (a failed reconcile does not know them, and the vGPUs stay withheld)."""
        if switches is not None:
            self._switches = switches
        snap = snapshot or self._snapshot
        scanned_at = self._snapshot_at if snap is self._snapshot else None
        if snap is not None and snap.node != self.node:
            # The scan of this node, whatever a simulator's spec calls it: readers refuse a
            # status whose scan names another node.
            snap = snap.model_copy(update={"node": self.node})
        found = nodestate.read(self.api, self.node)
        uid = self.node_uid()
        if found is not None and uid is not None and not nodestate.owned_by(found, uid):
            # Owned by another Node UID (the Node was deleted and registered again, or
            # the Node as last read is the old one): the owner is the Node as it is now.
            self._node_obj = node_api.read_node(self.api, self.node)
            uid = self.node_uid()
            if found is not None and uid is not None and not nodestate.owned_by(found, uid):
                found = nodestate.follow_node(self.api, found, uid)
                log.info("VGPUNodeState %s: owned by the Node's UID %s now", self.node, uid)
        previous = nodestate.status_of(found)
        gpus, capacity = (
            nodestate.layout_status(snap, self._in_use, self._switches) if snap else ((), ())
        )
        wanted = list(conditions or [])
        if snap is not None and not any(k == "Degraded" for k, *_ in wanted):
            problems = [*snap.problems, *(p for g in snap.gpus for p in g.problems)]
            wanted.append(
                (
                    "Degraded",
                    bool(problems),
                    "HostProblems" if problems else "HostHealthy",
                    "; ".join(problems[:5]),
                )
            )
        merged = nodestate.merge_conditions(
            previous.conditions if previous else (), wanted, 0, self.clock()
        )
        status = VGPUNodeStateStatus(
            state=state,
            mode=self.mode,
            selected_config=selected or self._selected,
            gpus=gpus,
            capacity=capacity,
            vgpu_count=sum(len(g.vgpus) for g in gpus),
            blocked_count=self._blocked if blocked is None else blocked,
            in_use_known=self._in_use_known,
            conditions=merged,
            last_apply=last_apply or self._last_apply,
            snapshot=(
                nodestate.reported_snapshot(
                    snap, scanned_at or self.clock(), previous.snapshot if previous else None
                )
                if snap is not None
                else None
            ),
        )
        if found is not None and previous is not None:
            generation = int((found.get("metadata") or {}).get("generation") or 0)
            if previous == status.model_copy(update={"observed_generation": generation}):
                return status  # nothing changed: no write, no watch event for anyone
        nodestate.write_status(self.api, self.node, status, uid)
        return status

    # KubeVirt CR -------------------------------------------------------------------
    def kubevirt_ref(self) -> KubeVirtRef:
        if self._kubevirt_ref is None:
            self._kubevirt_ref = kubevirt.find(self.api, None)
        return self._kubevirt_ref

    def kubevirt_view(
        self, snapshot: NodeSnapshot, labels: Mapping[str, str] | None = None
    ) -> KubeVirtView:
        """What the controller will change in the CR for ``snapshot``, and the CR's blockers."""
        ref = self.kubevirt_ref()
        cr = kubevirt.read(self.api, ref)
        desired = kubevirt.desired_entries(snapshot)
        return KubeVirtView(
            ref,
            kubevirt.plan_write(cr, desired.entries),
            kubevirt.blockers(cr, labels if labels is not None else self.labels(), snapshot),
            desired.problems,
        )

    def cluster_plan(
        self, expected: NodeSnapshot, labels: Mapping[str, str] | None = None
    ) -> ClusterPart:
        """What the cluster needs once the host looks like ``expected`` (reads only).

        The KubeVirt CR entries to add or update for the node's vGPU types, and
        the CR's settings that make vGPU changes unsafe, as blocked items.
        """
        view = self.kubevirt_view(expected, labels)
        blocked = tuple(
            Blocked(
                address=f"kubevirt[{view.ref}]",
                gpu="",
                kind=ActionKind.CREATE,
                code=_BLOCKED_CODES.get(b.reason, BlockedReason.OTHER),
                reason=b.message,
            )
            for b in view.blockers
        )
        actions = tuple(c.action(view.ref) for c in view.plan.changes)
        problems = (
            *view.problems,
            *(
                f"{r}: already permitted by an entry vgpu-state does not own; left as it is"
                for r in view.plan.foreign
            ),
        )
        return ClusterPart(actions=actions, blocked=blocked, problems=problems)


def selection_kind(
    source: str,
) -> Literal["label", "node-selector", "default", "explicit", "none"]:
    """The ``selectedConfig.source`` of a selection rule (``--default-config`` is a default)."""
    if source == "label":
        return "label"
    if source.startswith("node-selector"):
        return "node-selector"
    if source in ("default", "default-config"):
        return "default"
    return "explicit"
