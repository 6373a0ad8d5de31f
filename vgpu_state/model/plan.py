"""A plan: the ordered, frozen list of changes that takes a node to its desired layout."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.policy import Policy, Publish
from vgpu_state.model.snapshot import Layout

PLAN_FORMAT_VERSION = "1.2"


class ActionKind(StrEnum):
    DESTROY = "destroy"
    ENABLE_SRIOV = "enable-sriov"
    CREATE = "create"


class Action(Frozen):
    """One host change. ``before``/``after`` describe the object (``None`` = absent)."""

    kind: ActionKind
    address: str
    """``gpu[<pci>].vgpu[<uuid>]``, ``gpu[<pci>].vf[<pci>]`` or ``gpu[<pci>].sriov``."""
    gpu: str
    layout: Layout
    type_name: str | None = None
    type_id: int | None = None
    parent: str | None = None
    """mdev parent (PF or VF) or the VF that takes the type; ``None`` until SR-IOV is on."""
    uuid: str | None = None
    vf: str | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    reason: str = ""


class Blocked(Frozen):
    """A step the plan will not take, and why (a holder, a policy, or capacity)."""

    address: str
    gpu: str
    kind: ActionKind
    type_name: str | None = None
    holder: str | None = None
    code: BlockedReason = BlockedReason.OTHER
    """The reason as a stable code (a status condition's reason); ``reason`` is the prose."""
    reason: str


class GpuPlan(Frozen):
    """Per-GPU header of a plan: what it is and how many vGPUs stay unchanged."""

    address: str
    index: int
    model: str | None
    layout: Layout
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

    def gpu_actions(self, address: str) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.gpu == address)

    def gpu_blocked(self, address: str) -> tuple[Blocked, ...]:
        return tuple(b for b in self.blocked if b.gpu == address)

    @property
    def has_changes(self) -> bool:
        """True when there is a step to take. Blocked items are not changes: a node
        whose only differences are held vGPUs has nothing left to do (see
        :attr:`is_converged`)."""
        return self.summary.create + self.summary.destroy + self.summary.sriov > 0

    @property
    def is_converged(self) -> bool:
        """True when the node already matches the layout: nothing to do, nothing blocked."""
        return not self.has_changes and not self.blocked
