"""Executor: runs a Plan through the host port, writing each step to the journal."""

from vgpu_state.executor.apply import (
    ApplyError,
    ApplyResult,
    Outcome,
    StepResult,
    VerificationError,
    apply,
)
from vgpu_state.ports.host import HostPort

__all__ = [
    "ApplyError",
    "ApplyResult",
    "HostPort",
    "Outcome",
    "StepResult",
    "VerificationError",
    "apply",
]
