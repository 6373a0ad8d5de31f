"""An append-only JSON-lines journal of every apply: the audit trail.

Each record is one line, fsynced before the next step runs, so after a crash
the journal shows exactly which steps ran. Records:

* ``plan-start``: plan id, node, config, selection, fingerprint, number of actions;
* ``action``: one per step, written when it ends: the action's address, kind and
  type, ``started``/``ended`` (Unix time), outcome (``ok``, ``skipped``,
  ``failed``), errno and, on failure, the message;
* ``plan-end``: outcome (``converged``, ``partial``, ``failed``) and timings.

A step that was running when the process died has no record; it is the step
after the last recorded one, and re-planning against the live state shows
whether it took effect.

A ``plan-start`` without its ``plan-end`` is an unfinished plan, until a later
apply on the same node ends ``converged`` or ``partial``: that apply re-planned
against the live state and so finished the interrupted work.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpu_state.statefiles.safeopen import StateFileError, open_state_file

MAX_TAIL_BYTES = 8 * 1024 * 1024
"""How much of the journal's end is read: many thousands of applies. The journal
only grows; reading its tail keeps every command's time and memory bounded."""

_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "ts": (int, float),
    "event": (str,),
    "plan_id": (str,),
    "node": (str,),
    "config": (str,),
    "selection": (str,),
    "fingerprint": (str,),
    "actions": (int,),
    "blocked": (int,),
    "address": (str,),
    "kind": (str,),
    "outcome": (str,),
    "errno": (int,),
    "seconds": (int, float),
    "started": (int, float),
    "ended": (int, float),
    "failed": (str,),
    "message": (str,),
}
_REQUIRED = {"plan-start": ("plan_id",), "action": ("plan_id", "address"), "plan-end": ("plan_id",)}


def record_problem(value: object) -> str | None:
    """Why a decoded journal line is not a record vgpu-state can use, or ``None``."""
    if not isinstance(value, dict):
        return "not a JSON object"
    for name, types in _FIELD_TYPES.items():
        field_value = value.get(name)
        if field_value is None:
            continue
        if isinstance(field_value, bool) or not isinstance(field_value, types):
            return f"{name} has the wrong type"
    for name in _REQUIRED.get(str(value.get("event")), ()):
        if name not in value:
            return f"{name} is missing"
    return None


