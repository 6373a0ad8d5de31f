"""The journal (audit trail, unfinished plans) and the host lock (no interleaving applies)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vgpu_state.statefiles import HostLock, Journal, LockTimeoutError


def test_journal_records_are_appended_and_read_back(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    j.append({"event": "plan-start", "plan_id": "p1", "config": "c", "actions": 2})
    j.append({"event": "action", "plan_id": "p1", "address": "gpu[x].vgpu[y]"})
    j.append({"event": "plan-end", "plan_id": "p1", "outcome": "converged"})
    events = [r["event"] for r in j.records()]
    assert events == ["plan-start", "action", "plan-end"]
    assert j.unfinished() == []


def test_unfinished_plan_is_reported_with_progress(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    j.append({"event": "plan-start", "plan_id": "p2", "config": "a2", "actions": 3})
    j.append({"event": "action", "plan_id": "p2", "address": "gpu[a].vgpu[1]"})
    with (tmp_path / "j.jsonl").open("a") as f:
        f.write('{"event": "action-st')  # torn write of a killed process
    [u] = j.unfinished()
    assert (u.plan_id, u.done, u.total, u.last_action) == ("p2", 1, 3, "gpu[a].vgpu[1]")
    assert "did not finish: 1 of 3 steps done" in u.describe()


def test_missing_journal_reads_as_empty(tmp_path: Path) -> None:
    assert list(Journal(tmp_path / "none.jsonl").records()) == []


def test_second_lock_waits_then_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from vgpu_state.statefiles import HostLock\n"
            f"with HostLock({str(path)!r}, operation='apply'):\n"
            "    print('locked', flush=True)\n"
            "    time.sleep(30)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with pytest.raises(LockTimeoutError) as err, HostLock(path, timeout=0.3):
            pass
        assert time.monotonic() - started >= 0.3
        assert f"pid {holder.pid}" in str(err.value)
        assert "apply" in str(err.value)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    with HostLock(path, timeout=1):
        pass  # released when the holder died


def test_a_later_converged_apply_on_the_node_resolves_an_unfinished_plan(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    j.append({"event": "plan-start", "plan_id": "old", "node": "n1", "actions": 3})
    j.append({"event": "plan-start", "plan_id": "other", "node": "n2", "actions": 1})
    j.append({"event": "plan-start", "plan_id": "new", "node": "n1", "actions": 2})
    j.append({"event": "plan-end", "plan_id": "new", "node": "n1", "outcome": "failed"})
    assert {u.plan_id for u in j.unfinished()} == {"old", "other"}
    j.append({"event": "plan-start", "plan_id": "last", "node": "n1", "actions": 2})
    j.append({"event": "plan-end", "plan_id": "last", "node": "n1", "outcome": "converged"})
    assert [u.plan_id for u in j.unfinished()] == ["other"]


def _journal(tmp_path: Path, *records: dict[str, object], tail: str = "") -> Journal:
    path = tmp_path / "j.jsonl"
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write(tail)
    return Journal(path)


def test_an_interrupted_apply_then_a_complete_one_on_the_node(tmp_path: Path) -> None:
    """history lists both applies; the complete one re-planned, so nothing is unfinished."""
    j = _journal(
        tmp_path,
        {"event": "plan-start", "plan_id": "p1", "node": "n1", "ts": 1.0, "actions": 3},
        {"event": "action", "plan_id": "p1", "node": "n1", "address": "gpu[a].vgpu[1]"},
        {"event": "plan-start", "plan_id": "p2", "node": "n1", "ts": 2.0, "actions": 2},
        {"event": "action", "plan_id": "p2", "node": "n1", "address": "gpu[a].vgpu[2]"},
        {"event": "action", "plan_id": "p2", "node": "n1", "address": "gpu[a].vgpu[3]"},
        {"event": "plan-end", "plan_id": "p2", "node": "n1", "outcome": "converged"},
    )
    first, second = j.applies()
    assert (first.plan_id, first.ended, len(first.steps), first.total) == ("p1", False, 1, 3)
    assert (second.plan_id, second.ended, second.outcome) == ("p2", True, "converged")
    assert [s.address for s in second.steps] == ["gpu[a].vgpu[2]", "gpu[a].vgpu[3]"]
    assert j.unfinished() == []


def test_an_apply_started_after_the_settling_one_stays_unfinished(tmp_path: Path) -> None:
    j = _journal(
        tmp_path,
        {"event": "plan-start", "plan_id": "p1", "node": "n1"},
        {"event": "plan-start", "plan_id": "p2", "node": "n1"},
        {"event": "plan-end", "plan_id": "p2", "node": "n1", "outcome": "partial"},
        {"event": "plan-start", "plan_id": "p3", "node": "n1", "actions": 1},
        {"event": "action", "plan_id": "p3", "node": "n1", "address": "gpu[a].vgpu[1]"},
    )
    [u] = j.unfinished()
    assert (u.plan_id, u.done, u.total, u.last_action) == ("p3", 1, 1, "gpu[a].vgpu[1]")
    ended = [(a.plan_id, a.ended) for a in j.applies()]
    assert ended == [("p1", False), ("p2", True), ("p3", False)]


def test_an_apply_killed_while_writing_its_end_is_unfinished(tmp_path: Path) -> None:
    j = _journal(
        tmp_path,
        {"event": "plan-start", "plan_id": "p1", "node": "n1", "actions": 1},
        {"event": "action", "plan_id": "p1", "node": "n1", "address": "gpu[a].vgpu[1]"},
        tail='{"event": "plan-end", "plan_id": "p1", "outc',
    )
    [u] = j.unfinished()
    assert (u.plan_id, u.done) == ("p1", 1)
    [a] = j.applies()
    assert (a.ended, len(a.steps)) == (False, 1)
    assert j.warnings == []  # a torn last line is expected after a crash


def test_a_last_record_without_its_newline_still_counts(tmp_path: Path) -> None:
    j = _journal(
        tmp_path,
        {"event": "plan-start", "plan_id": "p1", "node": "n1", "actions": 0},
        tail='{"event": "plan-end", "plan_id": "p1", "node": "n1", "outcome": "converged"}',
    )
    assert j.unfinished() == []
    assert [(a.ended, a.outcome) for a in j.applies()] == [(True, "converged")]


def test_null_start_fields_read_as_missing(tmp_path: Path) -> None:
    """A plan-start with null time and count (hand-edited or from another writer) is still
    an unfinished plan to report, not a crash of apply or the agent."""
    j = _journal(tmp_path, {"event": "plan-start", "plan_id": "p1", "ts": None, "actions": None})
    [u] = j.unfinished()
    assert (u.plan_id, u.started, u.total, u.done) == ("p1", 0.0, 0, 0)
    [a] = j.applies()
    assert (a.started, a.total, a.ended) == (None, None, False)
