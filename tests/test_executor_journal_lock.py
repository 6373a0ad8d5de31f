"""The journal (audit trail, unfinished plans) and the host lock (no interleaving applies)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from vgpu_state.executor import HostLock, Journal, LockTimeoutError


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
            "from vgpu_state.executor import HostLock\n"
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
