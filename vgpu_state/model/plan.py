"""A plan: the ordered, frozen list of changes that takes a node to its desired layout."""

from __future__ import annotations

import functools
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from vgpu_state.model.desired import SkippedEntry
from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.pci import PciAddress
from vgpu_state.model.policy import Policy, Publish
from vgpu_state.model.snapshot import SysfsInterface

PLAN_FORMAT_VERSION = "1.6"

EXPERIMENTAL = "experimental: inferred, not verified on hardware"
"""What a plan (and the docs) say of a rule no driver confirmed (:attr:`Plan.experimental`)."""


class ActionKind(StrEnum):
    DESTROY = "destroy"
    ENABLE_SRIOV = "enable-sriov"
    CREATE = "create"
    DISABLE_SRIOV = "disable-sriov"
    """Turn a GPU's virtual functions off (before its MIG mode changes)."""
    SET_MIG_MODE = "set-mig-mode"
    CREATE_GPU_INSTANCE = "create-gpu-instance"
    DESTROY_GPU_INSTANCE = "destroy-gpu-instance"
    SET_HETEROGENEOUS_MODE = "set-heterogeneous-mode"
    """The driver's mixed-size (heterogeneous) vGPU mode on or off."""


MODE_KINDS = frozenset(
    {
        ActionKind.DISABLE_SRIOV,
        ActionKind.SET_MIG_MODE,
        ActionKind.CREATE_GPU_INSTANCE,
        ActionKind.DESTROY_GPU_INSTANCE,
        ActionKind.SET_HETEROGENEOUS_MODE,
    }
)
"""The steps that change a GPU's mode or its MIG GPU instances (not a vGPU)."""

STEP_ORDER = {
    ActionKind.DESTROY: 0,
    ActionKind.DISABLE_SRIOV: 1,
    ActionKind.SET_MIG_MODE: 2,
    ActionKind.ENABLE_SRIOV: 3,
    ActionKind.DESTROY_GPU_INSTANCE: 4,
    ActionKind.CREATE_GPU_INSTANCE: 5,
    ActionKind.SET_HETEROGENEOUS_MODE: 6,
    ActionKind.CREATE: 7,
}
"""The order of a GPU's steps by kind (stable within a kind)."""


class Disruption(StrEnum):
    """How far a step reaches beyond what it changes (the plan's is its worst step's).

    * ``none``: nothing that exists goes away (creates; enabling the virtual
      functions of a GPU whose VFs are off, which holds no vGPU then);
    * ``device``: vGPUs are destroyed, one by one; the other vGPUs of the GPU stay;
    * ``gpu``: a GPU's virtual functions are disabled or its MIG mode changes (a
      GPU reset). vgpu-state takes such a step only on a GPU that holds no vGPU
      by then (the plan destroys its vGPUs first) and whose vGPUs no pod, VM or
      process holds; otherwise the mode change is a deferred switch. No GPU is
      rebound.

    No step restarts a node service (kubelet, driver daemons), so there is no
    node-wide level.
    """

    NONE = "none"
    DEVICE = "device"
    GPU = "gpu"

    @property
    def rank(self) -> int:
        return _DISRUPTION_RANK[self]


_DISRUPTION_RANK = {Disruption.NONE: 0, Disruption.DEVICE: 1, Disruption.GPU: 2}


_KIND_DISRUPTION = {
    ActionKind.DESTROY: Disruption.DEVICE,
    ActionKind.DESTROY_GPU_INSTANCE: Disruption.DEVICE,
    ActionKind.DISABLE_SRIOV: Disruption.GPU,
    ActionKind.SET_MIG_MODE: Disruption.GPU,
}


def action_disruption(kind: ActionKind) -> Disruption:
    """The one classification of a step: destroying a vGPU or a GPU instance is
    ``device``, disabling SR-IOV or changing MIG mode ``gpu``, anything else ``none``."""
    return _KIND_DISRUPTION.get(kind, Disruption.NONE)


