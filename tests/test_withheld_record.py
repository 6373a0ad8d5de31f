"""What an enforcing agent records of the vGPUs it withholds, and what ``scan`` makes of it.

The agent half: ``reconcile_once`` on a simulated A2 (the agent's reconcile, with the
recorder the agent wires to ``withheld.json`` in its state directory) writes the set
with why while a switch is pending under ``in-use: evacuate``, and removes the file
once nothing is withheld. The ``scan`` half: ``vgpu-state scan --sim`` reads the file
beside the spec (a simulated node's state directory) and marks the vGPUs it still
finds with the same type; a file it cannot use is a warning and a normal scan.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.withhold_support import (
    FREE_4A,
    FREE_4Q,
    GPU,
    HELD_4C,
    KEEP,
    NODE,
    SWITCH,
    VM_HOLDER,
    a2_host,
    config,
    settings,
)
from vgpu_state.cli.main import cli
from vgpu_state.model.plan import Plan
from vgpu_state.model.withheld import WithheldRecord, WithheldVgpu
from vgpu_state.reconcile import Mode, Ports, publish, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.statefiles import StateDir, WithheldFile, WithheldRecorder
from vgpu_state.testing import FakeCluster, RecordingDevicePlugin

T0 = datetime.datetime(2026, 11, 29, 0, 30, tzinfo=datetime.UTC).timestamp()
WAITS = f"switch deferred: waits for {VM_HOLDER}"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        self.now += 60.0
        return self.now


def _recorder(path: Path, warnings: list[str]) -> WithheldRecorder:
    return WithheldRecorder(WithheldFile(path), warnings.append, Clock())


def _reconcile(
    host: SimHost,
    cluster: FakeCluster,
    layout: str,
    recorder: WithheldRecorder,
    *,
    policy: str = "evacuate",
    mode: Mode = Mode.APPLY,
    gate: object = None,
) -> tuple[Ports, RecordingDevicePlugin]:
    plugin = RecordingDevicePlugin()
    ports = Ports(
        host, cluster, config(layout, policy), plugin, RecordingDevicePlugin(), withheld=recorder
    )
    reconcile_once(
        ports,
        settings(),
        mode=mode,
        config_name="a2",
        skip_blocked=True,
        gate=gate,  # type: ignore[arg-type]
    )
    return ports, plugin


def _read(path: Path) -> WithheldRecord:
    return WithheldRecord.parse(path.read_text())


# the agent's half ---------------------------------------------------------------------


def test_a_deferred_switch_records_the_withheld_vgpus_with_why_and_a_revert_removes_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state" / "withheld.json"
    warnings: list[str] = []
    recorder = _recorder(path, warnings)
    host = SimHost(a2_host(tmp_path))
    cluster = FakeCluster(NODE, in_use={HELD_4C: VM_HOLDER})
    try:
        _, plugin = _reconcile(host, cluster, SWITCH, recorder)
        record = _read(path)
        assert record.written == "2026-11-29T00:31:00Z"
        assert record.snapshot_fingerprint == host.scan().fingerprint()
        assert [(v.key, v.gpu, v.type, v.config) for v in record.vgpus] == [
            (FREE_4A, GPU, "A2-4A", "a2"),
            (FREE_4Q, GPU, "A2-4Q", "a2"),
        ]
        assert {v.reason for v in record.vgpus} == {f"{WAITS}; to be moved: default/win-1"}, (
            record.vgpus[0].reason
        )
        # The file holds what the device plugin was told, no more, no less.
        assert plugin.withheld[-1] == {v.key for v in record.vgpus}

        # The same set again: the file is left as it is (not rewritten every reconcile).
        _reconcile(host, cluster, SWITCH, recorder)
        assert _read(path).written == "2026-11-29T00:31:00Z"

        # Reverted: nothing is withheld, the file is gone.
        _, plugin = _reconcile(host, cluster, KEEP, recorder)
        assert plugin.withheld[-1] == frozenset()
        assert not path.exists()
        assert warnings == []
    finally:
        host.close()


def test_a_plan_waiting_for_a_rollout_slot_records_a_planned_switch(tmp_path: Path) -> None:
    path = tmp_path / "withheld.json"
    warnings: list[str] = []
    host = SimHost(a2_host(tmp_path))
    try:

        def no_slot(plan: Plan) -> bool:
            # Asked after the device plugin was told: the file says so already.
            assert {v.reason for v in _read(path).vgpus} == {"switch planned"}
            return False

        _reconcile(host, FakeCluster(NODE), SWITCH, _recorder(path, warnings), gate=no_slot)
        record = _read(path)
        assert {v.key for v in record.vgpus} == {HELD_4C, FREE_4Q, FREE_4A}
        assert {v.reason for v in record.vgpus} == {"switch planned; waiting for a rollout slot"}
        assert warnings == []
    finally:
        host.close()


def test_plan_only_and_protect_record_nothing_and_clear_an_old_record(tmp_path: Path) -> None:
    path = tmp_path / "withheld.json"
    warnings: list[str] = []
    recorder = _recorder(path, warnings)
    host = SimHost(a2_host(tmp_path))
    cluster = FakeCluster(NODE, in_use={HELD_4C: VM_HOLDER})
    try:
        _reconcile(host, cluster, SWITCH, recorder, policy="protect")
        assert not path.exists()
        _reconcile(host, cluster, SWITCH, recorder, mode=Mode.PLAN)
        assert not path.exists()  # planning alone records nothing

        _reconcile(host, cluster, SWITCH, recorder)
        assert path.exists()
        # The agent switched to plan-only: it withholds nothing, and says so.
        ports = Ports(host, cluster, config(SWITCH), withheld=recorder)
        report = reconcile_once(ports, settings(), mode=Mode.PLAN, config_name="a2")
        publish(ports, report, enforcing=False)
        assert not path.exists()
        assert warnings == []
    finally:
        host.close()


def test_a_record_path_that_is_a_symlink_is_left_alone_with_one_warning(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("precious\n")
    path = tmp_path / "withheld.json"
    path.symlink_to(target)
    warnings: list[str] = []
    recorder = _recorder(path, warnings)
    host = SimHost(a2_host(tmp_path))
    cluster = FakeCluster(NODE, in_use={HELD_4C: VM_HOLDER})
    try:
        _, plugin = _reconcile(host, cluster, SWITCH, recorder)
        _reconcile(host, cluster, SWITCH, recorder)
    finally:
        host.close()
    assert plugin.withheld[-1] == {FREE_4A, FREE_4Q}  # withholding does not depend on it
    assert target.read_text() == "precious\n" and path.is_symlink()
    assert len(warnings) == 1 and "is a symlink; refusing to replace it" in warnings[0]


def test_a_holder_named_with_control_characters_or_at_length_is_recorded_fitted(
    tmp_path: Path,
) -> None:
    """A holder's name comes from the kubelet, a claim or a process's ``/proc`` entry: what
    the record says of it is fitted to the record's bounds, never a failed reconcile."""
    path = tmp_path / "withheld.json"
    warnings: list[str] = []
    host = SimHost(a2_host(tmp_path))
    holder = "process 4242 (\x1b[31mqemu" + "x" * 5000 + ")"
    try:
        _reconcile(
            host, FakeCluster(NODE, in_use={HELD_4C: holder}), SWITCH, _recorder(path, warnings)
        )
    finally:
        host.close()
    (reason,) = {v.reason for v in _read(path).vgpus}
    assert reason.startswith("switch deferred: waits for process 4242 (?[31mqemuxxx")
    assert len(reason) == 4096 and reason.endswith("…")
    assert warnings == []


