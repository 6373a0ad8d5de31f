"""The FUSE frontend: plain open()/write() by any process reach the simulated driver.

Each mount is a child process; the tests keep the number of mounts small.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.host import SysfsHost
from vgpu_state.model.errors import DeviceBusyError, DriverError
from vgpu_state.ports import HostPort
from vgpu_state.sim.fuse import mounted
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import load_spec

CATALOG = default_catalog()

pytestmark = [pytest.mark.fuse, pytest.mark.usefixtures("require_fuse")]

U_BUSY = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"
U_FREE = "c728e022-f16f-434b-ad2c-9665ee634d3d"
U_NEW = "0f0e0d0c-0b0a-4908-8706-050403020100"


def _os_errno(fn: Callable[[], object]) -> int:
    with pytest.raises(OSError) as info:
        fn()
    return info.value.errno or 0


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def test_every_example_spec_scans_equal_through_fuse(
    sim_spec_paths: list[Path], tmp_path: Path
) -> None:
    for i, path in enumerate(sim_spec_paths):
        with SimHost(path) as host:
            expected = host.scan()
            smi = host.sysfs.driver.nvidia_smi_installed
        with mounted(path, tmp_path / f"m{i}") as m:
            # A spec with nvidia-smi: its modes come through the stand-in's command line.
            real = SysfsHost(
                str(m.root),
                expected.node,
                "",
                catalog=CATALOG,
                nvidia_smi=m.nvidia_smi_command() if smi else "",
            )
            got = real.scan()
        assert got.model_copy(update={"sysfs_root": expected.sysfs_root}) == expected, path.name


def _apply_sequence(host: HostPort) -> list[str]:
    """Run every driver operation (and some refusals) on the mixed node; return the outcomes."""
    outcomes: list[str] = []

    def attempt(name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
            outcomes.append(f"{name}: ok")
        except DriverError as e:
            outcomes.append(f"{name}: {type(e).__name__} {errno.errorcode[e.errno]}")

    attempt("remove busy", lambda: host.remove_mdev(U_BUSY))
    attempt("create 8Q next to 4 GB", lambda: host.create_mdev("0000:08:00.6", 747, U_NEW))
    attempt("create 4A", lambda: host.create_mdev("0000:08:00.6", 751, U_NEW))
    attempt("create duplicate", lambda: host.create_mdev("0000:08:00.7", 751, U_NEW))
    attempt("remove 4A", lambda: host.remove_mdev(U_NEW))
    attempt("T4 remove", lambda: host.remove_mdev("9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"))
    attempt("T4 create 16Q", lambda: host.create_mdev("0000:3b:00.0", 234, U_FREE))
    attempt("L40S set occupied", lambda: host.set_vf_type("0000:81:00.6", 1150))
    attempt("L40S set other size", lambda: host.set_vf_type("0000:81:00.4", 1150))
    attempt("L40S set 12Q", lambda: host.set_vf_type("0000:81:00.4", 1153))
    attempt("L40S clear", lambda: host.clear_vf_type("0000:81:00.6"))
    attempt("A2 sriov disable (in use)", lambda: host.disable_sriov("0000:08:00.0"))
    attempt("L40S sriov enable again", lambda: host.enable_sriov("0000:81:00.0"))
    return outcomes


def test_driver_operations_match_in_process(sim_spec_paths: list[Path], tmp_path: Path) -> None:
    spec_path = next(p for p in sim_spec_paths if p.name == "mixed.yaml")
    with SimHost(spec_path) as sim:
        expected_outcomes = _apply_sequence(sim)
        expected = sim.scan()
        expected_spec = sim.to_spec()
    work = tmp_path / "node.yaml"
    work.write_text(spec_path.read_text())
    with mounted(work, tmp_path / "mnt", save=True) as m:
        host = SysfsHost(
            str(m.root), expected.node, sriov_manage=m.sriov_manage_command(), catalog=CATALOG
        )
        outcomes = _apply_sequence(host)
        got = host.scan()
    assert outcomes == expected_outcomes
    assert "remove busy: DeviceBusyError EBUSY" in outcomes
    assert "A2 sriov disable (in use): DeviceBusyError EBUSY" in outcomes
    assert got.model_copy(update={"sysfs_root": expected.sysfs_root}) == expected
    assert load_spec(work, catalog=CATALOG) == expected_spec  # --save wrote the final state back


def test_errno_values_through_plain_system_calls(
    sim_spec_paths: list[Path], tmp_path: Path
) -> None:
    spec_path = next(p for p in sim_spec_paths if p.name == "mixed.yaml")
    with mounted(spec_path, tmp_path / "mnt") as m:
        r = m.root
        types = r / "bus/pci/devices/0000:08:00.7/mdev_supported_types"
        assert (
            _os_errno(lambda: _write(r / f"bus/mdev/devices/{U_BUSY}/remove", "1\n")) == errno.EBUSY
        )
        assert (
            _os_errno(lambda: _write(types / "nvidia-746/create", "not-a-uuid\n")) == errno.EINVAL
        )
        assert _os_errno(lambda: _write(types / "nvidia-746/create", U_BUSY + "\n")) == errno.EEXIST
        assert _os_errno(lambda: _write(types / "nvidia-747/create", U_NEW + "\n")) == errno.EINVAL
        vf = r / "bus/pci/devices/0000:81:00.4/nvidia"
        assert _os_errno(lambda: (vf / "gpu_instance_id").read_text()) == errno.ENXIO
        assert _os_errno(lambda: _write(vf / "current_vgpu_type", "abc")) == errno.EINVAL
        assert _os_errno(lambda: _write(vf / "current_vgpu_type", "1147")) == errno.EIO
        busy_vf = r / "bus/pci/devices/0000:81:00.6/nvidia"
        assert (busy_vf / "current_vgpu_type").read_text() == "1153\n"
        assert _os_errno(lambda: _write(busy_vf / "current_vgpu_type", "1153")) == errno.EBUSY
        assert (busy_vf / "creatable_vgpu_types").read_text() == "ID    : vGPU Name\n"
        assert (busy_vf / "placement_id").read_text().strip().isdigit()
        numvfs = r / "bus/pci/devices/0000:08:00.0/sriov_numvfs"
        assert _os_errno(lambda: _write(numvfs, "0")) == errno.ENOENT
        assert _os_errno(lambda: _write(numvfs, "99")) == errno.ERANGE
        assert _os_errno(lambda: (types / "nvidia-746/create").read_text()) == errno.EACCES
        assert os.stat(types / "nvidia-746/create").st_mode & 0o777 == 0o200
        assert (
            _os_errno(lambda: _write(r / "bus/pci/devices/0000:08:00.0/vendor", "1"))
            == errno.EACCES
        )
        assert _os_errno(lambda: _write(r / "bus/pci/devices/new-file", "1")) in (
            errno.EACCES, errno.ENOENT,
        )  # fmt: skip
        # A successful create through the shell, seen by a later read.
        before = (types / "nvidia-746/available_instances").read_text()
        subprocess.run(["sh", "-c", f"echo {U_NEW} > {types}/nvidia-746/create"], check=True)
        assert before == "1\n"
        assert (types / "nvidia-746/available_instances").read_text() == "0\n"
        assert os.path.isdir(r / f"bus/mdev/devices/{U_NEW}")
        # The simulated sriov-manage command.
        cmd = [*m.sriov_manage_command(), "-e", "0000:08:00.0"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert done.returncode == 0 and "already has VFs enabled" in done.stdout
        cmd = [*m.sriov_manage_command(), "-d", "0000:08:00.0"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert done.returncode == 1 and "unbindLock" in done.stderr


def test_typed_error_from_sysfs_host(sim_spec_paths: list[Path], tmp_path: Path) -> None:
    spec_path = next(p for p in sim_spec_paths if p.name == "a2-host.yaml")
    with mounted(spec_path, tmp_path / "mnt") as m:
        with pytest.raises(DeviceBusyError) as info:
            SysfsHost(str(m.root), catalog=CATALOG).remove_mdev(U_BUSY)
        assert info.value.path.endswith(f"{U_BUSY}/remove") and info.value.value == "1"
    assert not os.path.ismount(tmp_path / "mnt")
    assert sys.executable