class Journal:
    """The journal file. ``append`` keeps the file open between records; ``close``
    releases it (a later ``append`` opens it again).

    The journal is never opened through a symlink, and a journal path that is a
    FIFO or a device is refused. Reading skips malformed lines; each is named in
    :attr:`warnings`.
    """

    def __init__(self, path: Path | str, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock
        self._fd: int | None = None
        self.warnings: list[str] = []

    def append(self, record: dict[str, Any]) -> None:
        """Write one record and ``fdatasync`` it before returning."""
        line = json.dumps({"ts": self.clock(), **record}, sort_keys=True) + "\n"
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = open_state_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "journal")
        try:
            os.write(self._fd, line.encode())
            os.fdatasync(self._fd)
        except OSError as e:
            raise OSError(e.errno, f"cannot write the journal: {e.strerror}", str(self.path)) from e

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _tail(self) -> tuple[bytes, int]:
        """The last :data:`MAX_TAIL_BYTES` of the file, and where they start."""
        try:
            fd = open_state_file(self.path, os.O_RDONLY, "journal")
        except StateFileError:
            if not os.path.lexists(self.path):
                return b"", 0
            raise
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - MAX_TAIL_BYTES)
            data = os.pread(fd, size - start, start)
        finally:
            os.close(fd)
        if start > 0:
            cut = data.find(b"\n") + 1
            data, start = data[cut:], start + cut
        return data, start

    def records(self) -> Iterator[dict[str, Any]]:
        """Every readable record of the journal's tail, oldest first.

        A torn last line (crash mid-write) is skipped silently; any other line
        that is not a record is skipped with a warning naming it.
        """
        self.warnings = []
        data, start = self._tail()
        if not data:
            return
        lines = data.split(b"\n")
        torn = lines[-1]
        offset = start
        for number, raw in enumerate(lines[:-1], start=1):
            where = f"line {number}" if start == 0 else f"the line at byte {offset}"
            offset += len(raw) + 1
            if not raw.strip():
                continue
            try:
                value = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                self.warnings.append(f"{self.path}: {where}: skipped: not a JSON record")
                continue
            problem = record_problem(value)
            if problem is not None:
                self.warnings.append(f"{self.path}: {where}: skipped: {problem}")
                continue
            yield value
        if torn.strip():
            try:
                value = json.loads(torn.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                return  # torn by a crash mid-write
            if record_problem(value) is None:
                yield value

    def applies(self) -> list[PastApply]:
        """Every apply of the journal's tail, in the order each first appears.

        Records group by plan id. An apply whose ``plan-start`` is not in the tail
        takes its start fields from its first record; one without ``plan-end``
        is unfinished (:attr:`PastApply.ended` is false).
        """
        out: list[PastApply] = []
        for group in by_apply(self.records()):
            start = group.start if group.start is not None else group.first
            end = group.end
            out.append(
                PastApply(
                    plan_id=group.plan_id,
                    started=start.get("ts", 0),
                    node=start.get("node"),
                    config=start.get("config"),
                    selection=start.get("selection"),
                    total=start.get("actions"),
                    steps=tuple(group.steps),
                    ended=end is not None,
                    outcome=end.get("outcome") if end is not None else None,
                    seconds=end.get("seconds") if end is not None else None,
                )
            )
        return out

    def unfinished(self) -> list[UnfinishedPlan]:
        """Plans that started but never recorded their end (the process died) and that
        no later apply on the same node finished (see :func:`by_apply`)."""
        out: list[UnfinishedPlan] = []
        for group in by_apply(self.records(), open_only=True):
            start = group.start if group.start is not None else group.first
            ts, total = start.get("ts"), start.get("actions")
            out.append(
                UnfinishedPlan(
                    plan_id=group.plan_id,
                    node=group.node,
                    config=str(start.get("config", "")),
                    started=float(ts) if ts is not None else 0.0,
                    total=int(total) if total is not None else 0,
                    done=len(group.steps),
                    last_action=str(group.steps[-1].address) if group.steps else "",
                )
            )
        return out


@dataclass
class ApplyRecords:
    """The records of one apply (one plan id) in the journal's tail."""

    plan_id: str
    first: dict[str, Any]
    """The apply's first record: its ``plan-start`` unless the tail cut that off."""
    start: dict[str, Any] | None = None
    """Its ``plan-start`` (the last, should there be more than one)."""
    steps: list[JournalStep] = field(default_factory=list)
    end: dict[str, Any] | None = None
    """Its ``plan-end`` (the last, should there be more than one)."""

    @property
    def node(self) -> str:
        """The node its ``plan-start`` names (``""`` when none)."""
        return str(self.start.get("node", "")) if self.start is not None else ""


def by_apply(records: Iterable[dict[str, Any]], *, open_only: bool = False) -> list[ApplyRecords]:
    """``records`` (oldest first) grouped by plan id, in the order each apply first appears.

    With ``open_only``, only the applies open after the last record: an apply
    opens at its ``plan-start`` (a repeated one opens it afresh, keeping its
    place) and counts the steps recorded after it; it closes at its
    ``plan-end``, and so does every open apply of a node when an apply on that
    node ends ``converged`` or ``partial``: that apply re-planned against the
    live state and so finished the interrupted work. Only the open applies are
    kept while reading, however long the journal.
    """
    groups: dict[str, ApplyRecords] = {}
    for record in records:
        pid = str(record.get("plan_id"))
        event = record.get("event")
        group = groups.get(pid)
        if event == "plan-start":
            if group is None or open_only:
                groups[pid] = ApplyRecords(pid, record, start=record)
            else:
                group.start = record
            continue
        if open_only and event == "plan-end":
            groups.pop(pid, None)
            if record.get("outcome") in ("converged", "partial"):
                node = str(record.get("node", ""))
                groups = {k: g for k, g in groups.items() if g.node != node}
            continue
        if group is None:
            if open_only:
                continue
            group = groups[pid] = ApplyRecords(pid, record)
        if event == "action":
            group.steps.append(
                JournalStep(
                    kind=record.get("kind"),
                    address=record.get("address"),
                    outcome=record.get("outcome"),
                    errno=record.get("errno"),
                )
            )
        elif event == "plan-end":
            group.end = record
    return list(groups.values())


@dataclass(frozen=True)
class UnfinishedPlan:
    plan_id: str
    node: str
    config: str
    started: float
    total: int
    done: int
    last_action: str

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        last = f"; last finished step: {self.last_action}" if self.last_action else ""
        return (
            f"plan {self.plan_id} (config {self.config!r}, started {when}) did not finish: "
            f"{self.done} of {self.total} steps done{last}. Re-planning against the live "
            "state resumes it."
        )


@dataclass(frozen=True)
class JournalStep:
    """One ``action`` record: a step of an apply and how it ended."""

    kind: str | None
    address: str | None
    outcome: str | None
    """``ok``, ``skipped`` or ``failed``."""
    errno: int | None


@dataclass(frozen=True)
class PastApply:
    """One apply as the journal tells it (see :meth:`Journal.applies`)."""

    plan_id: str
    started: float | None
    """Unix time of the ``plan-start`` record (0 when it has none, ``None`` when null)."""
    node: str | None
    config: str | None
    selection: str | None
    total: int | None
    """How many actions the plan had."""
    steps: tuple[JournalStep, ...]
    ended: bool
    """Whether the ``plan-end`` record is there; an apply without it did not finish."""
    outcome: str | None
    """``converged``, ``partial`` or ``failed`` (of an ended apply)."""
    seconds: float | None
