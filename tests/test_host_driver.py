"""Driver writes: exact path and value, O_WRONLY without O_CREAT, errno → typed errors."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.host import SysfsHost, driver
from vgpu_state.model.errors import (
    AlreadyExistsError,
    DeviceBusyError,
    DriverError,
    InterfaceMissingError,
    TypeNotCreatableError,
)
from vgpu_state.ports import HostPort

CATALOG = default_catalog()


def _attr(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_operations_write_the_documented_files(tmp_path: Path) -> None:
    r = str(tmp_path)
    create = _attr(tmp_path / "bus/pci/devices/0000:08:00.5/mdev_supported_types/nvidia-746/create")
    remove = _attr(tmp_path / "bus/mdev/devices/c728e022-f16f-434b-ad2c-9665ee634d3d/remove")
    cur = _attr(tmp_path / "bus/pci/devices/0000:26:00.4/nvidia/current_vgpu_type", "0\n")
    _attr(tmp_path / "bus/pci/devices/0000:26:00.0/sriov_totalvfs", "32\n")
    numvfs = _attr(tmp_path / "bus/pci/devices/0000:26:00.0/sriov_numvfs", "0\n")
    host = SysfsHost(r, "n", sriov_manage="", catalog=CATALOG)
    assert isinstance(host, HostPort)
    host.create_mdev("0000:08:00.5", 746, "c728e022-f16f-434b-ad2c-9665ee634d3d")
    assert create.read_text() == "c728e022-f16f-434b-ad2c-9665ee634d3d"
    host.remove_mdev("c728e022-f16f-434b-ad2c-9665ee634d3d")
    assert remove.read_text() == "1"
    host.set_vf_type("0000:26:00.4", 1150)
    assert cur.read_text() == "1150"
    cur.write_text("")  # a plain file keeps old bytes past the write; sysfs has no offset
    host.clear_vf_type("0000:26:00.4")
    assert cur.read_text() == "0"
    host.enable_sriov("0000:26:00.0")
    assert numvfs.read_text() == "32"
    numvfs.write_text("")
    host.disable_sriov("0000:26:00.0")
    assert numvfs.read_text() == "0"


def test_missing_attribute_is_not_created(tmp_path: Path) -> None:
    with pytest.raises(InterfaceMissingError) as info:
        uuid = "c728e022-f16f-434b-ad2c-9665ee634d3d"
        driver.create_mdev(str(tmp_path), "0000:08:00.5", 746, uuid)
    assert info.value.errno == errno.ENOENT and "nvidia-746/create" in info.value.path
    assert not (tmp_path / "bus").exists()


@pytest.mark.parametrize(
    ("code", "operation", "cls"),
    [
        (errno.EBUSY, "remove", DeviceBusyError),
        (errno.EEXIST, "create", AlreadyExistsError),
        (errno.EINVAL, "create", TypeNotCreatableError),
        (errno.EIO, "set-type", TypeNotCreatableError),
        (errno.ENOENT, "sriov-enable", InterfaceMissingError),
        (errno.ERANGE, "sriov-enable", DriverError),
        (errno.EINVAL, "remove", DriverError),
    ],
)
def test_errno_maps_to_typed_error(code: int, operation: str, cls: type[DriverError]) -> None:
    def writer(path: str, value: str) -> None:
        raise OSError(code, os.strerror(code))

    with pytest.raises(cls) as info:
        driver.write_attribute(operation, "/sys/x", "v", writer)
    assert type(info.value) is cls
    assert (info.value.errno, info.value.path, info.value.value) == (code, "/sys/x", "v")


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "sriov-manage"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_sriov_manage_is_run_with_flag_and_address(tmp_path: Path) -> None:
    log = tmp_path / "log"
    tool = _script(tmp_path, f'echo "$@" >> {log}\n')
    host = SysfsHost(str(tmp_path), sriov_manage=tool, catalog=CATALOG)
    host.enable_sriov("0000:08:00.0")
    host.disable_sriov("0000:08:00.0")
    assert log.read_text().splitlines() == ["-e 0000:08:00.0", "-d 0000:08:00.0"]


def test_sriov_manage_failure_is_a_driver_error(tmp_path: Path) -> None:
    tool = _script(tmp_path, 'echo "Cannot obtain unbindLock for $2" >&2\nexit 1\n')
    with pytest.raises(DeviceBusyError) as info:
        SysfsHost(str(tmp_path), sriov_manage=tool, catalog=CATALOG).disable_sriov("0000:08:00.0")
    assert "unbindLock" in str(info.value)
    with pytest.raises(InterfaceMissingError):
        SysfsHost(
            str(tmp_path), sriov_manage=str(tmp_path / "absent"), catalog=CATALOG
        ).enable_sriov("0000:08:00.0")


def test_the_sriov_manage_setting_is_what_the_host_runs(tmp_path: Path) -> None:
    """``--sriov-manage`` becomes ``Settings.sriov_manage``; the command's host uses that."""
    from vgpu_state.cli.session import open_host, settings

    log = tmp_path / "log"
    tool = _script(tmp_path, f'echo "$@" >> {log}\n')
    s = settings("nvidia.com/vgpu.config", None, sriov_manage=f"{tool} --verbose")
    assert s.sriov_manage == (tool, "--verbose")
    target = open_host(str(tmp_path), None, "n", s)
    target.host.enable_sriov("0000:08:00.0")
    assert log.read_text().splitlines() == ["--verbose -e 0000:08:00.0"]


def test_an_empty_sriov_manage_setting_writes_sriov_numvfs(tmp_path: Path) -> None:
    from vgpu_state.cli.session import open_host, settings

    numvfs = _attr(tmp_path / "bus/pci/devices/0000:26:00.0/sriov_numvfs", "0\n")
    _attr(tmp_path / "bus/pci/devices/0000:26:00.0/sriov_totalvfs", "32\n")
    s = settings("nvidia.com/vgpu.config", None, sriov_manage="")
    assert s.sriov_manage == ()
    open_host(str(tmp_path), None, "n", s).host.enable_sriov("0000:26:00.0")
    assert numvfs.read_text() == "32"


def test_sriov_manage_is_refused_for_a_simulated_node() -> None:
    from vgpu_state.cli.session import open_host, settings
    from vgpu_state.model.errors import SelectionError

    s = settings("nvidia.com/vgpu.config", "node.yaml", sriov_manage="/bin/true")
    with pytest.raises(SelectionError, match="--sriov-manage applies to a real sysfs"):
        open_host(None, "node.yaml", None, s)
