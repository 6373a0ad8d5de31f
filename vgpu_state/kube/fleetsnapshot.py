"""A fleet snapshot: what ``fleet plan`` reads from a cluster, in a file (docs/gitops.md).

``vgpu-state fleet snapshot`` writes it with list requests only; ``fleet plan
--from FILE`` plans from it without any cluster access, exactly as it would
have planned against the cluster at the moment the snapshot was taken.

The format is JSON Lines (one JSON object per line, UTF-8), optionally
gzip-compressed (the reader recognises gzip by its first bytes), written and
read a line at a time, so a fleet of any size is never held whole:

1. a header: ``{"kind": "vgpu-state-fleet-snapshot", "format_version": "1",
   "taken_at": "…Z", "source": {"server": …, "context": …}, "generator": …}``;
2. one ``{"kind": "Node", "name": …, "labels": {…}}`` per Node of the cluster
   (its labels select its layout; nothing else of a Node is kept);
3. one ``{"kind": "VGPUNodeState", "name": …, "status": {…}}`` per
   ``VGPUNodeState`` object, its status as the API server returned it (absent
   or ``null`` when the node has not reported);
4. an end record, ``{"kind": "end", "nodes": N, "states": M}``: a file cut
   short (a failed upload, a full disk) is refused instead of planned as a
   smaller fleet.

Every Node record comes before the first ``VGPUNodeState`` record, as
``fleet plan`` reads every Node's labels before it plans. A reader of format
``1`` ignores fields it does not know in every record, so later versions may
add fields without changing the version; a change that an older reader would
misread raises it.
"""

from __future__ import annotations

import datetime
import gzip
import io
import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from vgpu_state import __version__
from vgpu_state.kube.api import JsonObject, KubeApi
from vgpu_state.kube.fleet import DEFAULT_CHUNK_SIZE, fleet_pages
from vgpu_state.model import bounded
from vgpu_state.model.errors import Reason, UserError
from vgpu_state.model.timestamps import rfc3339

SNAPSHOT_KIND = "vgpu-state-fleet-snapshot"
SNAPSHOT_FORMAT_VERSION = "1"
NODE = "Node"
STATE = "VGPUNodeState"
END = "end"
MAX_LINE = 64 * 1024 * 1024
"""The longest line read (a node's status is tens of kilobytes)."""
_GZIP_MAGIC = b"\x1f\x8b"


class SnapshotFileError(UserError):
    """A fleet snapshot file cannot be used; the message names file, line and problem."""

    default_reason = Reason.INPUT_INVALID

    def __init__(self, path: str, line: int, problem: str, column: int = 1) -> None:
        self.path, self.line, self.column = path, line, column
        where = f"{path}:{line}:{column}" if line else path
        super().__init__(f"{where}: {problem}")


