"""Where a node's state lives: one directory, the same for every entry point.

``vgpu-state apply`` on the node and the agent (whose DaemonSet mounts the
host's directory at the same path) keep the journal, the host lock and the
driver's type lists in the same files, so they serialise on one lock and
each sees the other's unfinished applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vgpu_state.wellknown import DRIVER_TYPES_FILE, JOURNAL_FILE, LOCK_FILE, STATE_DIR


@dataclass(frozen=True)
class StatePaths:
    """The files of one state directory."""

    directory: Path = Path(STATE_DIR)

    @property
    def journal(self) -> Path:
        """The apply journal (JSON lines)."""
        return self.directory / JOURNAL_FILE

    @property
    def lock(self) -> Path:
        """The host lock every apply takes."""
        return self.directory / LOCK_FILE

    @property
    def driver_types(self) -> Path:
        """The vGPU types the driver listed (``driver-types.json``)."""
        return self.directory / DRIVER_TYPES_FILE


DEFAULT_STATE = StatePaths()
