"""Debian's mdevctl, a real mdev client, against the simulator's FUSE sysfs.

Each command runs in a private mount namespace (``unshare -m``) with the FUSE
mount bound over ``/sys``, so mdevctl reads and writes the simulated driver
exactly as it would a real one. Needs root, ``unshare`` and ``mdevctl``
(``.ci/run`` installs it); skipped with the reason otherwise, and failing under
``VGPU_STATE_REQUIRE_FUSE=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.host import scan
from vgpu_state.sim.fuse import Mount, mounted

CATALOG = default_catalog()

pytestmark = [pytest.mark.fuse, pytest.mark.usefixtures("require_fuse")]

REPO = Path(__file__).resolve().parent.parent
HELD = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"
NEW = "11111111-2222-4333-8444-555555555555"


def _unavailable() -> str | None:
    if shutil.which("mdevctl") is None:
        return "mdevctl not found (Debian package mdevctl)"
    if shutil.which("unshare") is None:
        return "unshare not found"
    if os.geteuid() != 0:
        return "needs root for a private mount namespace"
    return None


@pytest.fixture
def sim_sys(tmp_path: Path) -> Iterator[Mount]:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("VGPU_STATE_REQUIRE_FUSE") == "1":
            pytest.fail(f"mdevctl tests required but unusable: {reason}")
        print(f"skipping mdevctl test: {reason}")
        pytest.skip(reason)
    spec = tmp_path / "node.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", spec)
    with mounted(spec, tmp_path / "mnt") as m:
        yield m


def mdevctl(m: Mount, *args: str) -> subprocess.CompletedProcess[str]:
    """``mdevctl ARGS`` with the simulated sysfs bound over /sys in a private namespace."""
    quoted = " ".join(f"'{a}'" for a in args)
    script = f"mount --bind '{m.root}' /sys && exec mdevctl {quoted}"
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60
    )


def test_mdevctl_list_agrees_with_scan(sim_sys: Mount) -> None:
    done = mdevctl(sim_sys, "list", "--dumpjson")
    assert done.returncode == 0, done.stderr
    listed = {
        uuid: (parent, body["mdev_type"])
        for group in json.loads(done.stdout)
        for parent, devices in group.items()
        for device in devices
        for uuid, body in device.items()
    }
    snapshot = scan(str(sim_sys.root), "n", catalog=CATALOG)
    scanned = {
        v.uuid: (v.parent, f"nvidia-{v.type_id}")
        for g in snapshot.gpus
        for v in g.vgpus
        if v.kind == "mdev"
    }
    assert listed == scanned and HELD in listed


def test_mdevctl_types_agree_with_scan(sim_sys: Mount) -> None:
    done = mdevctl(sim_sys, "types")
    assert done.returncode == 0, done.stderr
    snapshot = scan(str(sim_sys.root), "n", catalog=CATALOG)
    t4 = snapshot.gpu("0000:3b:00.0")
    assert t4 is not None
    text = done.stdout
    block = text[text.index("0000:3b:00.0") :]
    for t in t4.pf_creatable:
        assert f"nvidia-{t.type_id}" in block
        entry = block[block.index(f"nvidia-{t.type_id}") :]
        assert f"Available instances: {t.available}" in entry.split("Description")[0]


def test_mdevctl_start_and_stop_get_the_drivers_answers(sim_sys: Mount) -> None:
    free_vf = "0000:08:00.6"
    started = mdevctl(sim_sys, "start", "-u", NEW, "-p", free_vf, "-t", "nvidia-746")
    assert started.returncode == 0, started.stderr
    snapshot = scan(str(sim_sys.root), "n", catalog=CATALOG)
    assert any(v.uuid == NEW and v.parent == free_vf for g in snapshot.gpus for v in g.vgpus)

    busy = mdevctl(sim_sys, "stop", "-u", HELD)
    assert busy.returncode != 0
    assert "Device or resource busy" in busy.stderr

    full = mdevctl(sim_sys, "start", "-u", "11111111-2222-4333-8444-000000000001",
                   "-p", "0000:08:00.4", "-t", "nvidia-746")
    assert full.returncode != 0
    assert "No available instances of nvidia-746 on 0000:08:00.4" in full.stderr

    stopped = mdevctl(sim_sys, "stop", "-u", NEW)
    assert stopped.returncode == 0, stopped.stderr
    snapshot = scan(str(sim_sys.root), "n", catalog=CATALOG)
    assert all(v.uuid != NEW for g in snapshot.gpus for v in g.vgpus)
