"""Where a node's state lives: one directory, the same for every entry point.

``vgpu-state apply`` on the node and the agent (whose DaemonSet mounts the
host's directory at the same path) keep the journal, the host lock and the
driver's type lists in the same files, so they serialise on one lock and
each sees the other's unfinished applies. A simulated node keeps its own
beside its spec file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from vgpu_state.wellknown import (
    DRIVER_TYPES_FILE,
    JOURNAL_FILE,
    LOCK_FILE,
    STATE_DIR,
    WITHHELD_FILE,
)


@dataclass(frozen=True)
class StateDir:
    """The files of one node's state: every file vgpu-state keeps between runs."""

    journal: Path
    """The apply journal (JSON lines)."""
    lock: Path
    """The host lock every apply takes."""
    driver_types: Path
    """The vGPU types the driver listed (``driver-types.json``)."""
    withheld: Path
    """The free vGPUs the agent withholds while a layout switch is pending
    (``withheld.json``; written by the agent, read by ``scan``)."""

    @classmethod
    def at(cls, directory: Path | str = STATE_DIR) -> StateDir:
        """The files in ``directory`` (the agent's ``--state-dir``)."""
        d = Path(directory)
        return cls(d / JOURNAL_FILE, d / LOCK_FILE, d / DRIVER_TYPES_FILE, d / WITHHELD_FILE)

    @classmethod
    def beside(cls, spec: Path | str) -> StateDir:
        """A simulated node's files, beside its spec: ``<spec>.journal.jsonl``,
        ``<spec>.lock``, ``<spec>.driver-types.json`` and ``<spec>.withheld.json``."""
        spec = Path(spec)
        return cls(
            spec.with_name(f"{spec.name}.{JOURNAL_FILE}"),
            spec.with_name(f"{spec.name}.lock"),
            spec.with_name(f"{spec.name}.{DRIVER_TYPES_FILE}"),
            spec.with_name(f"{spec.name}.{WITHHELD_FILE}"),
        )

    def moved(self, journal: Path | str | None = None, lock: Path | str | None = None) -> StateDir:
        """These files with the journal or the lock elsewhere (``--journal``,
        ``--lock-file``); the driver types go beside a moved journal (the withheld
        record stays: the agent keeps it in its state directory)."""
        moved = self
        if journal:
            journal = Path(journal)
            moved = dataclasses.replace(
                moved, journal=journal, driver_types=journal.with_name(DRIVER_TYPES_FILE)
            )
        if lock:
            moved = dataclasses.replace(moved, lock=Path(lock))
        return moved


DEFAULT_STATE_DIR = StateDir.at()
"""A node's state directory (:data:`~vgpu_state.wellknown.STATE_DIR`)."""
