"""A node's state files: the journal, the host lock and the driver's type lists.

Every file vgpu-state keeps between runs lives here, named by one
:class:`StateDir` and opened by one rule (:mod:`~vgpu_state.statefiles.safeopen`:
never through a symlink, only a regular file).
"""

from vgpu_state.statefiles.drivertypes import DriverTypeMemory, DriverTypesFile
from vgpu_state.statefiles.journal import Journal, JournalStep, PastApply, UnfinishedPlan
from vgpu_state.statefiles.lock import HostLock, LockTimeoutError
from vgpu_state.statefiles.safeopen import StateFileError
from vgpu_state.statefiles.statedir import DEFAULT_STATE_DIR, StateDir

__all__ = [
    "DEFAULT_STATE_DIR",
    "DriverTypeMemory",
    "DriverTypesFile",
    "HostLock",
    "Journal",
    "JournalStep",
    "LockTimeoutError",
    "PastApply",
    "StateDir",
    "StateFileError",
    "UnfinishedPlan",
]