class Action(Frozen):
    """One host change. ``before``/``after`` describe the object (``None`` = absent)."""

    @model_validator(mode="before")
    @classmethod
    def _classify(cls, data: Any) -> Any:
        """Fill ``disruption`` from ``kind`` (plans saved before it existed lack it)."""
        if isinstance(data, dict) and "disruption" not in data and "kind" in data:
            try:
                kind = ActionKind(data["kind"])
            except ValueError:
                return data
            return {**data, "disruption": action_disruption(kind).value}
        return data

    @field_validator("disruption")
    @classmethod
    def _check_disruption(cls, value: Disruption, info: ValidationInfo) -> Disruption:
        kind = info.data.get("kind")
        if isinstance(kind, ActionKind) and value is not action_disruption(kind):
            raise ValueError(
                f"disruption {value.value!r} is not the level of a {kind.value} step "
                f"({action_disruption(kind).value})"
            )
        return value

    kind: ActionKind
    address: str
    """``gpu[<pci>].vgpu[<uuid>]``, ``gpu[<pci>].vf[<pci>]``, ``gpu[<pci>].sriov``,
    ``gpu[<pci>].mig-mode``, ``gpu[<pci>].heterogeneous-mode``, ``gpu[<pci>].gi[<id>]``
    or ``gpu[<pci>].gi[new <N>]``."""
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
    disruption: Disruption = Disruption.NONE
    """What the step takes away (:func:`action_disruption` of ``kind``)."""
    profile: str | None = Field(default=None, max_length=32, exclude_if=lambda v: v is None)
    """A GPU instance step: the GPU instance profile (``1g.24gb``)."""
    gi_id: int | None = Field(default=None, ge=0, le=1023, exclude_if=lambda v: v is None)
    """``destroy-gpu-instance``: the id of the GPU instance."""
    enabled: bool | None = Field(default=None, exclude_if=lambda v: v is None)
    """``set-mig-mode``, ``set-heterogeneous-mode``: the mode after the step."""

    @property
    def type_label(self) -> str:
        """The type's short name, or ``type id N`` when the name is not known."""
        return self.type_name or f"type id {self.type_id}"

    @property
    def vgpu_key(self) -> str:
        """The vGPU the step is about as in-use lists and snapshots name it
        (:attr:`Vgpu.key <vgpu_state.model.snapshot.Vgpu.key>`): its VF or mdev UUID."""
        return self.vf or self.uuid or ""


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


class Move(Frozen):
    """A VM that ``in-use: evacuate`` moves off a GPU so the GPU's switch can run."""

    holder: str
    """The holder as the in-use list names it (``pod ns/virt-launcher-x (VM ns/vm)``)."""
    vm: str | None = None
    """``namespace/name`` of the VM, when the holder is a KubeVirt virt-launcher pod;
    ``None`` when it is not a VM (nothing can move it)."""
    vgpu: str
    """The key of the held vGPU (mdev UUID or VF address)."""
    type_name: str | None = None
    resource: str | None = None
    """The extended resource the vGPU is offered as (what a target node needs free)."""


class DeferredSwitch(Frozen):
    """A layout change a GPU cannot make yet, so it keeps its layout.

    vGPUs that stay (held by a pod, VM or process; kept by ``prune: false``; of a
    type that cannot be read) block every create the new layout needs, so
    destroying the GPU's free vGPUs would buy nothing: they are kept too, until
    what is in the way goes.
    """

    waits_for: tuple[str, ...] = ()
    """The holders of the vGPUs in the way, sorted; empty when none of them is held."""
    in_the_way: tuple[str, ...] = ()
    """The keys (mdev UUID or VF address) of the vGPUs that stay and block the creates."""
    kept: int = 0
    """Free vGPUs kept instead of destroyed."""
    creates: int = 0
    """vGPUs the layout wants created on the GPU once the switch can run."""
    moves: tuple[Move, ...] = Field(default=(), exclude_if=lambda v: not v)
    """Under ``in-use: evacuate``: the holders in the way, to be moved by the controller."""