# scan's half --------------------------------------------------------------------------


def _scan(spec: Path, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(
        cli, ["scan", "--sim", str(spec), *args], env={"COLUMNS": "250", "NO_COLOR": "1"}
    )
    return r.exit_code, r.stdout, r.stderr


def _rows(text: str, field: str) -> list[str]:
    """The lines of one field of the scan tables (the field's row and its continuations)."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) < 4:
            inside = False
            continue
        if cells[1]:
            inside = cells[1] == field
        if inside:
            out.append(cells[2])
    return out


def _agent_records(spec: Path) -> Path:
    """What the node's enforcing agent leaves in the simulated node's state directory
    while the A2's switch waits for the VM holding its A2-4C."""
    path = StateDir.beside(spec).withheld
    host = SimHost(spec)
    try:
        cluster = FakeCluster(NODE, in_use={HELD_4C: VM_HOLDER})
        _reconcile(host, cluster, SWITCH, _recorder(path, []))
    finally:
        host.close()
    return path


def test_scan_marks_the_recorded_withheld_vgpus_with_why(tmp_path: Path) -> None:
    spec = a2_host(tmp_path)
    _agent_records(spec)
    code, out, err = _scan(spec)
    assert code == 0, err
    why = (
        f"withheld ({WAITS}; to be moved: default/win-1; config a2; "
        "recorded by the agent at 2026-11-29T00:31:00Z)"
    )
    assert _rows(out, "withheld") == [f"{FREE_4A}: {why}", f"{FREE_4Q}: {why}"]
    assert "withheld: A2-4A ×1, A2-4Q ×1 (free, not offered" in out

    code, out, err = _scan(spec, "-o", "json")
    assert code == 0, err
    data = json.loads(out)
    marks = {v["uuid"]: v.get("withheld") for v in data["gpus"][0]["vgpus"]}
    assert marks[HELD_4C] is None
    assert (
        marks[FREE_4Q]
        == marks[FREE_4A]
        == {
            "reason": f"{WAITS}; to be moved: default/win-1",
            "config": "a2",
            "recorded_at": "2026-11-29T00:31:00Z",
        }
    )
    assert data["withheld"]["types"] == {"A2-4A": 1, "A2-4Q": 1}
    assert data["withheld"]["recorded_at"] == "2026-11-29T00:31:00Z"
    assert data["withheld"]["snapshot_fingerprint"]


def test_scan_ignores_recorded_vgpus_that_are_gone_or_changed_type(tmp_path: Path) -> None:
    spec = a2_host(tmp_path)
    code, plain, err = _scan(spec, "-o", "json")
    assert code == 0, err
    record = WithheldRecord(
        written="2026-11-29T00:31:00Z",
        vgpus=(
            WithheldVgpu(key=FREE_4Q, gpu=GPU, type="A2-2Q", reason="switch planned"),
            WithheldVgpu(
                key="00000000-0000-0000-0000-000000000000",
                gpu=GPU,
                type="A2-4Q",
                reason="switch planned",
            ),
            WithheldVgpu(key=FREE_4A, gpu="0000:09:00.0", type="A2-4A", reason="switch planned"),
        ),
    )
    StateDir.beside(spec).withheld.write_text(record.dumps())
    code, out, err = _scan(spec, "-o", "json")
    assert code == 0 and err == "", err
    assert out == plain  # the host's read wins: nothing of the record is shown
    code, out, err = _scan(spec)
    assert code == 0, err
    assert "withheld" not in out


def _deep(path: Path) -> None:
    path.write_text('{"format_version": 1, "vgpus": ' + "[" * 100_000 + "]" * 100_000 + "}")


def _huge(path: Path) -> None:
    path.write_text(" " * (1024 * 1024 + 1))


def _wrong_types(path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "format_version": 1,
                "written": 5,
                "vgpus": [{"key": FREE_4Q, "gpu": GPU, "type": "A2-4Q", "reason": ["x"]}],
            }
        )
    )


