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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_JOURNAL = "/var/lib/vgpu-state/journal.jsonl"


class Journal:
    """The journal file. ``append`` keeps the file open between records; ``close``
    releases it (a later ``append`` opens it again)."""

    def __init__(self, path: Path | str, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock
        self._fd: int | None = None

    def append(self, record: dict[str, Any]) -> None:
        """Write one record and ``fdatasync`` it before returning."""
        line = json.dumps({"ts": self.clock(), **record}, sort_keys=True) + "\n"
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._fd, line.encode())
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def records(self) -> Iterator[dict[str, Any]]:
        """Every readable record; a torn last line (crash mid-write) is skipped."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                yield value

    def unfinished(self) -> list[UnfinishedPlan]:
        """Plans that started but never recorded their end (the process died)."""
        open_plans: dict[str, UnfinishedPlan] = {}
        for r in self.records():
            pid = str(r.get("plan_id", ""))
            event = r.get("event")
            if event == "plan-start":
                open_plans[pid] = UnfinishedPlan(
                    plan_id=pid,
                    node=str(r.get("node", "")),
                    config=str(r.get("config", "")),
                    started=float(r.get("ts", 0.0)),
                    total=int(r.get("actions", 0)),
                    done=0,
                    last_action="",
                )
            elif event == "action" and pid in open_plans:
                u = open_plans[pid]
                open_plans[pid] = UnfinishedPlan(
                    u.plan_id, u.node, u.config, u.started, u.total, u.done + 1, str(r["address"])
                )
            elif event == "plan-end":
                open_plans.pop(pid, None)
                if r.get("outcome") in ("converged", "partial"):
                    node = str(r.get("node", ""))
                    open_plans = {k: u for k, u in open_plans.items() if u.node != node}
        return list(open_plans.values())


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
