"""What a node reports about itself: status (conditions with reason codes) and Events."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from vgpu_state.model.frozen import Frozen


class ConfigState(StrEnum):
    """The vgpu-device-manager compatible state of a node's config (its state label)."""

    PENDING = "pending"
    SUCCESS = "success"
    FAILED = "failed"


class ConditionType(StrEnum):
    SYNCED = "Synced"
    """The host matches the selected layout, apart from blocked items."""
    READY = "Ready"
    """The host was read and the last reconcile ended without an error."""
    BLOCKED = "Blocked"
    """Some wanted change is blocked (a held vGPU, a policy, capacity)."""
    DEGRADED = "Degraded"
    """The agent cannot do its job as configured (the config does not load); it
    changes nothing on the host until that is fixed."""


class Condition(Frozen):
    type: ConditionType
    status: bool
    reason: str
    """A stable CamelCase code (:class:`~vgpu_state.model.errors.Reason` or
    :class:`~vgpu_state.model.errors.BlockedReason`)."""
    message: str = ""


class PendingSwitch(Frozen):
    """A GPU whose layout switch is pending: deferred (something in its way) or planned
    (the plan destroys vGPUs on it, possibly waiting for a rollout slot)."""

    gpu: str
    state: Literal["deferred", "planned"]
    policy: str
    """The plan's ``in-use`` policy (``protect``, ``ignore`` or ``evacuate``)."""
    departing: tuple[str, ...] = ()
    """The vGPU types leaving the GPU, sorted."""
    withheld: tuple[str, ...] = ()
    """Keys of the GPU's free vGPUs not offered meanwhile (``in-use: evacuate``), sorted."""
    message: str = ""


class NodeStatus(Frozen):
    """One reconcile's outcome for one node, as the cluster sees it."""

    node: str
    config: str | None
    """The selected config; ``None`` when nothing selects one."""
    state: ConfigState | None
    """``None`` when no config selects the node: it carries no state label."""
    conditions: tuple[Condition, ...] = ()
    vgpus: tuple[tuple[str, int], ...] = ()
    """The live layout after the reconcile: (type name, count), sorted by name."""
    selected_by: str = ""
    """The rule that selected ``config`` (``label``, ``node-selector[N]``, ``default``,
    ``default-config``, ``flag``); ``""`` when not known."""
    selected_detail: str = ""
    """That selection in words (the label and its value, the rule's place in the file)."""
    switches: tuple[PendingSwitch, ...] | None = None
    """The GPUs whose layout switch is pending (empty: none); ``None`` when this status
    does not know (a failed reconcile): the last ones known stand."""

    def condition(self, kind: ConditionType) -> Condition | None:
        for c in self.conditions:
            if c.type is kind:
                return c
        return None


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class NodeEvent(Frozen):
    """One thing that happened on a node, worth telling an operator (a Kubernetes Event)."""

    type: EventType
    reason: str
    message: str
