"""The simulator under hostile use: walking and copying the FUSE mount, a dead mount,
the simulated state when saving or verifying fails, model ids, extra PCI devices."""

from __future__ import annotations

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
from vgpu_state.sim.fuse import mounted
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import SpecError, parse_spec
from vgpu_state.statefiles import Journal

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "examples" / "mixed-node.yaml"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.mark.fuse
@pytest.mark.usefixtures("require_fuse")
def test_the_whole_mount_can_be_listed_walked_and_copied(tmp_path: Path) -> None:
    with mounted(REPO / "configs" / "sim" / "mixed.yaml", tmp_path / "mnt") as m:
        names = os.listdir(m.root)
        assert "" not in names and {"bus", "class", "devices"} <= set(names)
        ls = subprocess.run(["ls", "-la", str(m.root)], capture_output=True, text=True)
        assert ls.returncode == 0, ls.stderr
        find = subprocess.run(["find", str(m.root)], capture_output=True, text=True)
        assert find.returncode == 0, find.stderr
        assert f"{m.root}/bus/pci/devices/0000:08:00.0" in find.stdout.splitlines()
        copy = subprocess.run(
            ["cp", "-a", str(m.root), str(tmp_path / "copy")], capture_output=True, text=True
        )
        # As on a real sysfs, write-only attributes (create, remove) cannot be read and
        # some attributes of a free VF fail with ENXIO; every directory can be read.
        expected = ("Permission denied", "No such device or address")
        unexpected = [
            line for line in copy.stderr.splitlines() if not any(e in line for e in expected)
        ]
        assert unexpected == [], copy.stderr
    vendor = tmp_path / "copy" / "bus" / "pci" / "devices" / "0000:08:00.0" / "vendor"
    assert vendor.read_text() == "0x10de\n"


@pytest.mark.fuse
@pytest.mark.usefixtures("require_fuse")
def test_a_dead_mount_fails_plan_apply_and_assert(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    spec = tmp_path / "node.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", spec)
    with mounted(spec, mnt):
        pids = [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and _is_server_of(int(p), str(mnt))
        ]
        assert pids, "the FUSE server process was not found"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            _wait_gone(pid)
        with pytest.raises(OSError) as info:
            os.listdir(mnt)
        assert info.value.strerror == "Transport endpoint is not connected"
        journal = tmp_path / "journal.jsonl"
        for command in ("plan", "assert", "apply"):
            extra = ["--auto-approve", "--lock-file", str(tmp_path / "lock")]
            r = run(command, "-f", str(CONFIG), "-c", "mixed", "--sysfs-root", str(mnt),
                    "--journal", str(journal), *(extra if command == "apply" else []))
            assert r.exit_code == 1, (command, r.output)
            assert (
                "Transport endpoint is not connected" in r.stderr
                or f"'{mnt}' is not readable" in r.stderr
            ), r.stderr
            assert "matches" not in r.stdout and "No changes" not in r.stdout
        assert not journal.exists()


def _is_server_of(pid: int, mnt: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"mount" in cmdline and mnt.encode() in cmdline and pid != os.getpid()


def _wait_gone(pid: int) -> None:
    import time

    for _ in range(200):
        if not Path(f"/proc/{pid}").exists():
            return
        stat = Path(f"/proc/{pid}/stat").read_text().split()
        if stat[2] == "Z":
            return
        time.sleep(0.05)


def _vgpus(spec: Path) -> set[str]:
    with SimHost(spec, in_memory=True) as host:
        return {v.key for g in host.scan().gpus for v in g.vgpus}


_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["vgpu-state", *sys.argv[2:]]
from vgpu_state.cli.main import main
main()
"""


def test_sim_state_survives_a_failed_journal_write(tmp_path: Path) -> None:
    """The journal's disk fills up mid-apply: the changes made stay in the spec."""
    spec = tmp_path / "node.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", spec)
    before = _vgpus(spec)
    journal = tmp_path / "journal.jsonl"
    limit = 2048  # every file this process writes: room for the spec and a few records
    assert len(spec.read_bytes()) < limit
    done = subprocess.run(
        [sys.executable, "-c", _LIMITED, str(limit), "apply", "-f", str(CONFIG), "--sim",
         str(spec), "--auto-approve", "--journal", str(journal)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    records = list(Journal(journal).records())  # the last line was torn by the full disk
    done_steps = [r for r in records if r.get("event") == "action" and r["outcome"] == "ok"]
    assert done_steps, records
    assert _vgpus(spec) != before, "the simulated changes were lost"


def test_a_failed_spec_save_is_never_journalled_as_converged(tmp_path: Path) -> None:
    spec_dir = tmp_path / "ro"
    spec_dir.mkdir()
    spec = spec_dir / "node.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", spec)
    journal = tmp_path / "journal.jsonl"
    lock = tmp_path / "lock"
    # In a private mount namespace the spec's directory is read-only: saving fails.
    script = (
        f"mount --bind {spec_dir} {spec_dir} && mount -o remount,ro,bind {spec_dir} && "
        f"{sys.executable} -m vgpu_state.cli.main apply -f {CONFIG} --sim {spec} "
        f"--auto-approve --journal {journal} --lock-file {lock}"
    )
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                          text=True, timeout=120)
    if "mount:" in done.stderr:
        pytest.skip(f"cannot bind-mount read-only here: {done.stderr.strip()}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert all(rec.get("outcome") != "converged" for rec in records)
    assert records[-1]["event"] == "plan-end" and records[-1]["outcome"] == "failed"


def test_a_shared_device_id_as_model_names_both_models() -> None:
    with pytest.raises(SpecError) as info:
        text = "node: n\ngpus:\n  - {address: '08:00.0', model: '0x25b6'}\n"
        parse_spec(text, "s.yaml", catalog=CATALOG)
    message = str(info.value)
    assert "0x25b6 is the device id of A2 and A16" in message
    assert "model: A2 or model: A16" in message


def test_extra_pci_devices_look_like_real_pci_functions(tmp_path: Path) -> None:
    with SimHost(REPO / "configs" / "sim" / "a2-host.yaml", tmp_path / "sys") as host:
        devices = Path(host.root) / "bus" / "pci" / "devices"
        for device in sorted(devices.iterdir()):
            for attribute in (
                "vendor",
                "device",
                "class",
                "numa_node",
                "resource",
                "subsystem_vendor",
                "subsystem_device",
                "config",
            ):
                assert (device / attribute).exists(), f"{device.name} lacks {attribute}"
            config = (device / "config").read_bytes()
            vendor = int((device / "vendor").read_text(), 16)
            assert int.from_bytes(config[0:2], "little") == vendor
