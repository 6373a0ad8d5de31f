"""`vgpu-state apply --sysfs-root MOUNT --sriov-manage CMD`: SR-IOV through a real command.

The simulated sysfs is FUSE-mounted; the driver rejects raw ``sriov_numvfs``
writes (ENOENT, as NVIDIA's driver does), so enabling the VFs only works
through the sriov-manage command the operator names.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.host import scan
from vgpu_state.sim.fuse import mounted

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent

LAYOUT = """\
version: v1
policy: {prune: true}
vgpu-configs:
  a16:
    - devices: all
      vgpu-devices: {A16-4Q: 4}
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", *args], capture_output=True, text=True
    )


@pytest.mark.usefixtures("require_fuse")
def test_apply_enables_sriov_through_sriov_manage(tmp_path: Path) -> None:
    config = tmp_path / "layout.yaml"
    config.write_text(LAYOUT)
    with mounted(REPO / "configs" / "sim" / "a16-board.yaml", tmp_path / "mnt") as m:
        root = str(m.root)
        before = scan(root, catalog=CATALOG)
        off = [g.address for g in before.gpus if g.sriov_numvfs == 0]
        assert off, "the example board has a GPU with its VFs off"
        common = [
            "-f", str(config), "-c", "a16", "--sysfs-root", root, "--node", "board",
            "--state-dir", str(tmp_path / "state"),
        ]  # fmt: skip
        without = cli("apply", *common, "--auto-approve", "--sriov-manage", "")
        assert without.returncode == 1
        assert "ENOENT" in without.stderr and "sriov_numvfs" in without.stderr
        command = shlex.join(m.sriov_manage_command())
        done = cli("apply", *common, "--auto-approve", "--sriov-manage", command)
        assert done.returncode == 0, done.stdout + done.stderr
        after = scan(root, catalog=CATALOG)
        for address in off:
            g = after.gpu(address)
            assert g is not None and g.sriov_numvfs == g.sriov_totalvfs
            assert sorted(v.type_name or "" for v in g.vgpus) == ["A16-4Q"] * 4
        assert cli("assert", *common[:-4]).returncode == 0
