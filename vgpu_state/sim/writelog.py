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
from vgpu_state.sim.spec import NodeSpec, read_spec
from vgpu_state.sim.sysfs import SimSysfs

SUFFIX = ".writes"
FORMAT = 1


def log_path(spec_path: Path) -> Path:
    """Where the write log of ``spec_path`` lives: beside it, ``<name>.writes``."""
    return spec_path.with_name(spec_path.name + SUFFIX)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def pending_writes(spec_path: Path, spec_bytes: bytes) -> list[tuple[str, bytes]]:
    """The logged writes to replay on the spec whose file holds ``spec_bytes``.

    Empty when there is no log, or when it extends another version of the spec
    (stale). Reading stops at a line that is not whole (the last write of a
    process killed while appending it never happened).
    """
    try:
        raw = log_path(spec_path).read_bytes()
    except FileNotFoundError:
        return []
    lines = raw.split(b"\n")
    try:
        header = json.loads(lines[0])
    except ValueError:
        return []
    if not isinstance(header, dict) or header.get("spec") != digest(spec_bytes):
        return []
    found: list[tuple[str, bytes]] = []
    for line in lines[1:]:
        try:
            entry = json.loads(line)
            found.append((str(entry["path"]), str(entry["data"]).encode("latin-1")))
        except (ValueError, KeyError, TypeError, UnicodeEncodeError):
            break
    return found


class WriteLog:
    """Appends the writes made to a simulated node whose spec file holds ``spec_bytes``."""

    def __init__(self, spec_path: Path, spec_bytes: bytes) -> None:
        self.path = log_path(spec_path)
        self._spec = digest(spec_bytes)
        self._fd: int | None = None
        self.count = 0
        """Writes appended since the spec was last saved."""

    def append(self, path: str, data: bytes) -> None:
        """Log one write; raises ``OSError`` when the log cannot be written."""
        if self._fd is None:
            # A new log for the spec as it is now (a stale one is replaced).
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, _line({"spec": self._spec, "format": FORMAT}))
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        os.write(self._fd, _line({"path": path, "data": data.decode("latin-1")}))
        self.count += 1

    def saved(self, spec_bytes: bytes) -> None:
        """The spec file now holds ``spec_bytes`` (every logged write): drop the log."""
        self.close()
        self._spec = digest(spec_bytes)
        self.count = 0
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _line(record: dict[str, object]) -> bytes:
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def load_node(spec_path: Path, catalog: Catalog) -> tuple[NodeSpec, bytes, int]:
    """The node a spec file and its write log describe: ``(spec, file bytes, writes replayed)``.

    Without a (current) log this is the file's spec; with one, the spec of the
    node after replaying its writes.
    """
    spec, data = read_spec(spec_path, catalog=catalog)
    writes = pending_writes(spec_path, data)
    if not writes:
        return spec, data, 0
    sysfs = SimSysfs(spec, catalog)
    sysfs.replay(writes)
    return sysfs.to_spec(), data, len(writes)
