"""A plan: the ordered, frozen list of changes that takes a node to its desired layout."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.pci import PciAddress
from vgpu_state.model.policy import Policy, Publish
from vgpu_state.model.snapshot import SysfsInterface

PLAN_FORMAT_VERSION = "1.3"


class ActionKind(StrEnum):
    DESTROY = "destroy"
    ENABLE_SRIOV = "enable-sriov"
    CREATE = "create"


class Action(Frozen):
    """One host change. ``before``/``after`` describe the object (``None`` = absent)."""

    kind: ActionKind
    address: str
    """``gpu[<pci>].vgpu[<uuid>]``, ``gpu[<pci>].vf[<pci>]`` or ``gpu[<pci>].sriov``."""
    gpu: PciAddress
    layout: SysfsInterface
    type_name: str | None = None
    type_id: int | None = None
    parent: PciAddress | None = None
    """mdev parent (PF or VF) or the VF that takes the type; ``None`` until SR-IOV is on."""
    uuid: str | None = None
    vf: PciAddress | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    reason: str = ""


class Blocked(Frozen):
    """A step the plan will not take, and why (a holder, a policy, or capacity)."""

    address: str
    gpu: PciAddress | Literal[""]
    """The GPU the step is on; empty for an item of the cluster (the KubeVirt CR)."""
    kind: ActionKind
    type_name: str | None = None
    holder: str | None = None
    code: BlockedReason = BlockedReason.OTHER
    """The reason as a stable code (a status condition's reason); ``reason`` is the prose."""
    reason: str


class ClusterAction(Frozen):
    """A change to a cluster object that follows the host's actions.

    Today: an entry of the KubeVirt CR's ``permittedHostDevices``, so VMs may
    request the vGPU types the node has after the apply.
    """

    op: Literal["add", "update", "remove"]
    address: str
    """``kubevirt[<namespace>/<name>].mediatedDevices[NVIDIA A2-4Q]`` (or ``pciHostDevices``)."""
    resource: str
    """The extended resource the entry permits."""
    entry: dict[str, Any] = Field(default_factory=dict)
    """The entry as it is written."""


class GpuPlan(Frozen):
    """Per-GPU header of a plan: what it is and how many vGPUs stay unchanged."""

    address: PciAddress
    index: int
    model: str | None
    layout: SysfsInterface
    managed: bool
    entry: str = ""
    kept: int = 0
    """vGPUs that stay unchanged (on an unmanaged GPU: the vGPUs left untouched)."""
    deferred: bool = False
    """True when creates wait for SR-IOV: their parents are chosen after a re-scan."""
    publish: Publish = Publish.DEVICE_PLUGIN
    """Through which channel the GPU's vGPUs are offered: device plugin or DRA."""


class Summary(Frozen):
    create: int = 0
    destroy: int = 0
    sriov: int = 0
    blocked: int = 0
    kept: int = 0
    cluster: int = 0
    """Cluster actions (KubeVirt CR entries to add, update or remove)."""


class Selection(Frozen):
    config: str
    source: str
    """How the config was chosen: ``label``, ``node-selector[N]``, ``default`` or ``flag``."""


class Plan(Frozen):
    format_version: str = PLAN_FORMAT_VERSION
    node: str
    selection: Selection
    policy: Policy
    snapshot_fingerprint: str
    gpus: tuple[GpuPlan, ...]
    actions: tuple[Action, ...]
    """In execution order: per GPU by address; within a GPU destroy, SR-IOV, create."""
    blocked: tuple[Blocked, ...]
    summary: Summary
    cluster_actions: tuple[ClusterAction, ...] = ()
    """After the host's actions: what changes in cluster objects (empty without a cluster)."""

    def gpu_actions(self, address: str) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.gpu == address)

    def gpu_blocked(self, address: str) -> tuple[Blocked, ...]:
        return tuple(b for b in self.blocked if b.gpu == address)

    @property
    def has_changes(self) -> bool:
        """True when there is a step to take. Blocked items are not changes: a node
        whose only differences are held vGPUs has nothing left to do (see
        :attr:`is_converged`)."""
        s = self.summary
        return s.create + s.destroy + s.sriov + s.cluster > 0

    def with_cluster(
        self, actions: tuple[ClusterAction, ...], blocked: tuple[Blocked, ...] = ()
    ) -> Plan:
        """This plan with the cluster actions (and cluster-level blocked items) added."""
        summary = self.summary.model_copy(
            update={"cluster": len(actions), "blocked": self.summary.blocked + len(blocked)}
        )
        return self.model_copy(
            update={
                "cluster_actions": actions,
                "blocked": (*self.blocked, *blocked),
                "summary": summary,
            }
        )

    @property
    def is_converged(self) -> bool:
        """True when the node already matches the layout: nothing to do, nothing blocked."""
        return not self.has_changes and not self.blocked