class ClusterPart(Frozen):
    """The cluster's part of a plan: what follows the host's actions, and what blocks them.

    ``blocked`` items have an empty ``gpu``: a setting of a cluster object (the
    KubeVirt CR managing mdevs itself) that makes any vGPU change on the node
    unsafe. ``problems`` are worth a warning and stop nothing.
    """

    actions: tuple[ClusterAction, ...] = ()
    blocked: tuple[Blocked, ...] = ()
    problems: tuple[str, ...] = ()


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
    deferred_switch: DeferredSwitch | None = None
    """Set when the GPU's layout change waits for what is in its way (nothing is
    destroyed on the GPU meanwhile)."""
    withheld: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)
    """Under ``in-use: evacuate``: keys of the GPU's free vGPUs of departing types that
    are not offered (device plugin, DRA) while its switch is pending, sorted."""
    experimental: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)
    """The inferred rules the GPU's steps rely on (MIG GPU instance geometry, mixed-size
    placement): experimental, not verified on hardware; the driver's answers win."""
    deferred_kept: tuple[tuple[str, int], ...] = Field(default=(), exclude_if=lambda v: not v)
    """With creates that wait for a mode, SR-IOV or GPU instance step (``deferred``):
    the vGPUs per type that stay on the GPU, which the re-plan after the re-scan keeps."""


class Summary(Frozen):
    create: int = 0
    destroy: int = 0
    sriov: int = 0
    blocked: int = 0
    kept: int = 0
    cluster: int = 0
    """Cluster actions (KubeVirt CR entries to add, update or remove)."""
    switches_deferred: int = 0
    """GPUs whose layout change is deferred (:attr:`GpuPlan.deferred_switch`)."""
    sriov_disable: int = Field(default=0, exclude_if=lambda v: not v)
    """GPUs whose virtual functions are turned off (before their MIG mode changes)."""
    modes: int = Field(default=0, exclude_if=lambda v: not v)
    """Mode changes: MIG mode and heterogeneous (mixed-size) mode steps."""
    gi_create: int = Field(default=0, exclude_if=lambda v: not v)
    """MIG GPU instances to create."""
    gi_destroy: int = Field(default=0, exclude_if=lambda v: not v)
    """MIG GPU instances to destroy."""


class PlanDisruption(Frozen):
    """The plan's disruption: its worst step's level and what goes away."""

    level: Disruption = Disruption.NONE
    destroyed: int = 0
    """vGPUs the plan destroys."""
    held: int = 0
    """Of those, vGPUs a pod or VM holds (only under ``in-use: ignore``)."""
    gpus: int = 0
    """GPUs with a step above ``none``."""


def plan_disruption(
    actions: tuple[Action, ...], held: frozenset[str] = frozenset()
) -> PlanDisruption:
    """The plan-level classification from the steps' own (``held``: held vGPU keys)."""
    level = Disruption.NONE
    gpus: set[str] = set()
    destroyed = held_n = 0
    for a in actions:
        if a.disruption.rank > level.rank:
            level = a.disruption
        if a.disruption is not Disruption.NONE:
            gpus.add(a.gpu)
        if a.kind is ActionKind.DESTROY:
            destroyed += 1
            held_n += a.vgpu_key in held
    return _plan_disruption(level, destroyed, held_n, len(gpus))


@functools.lru_cache(maxsize=1024, typed=True)
def _plan_disruption(level: Disruption, destroyed: int, held: int, gpus: int) -> PlanDisruption:
    """One frozen value for equal ones (a fleet's plans share theirs)."""
    return PlanDisruption(level=level, destroyed=destroyed, held=held, gpus=gpus)


