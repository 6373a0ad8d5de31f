"""``withheld.json``: the free vGPUs a node's agent does not offer, and why.

An enforcing agent under ``in-use: evacuate`` withholds a GPU's free vGPUs of departing
types while its layout switch is pending (:mod:`vgpu_state.model.withheld`). It records
the set here each time it changes, and removes the file when nothing is withheld, so
``vgpu-state scan`` (which reads no config) can say which vGPUs are withheld.

The file is read with the care the journal gets: never through a symlink, only a regular
file, at most :data:`MAX_WITHHELD_BYTES`, parsed strictly; a file that fails any of that
is a warning and is ignored. It is written atomically: a fresh temporary file beside it
(``O_CREAT|O_EXCL``), fsynced, renamed over it; a symlink, FIFO, device or directory at
its path is left alone and reported.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from vgpu_state.inputfiles import MiB
from vgpu_state.model.withheld import WithheldFileError, WithheldRecord, WithheldVgpu
from vgpu_state.statefiles.safeopen import StateFileError, open_state_file, replace_atomically

MAX_WITHHELD_BYTES = 1 * MiB
_WHAT = "withheld record"


def _refuse_other_kinds(path: Path, doing: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise StateFileError(
            f"{path}: the {_WHAT} is {kind}; refusing to {doing} it "
            "(remove it or name another state directory)"
        )


class WithheldFile:
    """The record's file at ``path``."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def load(self) -> tuple[WithheldRecord | None, str | None]:
        """The record (``None``: no file, or one that cannot be used) and why the file was
        ignored (``None``: no problem). A missing file is no record and no problem."""
        if not os.path.lexists(self.path):
            return None, None
        try:
            fd = open_state_file(self.path, os.O_RDONLY, _WHAT)
        except StateFileError as e:
            return None, f"{e}; ignored"
        try:
            size = os.fstat(fd).st_size
            data = b"" if size > MAX_WITHHELD_BYTES else os.read(fd, MAX_WITHHELD_BYTES + 1)
        except OSError as e:
            return None, f"{self.path}: cannot read the {_WHAT}: {e.strerror}; ignored"
        finally:
            os.close(fd)
        if size > MAX_WITHHELD_BYTES or len(data) > MAX_WITHHELD_BYTES:
            limit = f"larger than {MAX_WITHHELD_BYTES} bytes"
            return None, f"{self.path}: the {_WHAT} is {limit}; ignored"
        try:
            return WithheldRecord.parse(data.decode("utf-8")), None
        except UnicodeDecodeError:
            reason = "not valid JSON (not UTF-8)"
        except WithheldFileError as e:
            reason = str(e)
        if not reason.startswith("not "):
            reason = f"invalid: {reason}"
        return None, f"{self.path}: the {_WHAT} is {reason}; ignored"

    def save(self, record: WithheldRecord) -> None:
        """Replace the file with ``record``; raises :class:`StateFileError` or ``OSError``."""
        _refuse_other_kinds(self.path, "replace")
        replace_atomically(self.path, record.dumps())

    def remove(self) -> None:
        """Remove the file (nothing is withheld); raises :class:`StateFileError` or
        ``OSError``. No file is no error."""
        _refuse_other_kinds(self.path, "remove")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def utc_text(seconds: float) -> str:
    """``seconds`` (Unix time) as ISO 8601 UTC to the second (``2026-11-29T00:00:00Z``)."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class WithheldRecorder:
    """Keeps :class:`WithheldFile` true: what the agent withholds, written when the set
    (or a reason) changes, the file removed when nothing is withheld. Never raises: each
    distinct failure is passed to ``warn`` once."""

    def __init__(
        self,
        file: WithheldFile,
        warn: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.file = file
        self._warn = warn
        self._clock = clock
        self._last: tuple[WithheldVgpu, ...] | None = None
        self._said: set[str] = set()

    def record(self, vgpus: tuple[WithheldVgpu, ...], snapshot_fingerprint: str | None) -> None:
        """The agent withholds ``vgpus`` now (planned from the scan ``snapshot_fingerprint``)."""
        vgpus = tuple(sorted(vgpus, key=lambda v: (v.gpu, v.key)))
        if vgpus == self._last:
            return
        try:
            if vgpus:
                self.file.save(
                    WithheldRecord(
                        written=utc_text(self._clock()),
                        snapshot_fingerprint=snapshot_fingerprint,
                        vgpus=vgpus,
                    )
                )
            else:
                self.file.remove()
        except StateFileError as e:
            message = str(e)
        except OSError as e:
            why = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
            doing = "write" if vgpus else "remove"
            message = f"{self.file.path}: cannot {doing} the {_WHAT}: {why}"
        else:
            self._last = vgpus
            return
        self._last = None  # tried again at the next change or reconcile
        if message not in self._said:
            self._said.add(message)
            self._warn(message)
