"""A real process holding a vGPU's VFIO node open, on a FUSE-simulated node with no cluster.

The simulator serves each vGPU's VFIO node under ``.vgpu-sim/dev/vfio``; a
process that opens one holds that vGPU (the driver refuses to remove it, EBUSY)
until it closes it, and ``/proc/<pid>/fd`` shows the open file as for a QEMU.
``plan``, ``apply`` and ``assert`` read ``/proc`` on every run: the held vGPU
is blocked and named after the process, and nothing is destroyed on its GPU.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.host import scan
from vgpu_state.sim.fuse import mounted
from vgpu_state.sim.tree import VFIO_NODES

CATALOG = default_catalog()

SPEC = """\
node: a2-node
gpus:
  - address: "0000:08:00.0"
    model: A2
    layout: mdev
    sriov: true
    vf-iommu-group-base: 90
    vgpus:
      - {type: A2-4Q, uuid: f715f63c-0d00-4007-9c5a-b07b0c6c05de, vf: 0}
      - {type: A2-4Q, uuid: c728e022-f16f-434b-ad2c-9665ee634d3d, vf: 1}
      - {type: A2-4Q, uuid: 3deab9a4-200a-4c54-99b1-5eb0722d1d81, vf: 2}
"""

HELD = "c728e022-f16f-434b-ad2c-9665ee634d3d"

LAYOUT = """\
version: v1
vgpu-configs:
  a2-2q:
    - devices: all
      vgpu-devices: {A2-2Q: 8}
"""

# A stand-in for QEMU: opens the node, says so, and keeps it open until stdin closes.
HOLDER = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("open", flush=True)
sys.stdin.read()
os.close(fd)
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


@contextmanager
def qemu_holding(node: Path) -> Iterator[subprocess.Popen[str]]:
    """A process named like QEMU, with ``-name guest=win-7``, holding ``node`` open."""
    argv = ["qemu-system-x86_64", "-c", HOLDER, str(node), "-name", "guest=win-7,debug-threads=on"]
    proc = subprocess.Popen(
        argv, executable=sys.executable, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
        yield proc
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


def _group(root: Path, uuid: str) -> str:
    return os.path.basename(os.readlink(root / "bus" / "mdev" / "devices" / uuid / "iommu_group"))


@pytest.mark.usefixtures("require_fuse")
def test_plan_and_apply_see_a_process_holding_a_vgpu(tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text(SPEC)
    config = tmp_path / "layout.yaml"
    config.write_text(LAYOUT)
    with mounted(tmp_path / "node.yaml", tmp_path / "mnt") as m:
        common = [
            "-f", str(config), "-c", "a2-2q", "--sysfs-root", str(m.root),
            "--node", "a2-node",
        ]  # fmt: skip
        state = ["--state-dir", str(tmp_path / "state")]
        node = m.root / VFIO_NODES / _group(m.root, HELD)
        with qemu_holding(node) as qemu:
            # The simulated driver knows the vGPU is held, as a real one does.
            with pytest.raises(OSError) as busy:
                (m.root / "bus" / "mdev" / "devices" / HELD / "remove").write_text("1")
            assert busy.value.errno == errno.EBUSY

            plan = cli("plan", *common, "--detailed-exitcode")
            assert plan.returncode == 2, plan.stdout + plan.stderr
            holder = f"VM win-7 (process {qemu.pid}, qemu-system-x86_64)"
            assert HELD in plan.stdout and holder in plan.stdout, plan.stdout

            apply = cli("apply", *common, *state, "--auto-approve")
            assert apply.returncode == 1, apply.stdout + apply.stderr
            assert "blocked; nothing was changed" in apply.stderr
            assert holder in apply.stdout
            gpu = scan(str(m.root), catalog=CATALOG).gpus[0]
            assert len(gpu.vgpus) == 3, "nothing is destroyed on the held GPU"

            # A proc root with no such process (only an init) sees no holder.
            (tmp_path / "empty-proc" / "1").mkdir(parents=True)
            (tmp_path / "empty-proc" / "1" / "cmdline").write_bytes(b"/sbin/init\0")
            blind = cli("plan", *common, "--proc-root", str(tmp_path / "empty-proc"))
            assert holder not in blind.stdout and HELD in blind.stdout

        # The process is gone: the vGPU is free, and the plan no longer names it.
        after = cli("plan", *common)
        assert "qemu-system-x86_64" not in after.stdout, after.stdout
        assert "3 to destroy, 0 blocked" in after.stdout, after.stdout


@pytest.mark.usefixtures("require_fuse")
def test_a_process_holding_another_simulated_nodes_vgpu_holds_nothing_here(
    tmp_path: Path,
) -> None:
    """Two mounts of one spec have the same IOMMU group numbers: a process with one
    mount's VFIO node open holds that node's vGPU only."""
    (tmp_path / "node.yaml").write_text(SPEC)
    config = tmp_path / "layout.yaml"
    config.write_text(LAYOUT)
    with (
        mounted(tmp_path / "node.yaml", tmp_path / "a") as a,
        mounted(tmp_path / "node.yaml", tmp_path / "b") as b,
        qemu_holding(a.root / VFIO_NODES / _group(a.root, HELD)) as qemu,
    ):
        holder = f"process {qemu.pid}"
        here = cli("plan", "-f", str(config), "-c", "a2-2q", "--sysfs-root", str(a.root))
        there = cli("plan", "-f", str(config), "-c", "a2-2q", "--sysfs-root", str(b.root))
    assert holder in here.stdout, here.stdout
    assert holder not in there.stdout and "3 to destroy, 0 blocked" in there.stdout, there.stdout
