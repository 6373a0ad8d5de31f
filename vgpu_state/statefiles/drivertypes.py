"""A node's memory of the vGPU types its driver listed, and its file in the state directory.

:class:`DriverTypeMemory` is what every scan of a host goes through: what the
driver lists is remembered, and a vGPU whose type id neither the catalog nor
the live listing names is named from what was remembered (the table itself,
a pure value, is :class:`~vgpu_state.model.drivertypes.DriverTypes`). One host
object keeps its memory from scan to scan (so the scan before an apply names
the vGPUs of the scan after it); its ``save`` hands each extended table to
:class:`DriverTypesFile`, which keeps it across processes.

``driver-types.json`` is read with the care the journal gets: never through a symlink, only
a regular file, at most :data:`MAX_DRIVER_TYPES_BYTES`, parsed strictly. A file
that fails any of that is a warning and is ignored (the node relearns what its
driver lists). It is written atomically: a fresh temporary file beside it
(``O_CREAT|O_EXCL``), fsynced, renamed over it; a symlink, FIFO, device or
directory at its path is left alone and reported.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from vgpu_state.inputfiles import MiB
from vgpu_state.model.drivertypes import DriverTypes, DriverTypesError
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.statefiles.safeopen import StateFileError, open_state_file, replace_atomically

MAX_DRIVER_TYPES_BYTES = 1 * MiB
_WHAT = "driver-types file"


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


class DriverTypesFile:
    """The table's file at ``path``."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def load(self) -> tuple[DriverTypes, str | None]:
        """The table, or an empty one and why the file was ignored (``None``: no problem).

        A missing file is an empty table without a warning.
        """
        if not os.path.lexists(self.path):
            return DriverTypes(), None
        try:
            fd = open_state_file(self.path, os.O_RDONLY, _WHAT)
        except StateFileError as e:
            return DriverTypes(), f"{e}; ignored"
        try:
            size = os.fstat(fd).st_size
            data = b"" if size > MAX_DRIVER_TYPES_BYTES else os.read(fd, MAX_DRIVER_TYPES_BYTES + 1)
        except OSError as e:
            return DriverTypes(), f"{self.path}: cannot read the {_WHAT}: {e.strerror}; ignored"
        finally:
            os.close(fd)
        if size > MAX_DRIVER_TYPES_BYTES or len(data) > MAX_DRIVER_TYPES_BYTES:
            return DriverTypes(), (
                f"{self.path}: the {_WHAT} is larger than {MAX_DRIVER_TYPES_BYTES} bytes; ignored"
            )
        try:
            return DriverTypes.parse(data.decode("utf-8")), None
        except UnicodeDecodeError:
            reason = "not valid JSON (not UTF-8)"
        except DriverTypesError as e:
            reason = str(e)
        return DriverTypes(), f"{self.path}: the {_WHAT} is {_article(reason)}; ignored"

    def save(self, table: DriverTypes) -> None:
        """Replace the file with ``table``; raises :class:`StateFileError` or ``OSError``."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(st.st_mode):
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                raise StateFileError(
                    f"{self.path}: the {_WHAT} is {kind}; refusing to replace it "
                    "(remove it or name another state directory)"
                )
        replace_atomically(self.path, table.dumps())

    def memory(self, warn: Callable[[str], None], *, record: bool = True) -> DriverTypeMemory:
        """A node's memory starting from this file; a file that cannot be used is passed
        to ``warn`` (never an error). ``record``: write what a scan newly sees back to
        the file (what changes the host does); otherwise it is only read."""
        table, problem = self.load()
        if problem is not None:
            warn(problem)
        return DriverTypeMemory(table, self.saver(warn) if record else None)

    def saver(self, warn: Callable[[str], None]) -> Callable[[DriverTypes], None]:
        """A ``save`` that never raises: each distinct failure is passed to ``warn`` once."""
        said: set[str] = set()

        def save(table: DriverTypes) -> None:
            try:
                self.save(table)
            except StateFileError as e:
                message = str(e)
            except OSError as e:
                why = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
                message = f"{self.path}: cannot write the {_WHAT}: {why}"
            else:
                return
            if message not in said:
                said.add(message)
                warn(message)

        return save


def _article(reason: str) -> str:
    """``not valid JSON`` reads as is; anything else as "invalid: <reason>"."""
    return reason if reason.startswith("not ") else f"invalid: {reason}"
