"""What one reconcile found and did, and the hook that hears about it as it happens."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from vgpu_state.config.document import ConfigDocument
from vgpu_state.executor import ApplyResult, StepResult
from vgpu_state.model.desired import DesiredState
from vgpu_state.model.inuse import InUse
from vgpu_state.model.plan import Action, Plan
from vgpu_state.model.publish import Channels, split
from vgpu_state.model.snapshot import NodeSnapshot


@dataclass(frozen=True)
class Inputs:
    """Everything a plan is computed from, read fresh."""

    document: ConfigDocument
    node: str
    labels: dict[str, str]
    config: str
    source: str
    """How the config was chosen: ``label``, ``node-selector[N]``, ``default`` or ``flag``."""
    detail: str
    """One line saying how the config was chosen."""
    snapshot: NodeSnapshot
    in_use: InUse
    """Held vGPUs, keys normalised to the snapshot's form."""
    desired: DesiredState
    warnings: tuple[str, ...] = ()
    """Things worth telling a person that do not stop the reconcile."""


@dataclass(frozen=True)
class Report:
    """The outcome of :func:`~vgpu_state.reconcile.reconcile_once`."""

    inputs: Inputs
    plan: Plan
    final: NodeSnapshot
    """A fresh scan taken after everything else (the plan's own scan when nothing ran)."""
    differences: tuple[str, ...]
    """How ``final`` differs from the desired layout (empty when it matches)."""
    applied: ApplyResult | None = None
    """The apply's result; ``None`` when nothing was applied."""
    declined: bool = False
    """True when the gate declined the plan: nothing was changed."""

    @property
    def channels(self) -> Channels:
        """``final`` split by each GPU's ``publish``: every vGPU in exactly one channel."""
        return split(self.final, self.inputs.desired.publish_for)

    @property
    def advertised(self) -> NodeSnapshot:
        """What the device plugin may advertise: never a vGPU published through DRA."""
        return self.channels.device_plugin
    config_warning: str | None = None
    """Why the newest config was not used (the last good one was), if so."""

    @property
    def matches(self) -> bool:
        """The fresh scan shows the desired layout (nothing missing, nothing unwanted)."""
        return not self.differences

    @property
    def converged(self) -> bool:
        """The node matches its layout and nothing is blocked."""
        return self.matches and not self.plan.blocked

    def live_layout(self) -> tuple[tuple[str, int], ...]:
        counts = Counter(
            v.type_label for g in self.final.gpus for v in g.vgpus
        )
        return tuple(sorted(counts.items()))


class Reporter(Protocol):
    """Hears about a reconcile as it happens. The CLI renders it; the agent makes Events
    and metrics of it. Every method has a default that does nothing."""

    def warning(self, message: str) -> None: ...

    def planned(self, plan: Plan) -> None: ...

    def applying(self, plan: Plan) -> None: ...

    def step(self, action: Action, result: StepResult) -> None: ...

    def applied(self, plan: Plan, result: ApplyResult) -> None: ...


class QuietReporter:
    """A :class:`Reporter` that ignores everything (subclass it and override what you need)."""

    def warning(self, message: str) -> None:
        return None

    def planned(self, plan: Plan) -> None:
        return None

    def applying(self, plan: Plan) -> None:
        return None

    def step(self, action: Action, result: StepResult) -> None:
        return None

    def applied(self, plan: Plan, result: ApplyResult) -> None:
        return None