def _line(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


# writing ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SnapshotCounts:
    nodes: int
    states: int


def write_snapshot(
    api: KubeApi,
    out: IO[bytes],
    *,
    context: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    now: datetime.datetime | None = None,
) -> SnapshotCounts:
    """Every Node's labels and every ``VGPUNodeState``'s status to ``out``, read as
    ``fleet plan`` reads them (list requests, page by page) and written a line at a
    time. Raises the API's errors (nothing useful is written then)."""
    taken = now or datetime.datetime.now(tz=datetime.UTC)
    labels, pages = fleet_pages(api, chunk_size)
    header = {
        "kind": SNAPSHOT_KIND,
        "format_version": SNAPSHOT_FORMAT_VERSION,
        "taken_at": rfc3339(taken),
        "source": {"server": api.server, "context": context},
        "generator": f"vgpu-state {__version__}",
    }
    out.write(_line(header))
    for node in sorted(labels):
        out.write(_line({"kind": NODE, "name": node, "labels": labels[node]}))
    states = 0
    for page in pages:
        for obj in page:
            name = (obj.get("metadata") or {}).get("name")
            if not isinstance(name, str) or not name:
                continue
            record: dict[str, Any] = {"kind": STATE, "name": name}
            if "status" in obj:
                record["status"] = obj["status"]
            out.write(_line(record))
            states += 1
        del page
    out.write(_line({"kind": END, "nodes": len(labels), "states": states}))
    return SnapshotCounts(len(labels), states)


# reading ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SnapshotHeader:
    taken_at: datetime.datetime
    server: str | None
    context: str | None
    format_version: str


def _open(path: str) -> IO[bytes]:
    """``path`` for reading, refused unless a regular file (a FIFO or a device could
    make the command wait or read forever); gzip is recognised by its magic bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise SnapshotFileError(path, 0, f"cannot read the file: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotFileError(path, 0, "the snapshot must be a regular file")
        os.set_blocking(fd, True)
        raw = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    if raw.read(2) == _GZIP_MAGIC:
        raw.seek(0)
        packed: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        return packed  # its file is closed with it (SnapshotReader.close)
    raw.seek(0)
    return raw


class SnapshotReader:
    """A fleet snapshot read a line at a time: :meth:`open` reads the header and every
    Node's labels; :meth:`pages` then yields the ``VGPUNodeState`` objects (as the API
    server lists them, reduced to name and status) in pages, checking the rest of the
    file as it goes. Every problem raises :class:`SnapshotFileError` with the line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._number = 0
        self._pending: tuple[int, dict[str, Any]] | None = None
        self.header: SnapshotHeader | None = None
        self.labels: dict[str, dict[str, str]] = {}
        self._iter: Iterator[tuple[int, dict[str, Any]]] = iter(())

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            inner = getattr(self._file, "fileobj", None)
            self._file.close()
            if isinstance(inner, io.IOBase):
                inner.close()
            self._file = None

    def _error(self, problem: str, line: int | None = None, column: int = 1) -> SnapshotFileError:
        return SnapshotFileError(self.path, self._number if line is None else line, problem, column)

    def _records(self) -> Iterator[tuple[int, dict[str, Any]]]:
        assert self._file is not None
        while True:
            try:
                data = self._file.readline(MAX_LINE + 1)
            except (OSError, EOFError, gzip.BadGzipFile) as e:
                raise self._error(f"cannot read the file: {e}", self._number + 1) from None
            if not data:
                return
            self._number += 1
            if len(data) > MAX_LINE:
                raise self._error(f"the line is longer than {MAX_LINE} bytes")
            if not data.strip():
                raise self._error("empty line (each line is one JSON object)")
            try:
                record = bounded.loads(data.rstrip(b"\r\n"), self.path)
            except UnicodeDecodeError as e:
                raise self._error(f"not UTF-8 text: {e.reason}", column=e.start + 1) from None
            except json.JSONDecodeError as e:
                raise self._error(f"not JSON: {e.msg}", column=e.colno) from None
            except bounded.InputShapeError as e:
                raise self._error(e.message, column=max(1, e.column)) from None
            if not isinstance(record, dict):
                raise self._error(f"expected a JSON object, found {type(record).__name__}")
            yield self._number, record

    def open(self) -> SnapshotReader:
        """Read the header and the Node records (up to the first other record)."""
        self._file = _open(self.path)
        records = self._records()
        first = next(records, None)
        if first is None:
            raise self._error(f"the file is empty (expected a {SNAPSHOT_KIND} header)", 1)
        self.header = self._header(first[1])
        self._iter = records
        for number, record in records:
            kind = self._kind(record)
            if kind != NODE:
                self._pending = (number, record)
                break
            name = self._name(record)
            if name in self.labels:
                raise self._error(f"Node {name!r} is listed twice")
            self.labels[name] = self._labels(record)
        return self

    def _header(self, record: dict[str, Any]) -> SnapshotHeader:
        if record.get("kind") != SNAPSHOT_KIND:
            raise self._error(
                f"not a fleet snapshot: the first line's kind is {record.get('kind')!r}, "
                f"expected {SNAPSHOT_KIND!r} (write one with vgpu-state fleet snapshot)"
            )
        version = record.get("format_version")
        if version != SNAPSHOT_FORMAT_VERSION:
            raise self._error(
                f"format_version {version!r} is not supported: this vgpu-state "
                f"({__version__}) reads version {SNAPSHOT_FORMAT_VERSION!r}"
            )
        taken = record.get("taken_at")
        moment = None
        if isinstance(taken, str):
            try:
                moment = datetime.datetime.fromisoformat(taken)
            except ValueError:
                moment = None
        if moment is None or moment.tzinfo is None:
            raise self._error(f"taken_at {taken!r} is not a time with a zone (…Z)")
        source = record.get("source")
        source = source if isinstance(source, dict) else {}
        server, context = source.get("server"), source.get("context")
        return SnapshotHeader(
            taken_at=moment.astimezone(datetime.UTC),
            server=server if isinstance(server, str) else None,
            context=context if isinstance(context, str) else None,
            format_version=version,
        )

    def _kind(self, record: dict[str, Any]) -> str:
        kind = record.get("kind")
        if kind not in (NODE, STATE, END):
            raise self._error(
                f"unknown record kind {kind!r} (expected {NODE!r}, {STATE!r} or {END!r})"
            )
        return str(kind)

    def _name(self, record: dict[str, Any]) -> str:
        name = record.get("name")
        if not isinstance(name, str) or not name:
            raise self._error(f"{record.get('kind')} record without a name (found {name!r})")
        return name

    def _labels(self, record: dict[str, Any]) -> dict[str, str]:
        labels = record.get("labels")
        if labels is None:
            return {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise self._error(f"Node {record['name']!r}: labels must map strings to strings")
        return labels

    def pages(self, size: int = DEFAULT_CHUNK_SIZE) -> Iterator[list[JsonObject]]:
        """The ``VGPUNodeState`` objects, ``size`` per page (``0``: one page), then the
        end record checked against what was read."""
        assert self.header is not None, "open() first"
        page: list[JsonObject] = []
        seen: set[str] = set()
        pending = [self._pending] if self._pending is not None else []
        self._pending = None
        ended = False
        records: Iterator[tuple[int, dict[str, Any]]] = _chain(pending, self._iter)
        for number, record in records:
            if ended:
                raise self._error("a record after the end record", number)
            kind = self._kind(record)
            if kind == NODE:
                raise self._error(
                    f"Node record after the first {STATE} record (every Node comes first)",
                    number,
                )
            if kind == END:
                self._check_end(record, len(seen))
                ended = True
                continue
            name = self._name(record)
            if name in seen:
                raise self._error(f"{STATE} {name!r} is listed twice", number)
            seen.add(name)
            obj: JsonObject = {"metadata": {"name": name}}
            if record.get("status") is not None:
                obj["status"] = record["status"]
            page.append(obj)
            if size > 0 and len(page) >= size:
                yield page
                page = []
        if not ended:
            raise self._error(
                f"the file ends at line {self._number} without its end record: it was cut "
                "short (take the snapshot again)",
                self._number,
            )
        if page or not seen:
            yield page

    def _check_end(self, record: dict[str, Any], states: int) -> None:
        nodes = record.get("nodes")
        if nodes != len(self.labels) or record.get("states") != states:
            raise self._error(
                f"the end record counts {nodes!r} Node(s) and {record.get('states')!r} "
                f"{STATE}(s), the file holds {len(self.labels)} and {states}"
            )


def _chain(
    first: list[tuple[int, dict[str, Any]]], rest: Iterator[tuple[int, dict[str, Any]]]
) -> Iterator[tuple[int, dict[str, Any]]]:
    yield from first
    yield from rest
