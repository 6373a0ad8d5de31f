"""Executor: runs a Plan through the host port, with journal, lock and verification."""

from vgpu_state.executor.apply import (
    ApplyError,
    ApplyResult,
    StepResult,
    VerificationError,
    apply,
)
from vgpu_state.executor.journal import Journal, UnfinishedPlan, journal_path
from vgpu_state.executor.lock import HostLock, LockTimeoutError, lock_path
from vgpu_state.ports.host import HostPort

__all__ = [
    "ApplyError",
    "ApplyResult",
    "HostLock",
    "HostPort",
    "Journal",
    "LockTimeoutError",
    "StepResult",
    "UnfinishedPlan",
    "VerificationError",
    "apply",
    "journal_path",
    "lock_path",
]
