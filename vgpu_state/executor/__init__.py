"""Executor: runs a Plan through the host port, with journal, lock and verification."""

from vgpu_state.executor.apply import (
    ApplyError,
    ApplyResult,
    Outcome,
    StepResult,
    VerificationError,
    apply,
)
from vgpu_state.executor.journal import (
    Journal,
    JournalStep,
    PastApply,
    UnfinishedPlan,
)
from vgpu_state.executor.lock import HostLock, LockTimeoutError
from vgpu_state.executor.state import DEFAULT_STATE, StatePaths
from vgpu_state.ports.host import HostPort

__all__ = [
    "DEFAULT_STATE",
    "ApplyError",
    "ApplyResult",
    "HostLock",
    "HostPort",
    "Journal",
    "JournalStep",
    "LockTimeoutError",
    "Outcome",
    "PastApply",
    "StatePaths",
    "StepResult",
    "UnfinishedPlan",
    "VerificationError",
    "apply",
]
