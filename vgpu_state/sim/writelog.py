"""The write log of a simulated node kept in a spec file: every sysfs write since the last save.

Saving the whole spec after every write makes an apply's cost grow with the
square of the node (each save dumps every GPU). Instead, a simulated host
that keeps its changes appends each write it receives to ``<spec>.writes``,
one JSON line, and writes the spec itself once, when the apply is done
(:meth:`~vgpu_state.sim.host.SimHost.save`). Whoever opens the spec next
replays the log on top of it, so a process killed between two writes leaves
exactly the writes it made, as a real host keeps each sysfs write.

The first line names the spec the log extends (the sha256 of the file's
bytes). A save replaces the spec first and removes the log after; a log
whose spec has since been replaced is stale and ignored, so a crash between
the two never applies a write twice. The log is not fsynced: it survives the
process being killed, not the machine losing power (the saved spec is).

Every write is logged, refused ones included: the simulated driver is
deterministic, so replaying the same writes from the same spec reaches the
same state, the counters of injected faults included.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from vgpu_state.catalog import Catalog
from vgpu_state.model import bounded
from vgpu_state.sim.spec import NodeSpec, read_spec
from vgpu_state.sim.sysfs import SimSysfs

SUFFIX = ".writes"
FORMAT = 1


def log_path(spec_path: Path) -> Path:
    """Where the write log of ``spec_path`` lives: beside it, ``<name>.writes``."""
    return spec_path.with_name(spec_path.name + SUFFIX)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_log(spec_path: Path, spec_bytes: bytes) -> tuple[list[tuple[str, bytes]], int | None]:
    """The logged writes to replay on the spec whose file holds ``spec_bytes``, and
    the length of the log up to its last whole line (``None`` when there is no
    current log to continue).

    No writes when there is no log, or when it extends another version of the
    spec (stale). Reading stops at a line that is not whole (the last write of a
    process killed while appending it never happened).
    """
    try:
        raw = log_path(spec_path).read_bytes()
    except FileNotFoundError:
        return [], None
    first, newline, rest = raw.partition(b"\n")
    try:
        header = bounded.loads(first, "the write log") if newline else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("spec") != digest(spec_bytes):
        return [], None
    length = len(first) + 1
    found: list[tuple[str, bytes]] = []
    for line in rest.split(b"\n")[:-1]:  # the last piece has no newline: not whole
        try:
            entry = bounded.loads(line, "the write log")
            found.append((str(entry["path"]), str(entry["data"]).encode("latin-1")))
        except (ValueError, KeyError, TypeError, UnicodeEncodeError):
            break
        length += len(line) + 1
    return found, length


class WriteLog:
    """Appends the writes made to a simulated node whose spec file holds ``spec_bytes``.

    ``current``: the writes of the spec's current log and its length up to its
    last whole line (:func:`read_log`), already replayed into the node; the
    first write continues that log (a torn last line cut off) instead of
    starting a new one. Nothing is written before the first write, so opening a
    node to read it never changes its files.
    """

    def __init__(
        self,
        spec_path: Path,
        spec_bytes: bytes,
        current: tuple[list[tuple[str, bytes]], int | None] = ([], None),
    ) -> None:
        self.path = log_path(spec_path)
        self._spec = digest(spec_bytes)
        self._fd: int | None = None
        self._continue = current[1]
        self.count = len(current[0])
        """Writes in the log, not yet in the spec file."""

    def append(self, path: str, data: bytes) -> None:
        """Log one write; raises ``OSError`` when the log cannot be written."""
        if self._fd is None:
            self._fd = self._open()
        os.write(self._fd, _line({"path": path, "data": data.decode("latin-1")}))
        self.count += 1

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        if self._continue is not None:
            fd = os.open(self.path, flags | os.O_APPEND, 0o644)
            try:
                os.ftruncate(fd, self._continue)
            except BaseException:
                os.close(fd)
                raise
            return fd
        # A new log for the spec as it is now (a stale one is replaced).
        fd = os.open(self.path, flags | os.O_TRUNC, 0o644)
        try:
            os.write(fd, _line({"spec": self._spec, "format": FORMAT}))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def saved(self, spec_bytes: bytes) -> None:
        """The spec file now holds ``spec_bytes`` (every logged write): drop the log."""
        self.close()
        self._spec = digest(spec_bytes)
        self._continue = None
        self.count = 0
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _line(record: dict[str, object]) -> bytes:
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def load_node(
    spec_path: Path, catalog: Catalog
) -> tuple[NodeSpec, bytes, tuple[list[tuple[str, bytes]], int | None]]:
    """The node a spec file and its write log describe: ``(spec, file bytes, log)``,
    ``log`` as :func:`read_log` returns it.

    Without a (current) log this is the file's spec; with one, the spec of the
    node after replaying its writes.
    """
    spec, data = read_spec(spec_path, catalog=catalog)
    log = read_log(spec_path, data)
    if not log[0]:
        return spec, data, log
    sysfs = SimSysfs(spec, catalog)
    sysfs.replay(log[0])
    return sysfs.to_spec(), data, log