class Capacity(Frozen):
    """One resource the node offers now or after the plan: vGPUs before and after."""

    resource: str | None
    """The extended resource (``nvidia.com/NVIDIA_A2-4Q``); ``None`` while the driver's
    name of the type is not known (a GPU whose virtual functions are still off)."""
    type_name: str
    """The driver's name of the type (``NVIDIA A2-4Q``), else the short name."""
    publish: Publish
    before: int
    after: int
    """After the plan; blocked steps count as not taken."""
    held: int = 0
    """vGPUs of this resource a pod or VM holds now."""
    kubevirt: Literal["add", "update", "remove"] | None = None
    """The change to this resource's KubeVirt CR entry, when the plan has one."""
    blocked: int = 0
    """vGPUs of this resource the layout wants but this plan cannot create (its
    blocked creates), so ``after`` lacks them."""
    blocked_code: BlockedReason | None = None
    """Why (the first such create's code), ``None`` when nothing is blocked."""
    waits_for: tuple[str, ...] = ()
    """The holders those creates wait for, sorted (a deferred switch's)."""
    withheld: int = Field(default=0, exclude_if=lambda v: not v)
    """Of ``before``, free vGPUs not offered while a switch is pending (``in-use: evacuate``)."""


class Holder(Frozen):
    """A pod or VM and how many of its vGPUs a plan touches (or protects)."""

    holder: str
    vgpus: int


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
    """In execution order: per GPU by address; within a GPU by :data:`STEP_ORDER`
    (destroy, disable SR-IOV, MIG mode, enable SR-IOV, GPU instances, heterogeneous
    mode, create)."""
    blocked: tuple[Blocked, ...]
    summary: Summary
    cluster_actions: tuple[ClusterAction, ...] = ()
    """After the host's actions: what changes in cluster objects (empty without a cluster)."""
    disruption: PlanDisruption = PlanDisruption()
    capacity: tuple[Capacity, ...] = ()
    """Per resource (and channel): vGPUs now and after the plan, sorted by resource."""
    affected: tuple[Holder, ...] = ()
    """Holders whose vGPUs the plan destroys (possible only under ``in-use: ignore``)."""
    protected: tuple[Holder, ...] = ()
    """Holders whose vGPUs stay because of ``in-use: protect`` (blocked items)."""
    skipped: tuple[SkippedEntry, ...] = ()
    """Entries of the config that select no GPU of the node, skipped (not changes)."""

    @property
    def experimental(self) -> tuple[str, ...]:
        """The inferred rules the plan relies on, each once (:attr:`GpuPlan.experimental`)."""
        return tuple(dict.fromkeys(r for g in self.gpus for r in g.experimental))

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
        mode_steps = s.sriov_disable + s.modes + s.gi_create + s.gi_destroy
        return s.create + s.destroy + s.sriov + s.cluster + mode_steps > 0

    def with_cluster(
        self, actions: tuple[ClusterAction, ...], blocked: tuple[Blocked, ...] = ()
    ) -> Plan:
        """This plan with the cluster actions (and cluster-level blocked items) added."""
        summary = self.summary.model_copy(
            update={"cluster": len(actions), "blocked": self.summary.blocked + len(blocked)}
        )
        ops = {a.resource: a.op for a in actions}
        capacity = tuple(
            c.model_copy(update={"kubevirt": ops.get(c.resource) if c.resource else None})
            for c in self.capacity
        )
        return self.model_copy(
            update={
                "cluster_actions": actions,
                "blocked": (*self.blocked, *blocked),
                "summary": summary,
                "capacity": capacity,
            }
        )

    @property
    def cluster_blocked(self) -> tuple[Blocked, ...]:
        """Blocked items of the cluster (``gpu`` empty): while any is there, nothing is applied."""
        return tuple(b for b in self.blocked if b.gpu == "")

    @property
    def is_converged(self) -> bool:
        """True when the node already matches the layout: nothing to do, nothing blocked."""
        return not self.has_changes and not self.blocked