def _unknown_field(path: Path) -> None:
    path.write_text(json.dumps({"format_version": 1, "written": "now", "run": "rm -rf /"}))


def _many(path: Path) -> None:
    entry = {"key": FREE_4Q, "gpu": GPU, "type": "A2-4Q", "reason": "r"}
    path.write_text(json.dumps({"format_version": 1, "written": "now", "vgpus": [entry] * 5000}))


def _escape(path: Path) -> None:
    entry = {"key": FREE_4Q, "gpu": GPU, "type": "A2-4Q", "reason": "\x1b[2J\x1b[31mgone"}
    path.write_text(json.dumps({"format_version": 1, "written": "now", "vgpus": [entry]}))


def _not_json(path: Path) -> None:
    path.write_bytes(b"\xff\xfe not json")


def _symlink(path: Path) -> None:
    target = path.with_name("elsewhere.json")
    target.write_text(WithheldRecord(written="now").dumps())
    path.symlink_to(target)


def _directory(path: Path) -> None:
    path.mkdir()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (_deep, "nested more than 64 levels deep"),
        (_huge, "larger than 1048576 bytes"),
        (_wrong_types, "written: Input should be a valid string"),
        (_unknown_field, "run: Extra inputs are not permitted"),
        (_many, "vgpus: Tuple should have at most 4096 items"),
        (_escape, "vgpus.0.reason: String should match pattern"),
        (_not_json, "not valid JSON (not UTF-8)"),
        (_symlink, "is a symlink"),
        (_directory, "is a directory"),
        (_fifo, "is a FIFO"),
    ],
)
def test_a_record_scan_cannot_use_is_a_warning_and_the_scan_is_as_without_it(
    tmp_path: Path, make: object, says: str
) -> None:
    spec = a2_host(tmp_path)
    code, plain, err = _scan(spec, "-o", "json")
    assert code == 0 and err == "", err
    path = StateDir.beside(spec).withheld
    make(path)  # type: ignore[operator]
    for output in ("json", "text"):
        code, out, err = _scan(spec, "-o", output)
        assert code == 0, err
        assert err.startswith(f"warning: {path}: ") and err.rstrip().endswith("; ignored"), err
        assert says in err, err
        assert len(err) < 600, err
        if output == "json":
            assert out == plain
        else:
            assert "withheld" not in out
