"""``DriverTypeMemory``: a host's memory of the vGPU types its driver listed.

Every scan of a host goes through :meth:`DriverTypeMemory.observe`: what the
driver lists is remembered, and a vGPU whose type id neither the catalog nor
the live listing names is named from what was remembered. One host object
keeps its memory from scan to scan (so the scan before an apply names the
vGPUs of the scan after it); ``save`` hands each extended table to whoever
keeps it across processes (the shell's state file).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from vgpu_state.model.drivertypes import DriverTypes
from vgpu_state.model.snapshot import NodeSnapshot


class DriverTypeMemory:
    """The remembered table of one node, starting from ``table`` (empty by default).

    ``save`` is called with the new table each time a scan extends or changes
    it (never for a scan that lists nothing new); it must not raise.
    """

    def __init__(
        self,
        table: DriverTypes | None = None,
        save: Callable[[DriverTypes], None] | None = None,
    ) -> None:
        self._table = table if table is not None else DriverTypes()
        self._save = save
        self._lock = threading.Lock()

    @property
    def table(self) -> DriverTypes:
        return self._table

    def observe(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """Remember what ``snapshot`` lists; return it with its unnamed vGPUs named."""
        with self._lock:
            learned = self._table.learn(snapshot)
            if learned is not self._table:
                self._table = learned
                if self._save is not None:
                    self._save(learned)
            return learned.name_vgpus(snapshot)
