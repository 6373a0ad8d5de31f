"""Hostile input and faults through the CLI: state files, unreadable hosts, exit
codes, malformed files, size limits. Every case ends in one line, never a traceback."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.host.scan import parse_creatable_vgpu_types, scan
from vgpu_state.statefiles import HostLock, Journal

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "examples" / "mixed-node.yaml"


def run(*args: str, stdin: str | bytes | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin)


def no_traceback(r: Result) -> None:
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "node.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", path)
    return path


# state files ---------------------------------------------------------------------


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path: Path, spec: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "state").mkdir()
    lock = tmp_path / "state" / "apply.lock"
    lock.symlink_to(target)
    r = run("apply", "-f", str(CONFIG), "--sim", str(spec), "--auto-approve",
            "--state-dir", str(tmp_path / "state"))
    assert r.exit_code == 1
    assert "the host lock is a symlink; refusing to use it" in r.stderr
    assert target.read_text() == "keep me"
    no_traceback(r)


def test_a_symlinked_journal_is_refused(tmp_path: Path, spec: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "state").mkdir()
    journal = tmp_path / "state" / "journal.jsonl"
    journal.symlink_to(target)
    r = run("apply", "-f", str(CONFIG), "--sim", str(spec), "--auto-approve",
            "--state-dir", str(tmp_path / "state"))
    assert r.exit_code == 1
    assert "the journal is a symlink" in r.stderr
    assert target.read_text() == "keep me"


def test_a_fifo_as_lock_or_journal_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(Exception, match="is a FIFO; refusing"), HostLock(fifo, 0):
        pass
    with pytest.raises(Exception, match="is a FIFO; refusing"):
        list(Journal(fifo).records())
    with pytest.raises(Exception, match="is a FIFO; refusing"):
        Journal(fifo).append({"event": "plan-start"})


def test_the_lock_timeout_must_be_finite(spec: Path) -> None:
    before = spec.read_text()
    for value in ("inf", "nan", "-1"):
        r = run("apply", "-f", str(CONFIG), "--sim", str(spec), "--auto-approve",
                "--lock-timeout", value)
        assert r.exit_code == 1, value
        assert "lock-timeout" in r.stderr or "lock timeout" in r.stderr, r.stderr
        no_traceback(r)
    assert spec.read_text() == before


# exit codes ----------------------------------------------------------------------


def test_usage_errors_exit_1_not_2(spec: Path) -> None:
    r = run("plan", "--no-such-flag")
    assert r.exit_code == 1 and "No such option" in r.stderr
    r = run("assert", "-f", str(CONFIG), "--sim", str(spec), "--bogus")
    assert r.exit_code == 1
    r = run("history", "-n", "-3")
    assert r.exit_code == 1


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130(tmp_path: Path, spec: Path) -> None:
    lock = tmp_path / "held.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vgpu_state.cli.main", "apply", "-f", str(CONFIG), "--sim",
             str(spec), "--auto-approve", "--lock-file", str(lock), "--lock-timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            # A shell's background job starts with SIGINT ignored, and a child keeps
            # that: give the command the terminal's default, as a user's shell does.
            preexec_fn=_default_sigint,
        )
        # Ctrl-C while the apply waits for the lock: wait for it to say so (a fixed
        # sleep can land before it gets there on a loaded machine).
        assert proc.stderr is not None
        first = ""
        while "waiting up to" not in first:
            line = proc.stderr.readline()
            assert line, f"the apply ended before it waited for the lock: {first}"
            first += line
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=30)
        err = first + rest
    finally:
        os.close(fd)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err


# a host that cannot be read --------------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "apply", "assert"])
def test_a_missing_or_empty_sysfs_is_never_matches(tmp_path: Path, command: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for root in ("/nonexistent", str(empty)):
        extra = ["--auto-approve", "--lock-file", str(tmp_path / "lock")]
        r = run(command, "-f", str(REPO / "configs" / "default.yaml"), "--sysfs-root", root,
                "--journal", str(tmp_path / "j"), *(extra if command == "apply" else []))
        assert r.exit_code == 1, (root, r.output)
        assert "cannot read the host" in r.stderr
        assert "matches" not in r.stdout
    assert not (tmp_path / "j").exists()


def test_assert_where_the_gpus_fell_off_the_bus_says_no_gpus_found(tmp_path: Path) -> None:
    """The host reads fine (other PCI devices) but shows no NVIDIA GPU, while the config
    lays out vGPUs by device-filter: no entry applies and nothing differs, yet a health
    check built on assert must go red."""
    spec = tmp_path / "node.yaml"
    spec.write_text(
        "node: n1\nlabels: {nvidia.com/vgpu.config: default}\ngpus: []\nextra-pci-devices: 2\n"
    )
    r = run("assert", "-f", str(REPO / "configs" / "default.yaml"), "--sim", str(spec))
    assert r.exit_code == 1, r.output
    assert "Assertion failure: no NVIDIA GPUs found under /sim/sys on node n1" in r.stdout
    assert 'configuration "default" lays out vGPUs' in r.stdout
    assert "matches" not in r.stdout
    # A config that lays out no vGPU still matches a node without GPUs.
    empty = tmp_path / "empty.yaml"
    empty.write_text(
        "version: v1\nvgpu-configs:\n  default:\n    - devices: all\n      vgpu-devices: {}\n"
    )
    r = run("assert", "-f", str(empty), "--sim", str(spec))
    assert r.exit_code == 0 and "matches" in r.stdout, r.output


def test_assert_on_nonexistent_root_exits_1() -> None:
    r = run("assert", "--sysfs-root", "/nonexistent", "-f", str(REPO / "configs/default.yaml"))
    assert r.exit_code == 1


def test_an_unreadable_host_leaves_the_unfinished_warning_and_writes_no_record(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.jsonl"
    journal.write_text(json.dumps({"event": "plan-start", "plan_id": "p1", "node": "n",
                                   "config": "c", "actions": 3, "ts": 1.0}) + "\n")
    before = journal.read_text()
    r = run("apply", "-f", str(REPO / "configs/default.yaml"), "--sysfs-root", "/nonexistent",
            "--journal", str(journal), "--lock-file", str(tmp_path / "lock"), "--auto-approve")
    assert r.exit_code == 1
    assert journal.read_text() == before
    assert len(Journal(journal).unfinished()) == 1


class _DeadMount:
    """A file system whose every call fails as a dead FUSE mount does."""

    def _dead(self, path: str) -> OSError:
        return OSError(errno.ENOTCONN, os.strerror(errno.ENOTCONN), path)

    def read(self, path: str) -> bytes:
        raise self._dead(path)

    def readlink(self, path: str) -> str:
        raise self._dead(path)

    def listdir(self, path: str) -> list[str]:
        raise self._dead(path)

    def exists(self, path: str) -> bool:
        return False

    def lexists(self, path: str) -> bool:
        return False


def test_a_dead_mount_is_a_scan_error() -> None:
    snap = scan("/mnt/dead", "n", _DeadMount(), catalog=CATALOG)
    assert snap.error is not None and "Transport endpoint is not connected" in snap.error


def test_a_config_naming_a_gpu_that_is_not_on_the_node_is_skipped_or_under_strict_an_error(
    tmp_path: Path, spec: Path
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "version: v1\nvgpu-configs:\n  mixed:\n"
        "    - devices: [7]\n      vgpu-devices: {A2-4Q: 1}\n"
        "    - devices: ['0000:99:00.0']\n      vgpu-devices: {A2-4Q: 1}\n"
    )
    r = run("plan", "-f", str(config), "--sim", str(spec))
    assert r.exit_code == 0, r.stderr
    assert "entry [0] of mixed: no GPU 7 on this node, skipped" in r.stdout
    assert "entry [1] of mixed: no GPU 0000:99:00.0 on this node, skipped" in r.stdout
    for command in ("plan", "assert"):
        r = run(command, "-f", str(config), "--sim", str(spec), "--strict")
        assert r.exit_code == 1
        assert f"{config}:4:7: entry [0] of mixed: no GPU 7 on this node" in r.stderr
        assert f"{config}:6:7: entry [1] of mixed: no GPU 0000:99:00.0 on this node" in r.stderr


# malformed files -------------------------------------------------------------------


def test_malformed_journal_lines_are_skipped_with_a_warning(tmp_path: Path, spec: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    good = {"event": "plan-start", "plan_id": "p1", "node": "n", "config": "c",
            "actions": 1, "ts": 1.0}
    journal.write_bytes(
        json.dumps(good).encode() + b"\n"
        + b"\xff\xfe not json\n"
        + b'{"event": "action", "plan_id": "p1"}\n'
        + b'{"event": "plan-start", "plan_id": "p2", "ts": 1e300, "actions": "x"}\n'
        + b"[1, 2]\n"
    )
    r = run("history", "--journal", str(journal), "-v")
    assert r.exit_code == 0, r.output
    assert f"{journal}: line 2: skipped: not a JSON record" in r.stderr
    assert f"{journal}: line 3: skipped: address is missing" in r.stderr
    assert f"{journal}: line 4: skipped: actions has the wrong type" in r.stderr
    assert f"{journal}: line 5: skipped: not a JSON object" in r.stderr
    assert "plan p1" in r.stdout
    no_traceback(r)
    p = run("plan", "-f", str(CONFIG), "--sim", str(spec), "--journal", str(journal))
    assert p.exit_code == 0 and "line 2: skipped" in p.stderr


def test_history_n_0_prints_nothing(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    journal.write_text(json.dumps({"event": "plan-start", "plan_id": "p", "ts": 1.0}) + "\n")
    r = run("history", "--journal", str(journal), "-n", "0")
    assert r.exit_code == 0 and r.stdout == ""


def test_non_utf8_inputs_get_one_line(tmp_path: Path, spec: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"\xff\xfe\x00")
    r = run("plan", "-f", str(CONFIG), "--sim", str(spec), "--in-use-file", str(bad))
    assert r.exit_code == 1 and "not UTF-8" in r.stderr
    no_traceback(r)
    r = run("scan", "--sim", str(bad))
    assert r.exit_code == 1 and "not UTF-8" in r.stderr
    no_traceback(r)


def test_markup_in_sysfs_paths_and_values_is_printed_as_text(tmp_path: Path) -> None:
    from vgpu_state.sim.host import SimHost

    root = tmp_path / "[/bold]sys"
    with SimHost(REPO / "configs" / "sim" / "mixed.yaml", root):
        numa = root / "bus" / "pci" / "devices" / "0000:08:00.0" / "numa_node"
        numa.unlink()
        numa.write_text("[red]x[/red]\n")
        r = CliRunner().invoke(cli, ["scan", "--sysfs-root", str(root)], env={"COLUMNS": "500"})
    assert r.exit_code == 0, r.output
    flat = "".join(c for c in r.stdout if not c.isspace() and c != "│")  # undo wrapping
    assert "[/bold]sys" in flat and "'[red]x[/red]'" in flat
    no_traceback(r)


def test_a_5000_digit_type_id_never_raises(tmp_path: Path) -> None:
    huge = "9" * 5000
    assert parse_creatable_vgpu_types(f"{huge} : NVIDIA A2-4Q\n746 : NVIDIA A2-4Q\n") == (
        (746, "A2-4Q"),
    )
    gpu = tmp_path / "bus" / "pci" / "devices" / "0000:08:00.0"
    (gpu / "mdev_supported_types" / f"nvidia-{huge[:240]}").mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("class", "0x030200"), ("device", "0x25b6")):
        (gpu / name).write_text(value + "\n")
    snap = scan(str(tmp_path), "n", catalog=CATALOG)
    assert len(snap.gpus) == 1


# size limits and special files -----------------------------------------------------


def test_special_and_huge_config_files_are_refused(tmp_path: Path, spec: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args, message in (
        (["validate", "-f", "/dev/zero"], "/dev/zero:1:1: the config must be a regular file"),
        (["plan", "-f", str(fifo), "--sim", str(spec)], "not a FIFO"),
        (["apply", str(fifo)], "not a FIFO"),
    ):
        done = subprocess.run(  # reading /dev/zero or a FIFO would never end
            [sys.executable, "-m", "vgpu_state.cli.main", *args],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 1 and message in done.stderr
    big = tmp_path / "big.yaml"
    big.write_text("version: v1\n" + "#" * (5 * 1024 * 1024))
    r = run("validate", "-f", str(big))
    assert r.exit_code == 1 and "more than the limit of 4 MiB" in r.stderr


def test_an_alias_bomb_in_a_sim_spec_is_refused(tmp_path: Path) -> None:
    levels = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        levels.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("node: n\n" + "\n".join(levels) + "\ngpus: *a8\n")
    done = subprocess.run(  # expanding the aliases would take hours
        [sys.executable, "-m", "vgpu_state.cli.main", "scan", "--sim", str(bomb)],
        capture_output=True, text=True, timeout=120,
    )
    # Refused while parsing (every YAML text counts aliases as what they repeat), with
    # the file, line, column and limit named.
    assert done.returncode == 1, done.stderr
    assert f"{bomb}:7:" in done.stderr and "more than 150000 YAML nodes" in done.stderr


def test_extra_pci_devices_is_bounded(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text("node: n\nextra-pci-devices: 100000000\n")
    done = subprocess.run(  # rendering 10^8 devices would take hours
        [sys.executable, "-m", "vgpu_state.cli.main", "scan", "--sim", str(spec)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1 and "extra-pci-devices" in done.stderr


# small ones --------------------------------------------------------------------------


def test_whole_file_errors_are_at_line_1_column_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff")
    r = run("validate", "-f", str(bad))
    assert f"{bad}:1:1: not a UTF-8 text file" in r.stderr


def test_write_errors_name_the_file(spec: Path) -> None:
    r = run("plan", "-f", str(CONFIG), "--sim", str(spec), "--out", "/dev/full")
    assert r.exit_code == 1
    assert "/dev/full: cannot save the plan: No space left on device" in r.stderr


def test_stdin_cannot_be_read_twice(spec: Path) -> None:
    r = run("plan", "-f", "-", "--in-use-file", "-", "--sim", str(spec), stdin="")
    assert r.exit_code == 1 and "cannot both read standard input" in r.stderr


def test_select_refuses_the_same_gpu_twice() -> None:
    r = run("select", "-f", str(REPO / "configs/default.yaml"), "--node", "n",
            "--gpu", "08:00.0=A2", "--gpu", "0000:08:00.0=A2")
    assert r.exit_code == 1 and "is given twice" in r.stderr


def test_json_output_prints_a_json_error(tmp_path: Path, spec: Path) -> None:
    r = run("plan", "-f", str(tmp_path / "missing.yaml"), "--sim", str(spec), "-o", "json")
    assert r.exit_code == 1
    error = json.loads(r.stdout)["error"]
    assert error["reason"] == "ConfigInvalid" and "missing.yaml:1:1" in error["message"]
    r = run("scan", "--sysfs-root", "/nonexistent", "-o", "json")
    assert r.exit_code == 1
    assert "cannot read the host" in json.loads(r.stdout)["error"]
