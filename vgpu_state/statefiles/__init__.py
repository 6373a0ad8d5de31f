"""A node's state files: the journal, the host lock, the driver's type lists and what the
agent withholds.

Every file vgpu-state keeps between runs lives here, named by one
:class:`StateDir` and opened by one rule (:mod:`~vgpu_state.statefiles.safeopen`:
never through a symlink, only a regular file). Each name loads its module when
first asked for (the journal alone does not load the driver's type lists).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vgpu_state.statefiles.drivertypes import DriverTypeMemory, DriverTypesFile
    from vgpu_state.statefiles.journal import Journal, JournalStep, PastApply, UnfinishedPlan
    from vgpu_state.statefiles.lock import HostLock, LockTimeoutError
    from vgpu_state.statefiles.safeopen import StateFileError
    from vgpu_state.statefiles.statedir import DEFAULT_STATE_DIR, StateDir
    from vgpu_state.statefiles.withheld import WithheldFile, WithheldRecorder

_MODULES = {
    "DEFAULT_STATE_DIR": "vgpu_state.statefiles.statedir",
    "DriverTypeMemory": "vgpu_state.statefiles.drivertypes",
    "DriverTypesFile": "vgpu_state.statefiles.drivertypes",
    "HostLock": "vgpu_state.statefiles.lock",
    "Journal": "vgpu_state.statefiles.journal",
    "JournalStep": "vgpu_state.statefiles.journal",
    "LockTimeoutError": "vgpu_state.statefiles.lock",
    "PastApply": "vgpu_state.statefiles.journal",
    "StateDir": "vgpu_state.statefiles.statedir",
    "StateFileError": "vgpu_state.statefiles.safeopen",
    "UnfinishedPlan": "vgpu_state.statefiles.journal",
    "WithheldFile": "vgpu_state.statefiles.withheld",
    "WithheldRecorder": "vgpu_state.statefiles.withheld",
}

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
    "WithheldFile",
    "WithheldRecorder",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
