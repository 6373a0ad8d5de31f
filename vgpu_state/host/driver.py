"""The NVIDIA driver's sysfs writes, one function per operation.

Each operation opens the attribute with ``O_WRONLY`` (never ``O_CREAT``: the
driver's files must already exist), writes the value once and closes it. A
failure raises a typed :class:`DriverError` carrying the path, value and errno.
The actual write goes through a :data:`Writer`, so the simulator can route the
very same paths and values into its driver model.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Sequence

from vgpu_state.host.paths import SysfsPaths, UnsafePathError
from vgpu_state.model.errors import (
    AlreadyExistsError,
    DeviceBusyError,
    DriverError,
    InterfaceMissingError,
    TypeNotCreatableError,
)
from vgpu_state.model.ids import is_canonical_uuid
from vgpu_state.wellknown import SRIOV_MANAGE

Writer = Callable[[str, str], None]
"""``writer(path, value)`` performs one write and raises ``OSError`` with the errno."""


SriovManage = Sequence[str]
"""The sriov-manage command line prefix; ``-e``/``-d`` and the PF address are appended."""


def os_write(path: str, value: str) -> None:
    """Write ``value`` to an existing attribute file with a single ``write``."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def driver_error(operation: str, path: str, value: str, code: int, detail: str = "") -> DriverError:
    """The typed error for an errno returned by a driver write."""
    cls: type[DriverError] = DriverError
    if code == errno.EBUSY:
        cls = DeviceBusyError
    elif code == errno.ENOENT:
        cls = InterfaceMissingError
    elif code == errno.EEXIST:
        cls = AlreadyExistsError
    elif code in (errno.EINVAL, errno.EIO, errno.EUSERS) and operation in ("create", "set-type"):
        cls = TypeNotCreatableError
    return cls(operation, path, value, code, detail)


def write_attribute(operation: str, path: str, value: str, writer: Writer = os_write) -> None:
    try:
        writer(path, value)
    except OSError as e:
        raise driver_error(operation, path, value, e.errno or errno.EIO) from e


def create_mdev(root: str, parent: str, type_id: int, uuid: str, writer: Writer = os_write) -> None:
    """Create an mdev vGPU of ``type_id`` with ``uuid`` on ``parent`` (a VF or PF)."""
    path = SysfsPaths(root).mdev_create(parent, type_id)
    if not is_canonical_uuid(uuid):
        raise UnsafePathError("create", path, repr(uuid), f"{uuid!r} is not an mdev UUID")
    write_attribute("create", path, uuid, writer)


def remove_mdev(root: str, uuid: str, writer: Writer = os_write) -> None:
    """Remove the mdev vGPU ``uuid``."""
    write_attribute("remove", SysfsPaths(root).mdev_remove(uuid), "1", writer)


def set_vf_type(root: str, vf: str, type_id: int, writer: Writer = os_write) -> None:
    """Assign vGPU type ``type_id`` to a free VF (vendor-specific VFIO layout)."""
    path = SysfsPaths(root).vf_type("set-type", vf)
    if type(type_id) is not int or type_id <= 0:
        raise UnsafePathError("set-type", path, repr(type_id), "a vGPU type id is a number > 0")
    write_attribute("set-type", path, str(type_id), writer)


def clear_vf_type(root: str, vf: str, writer: Writer = os_write) -> None:
    """Destroy the vGPU of a VF (vendor-specific VFIO layout)."""
    write_attribute("clear-type", SysfsPaths(root).vf_type("clear-type", vf), "0", writer)


def default_sriov_manage() -> SriovManage | None:
    """NVIDIA's ``sriov-manage`` if it is installed and executable."""
    if os.access(SRIOV_MANAGE, os.X_OK):
        return (SRIOV_MANAGE,)
    return None


def run_sriov_manage(command: SriovManage, flag: str, pf: str) -> None:
    """Run ``sriov-manage <flag> <pf>``; a non-zero exit raises :class:`DriverError`."""
    argv = [*command, flag, pf]
    operation = "sriov-enable" if flag == "-e" else "sriov-disable"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except FileNotFoundError as e:
        raise InterfaceMissingError(operation, argv[0], f"{flag} {pf}", errno.ENOENT) from e
    except subprocess.TimeoutExpired as e:
        raise DriverError(operation, argv[0], f"{flag} {pf}", errno.ETIMEDOUT) from e
    if done.returncode != 0:
        output = (done.stderr.strip() or done.stdout.strip()).splitlines()
        detail = output[-1] if output else f"exit status {done.returncode}"
        code = errno.EBUSY if "unbindLock" in detail else errno.EIO
        raise driver_error(operation, argv[0], f"{flag} {pf}", code, detail)


def enable_sriov(
    root: str, pf: str, sriov_manage: SriovManage | None = None, writer: Writer = os_write
) -> None:
    """Enable all VFs of ``pf``: ``sriov-manage -e`` if given, else ``sriov_numvfs``."""
    SysfsPaths(root).device("sriov-enable", pf)
    if sriov_manage:
        run_sriov_manage(sriov_manage, "-e", pf)
        return
    paths = SysfsPaths(root)
    total_path = paths.device("sriov-enable", pf, "sriov_totalvfs")
    try:
        with open(total_path, "rb") as f:
            total = f.read(64).decode("ascii", "replace").strip()
    except OSError as e:
        raise driver_error("sriov-enable", total_path, "", e.errno or errno.EIO) from e
    if not total.isdigit():
        raise driver_error("sriov-enable", total_path, total[:20], errno.EINVAL, "not a number")
    numvfs = paths.device("sriov-enable", pf, "sriov_numvfs")
    write_attribute("sriov-enable", numvfs, total, writer)


def disable_sriov(
    root: str, pf: str, sriov_manage: SriovManage | None = None, writer: Writer = os_write
) -> None:
    """Disable all VFs of ``pf``: ``sriov-manage -d`` if given, else ``sriov_numvfs`` 0."""
    SysfsPaths(root).device("sriov-disable", pf)
    if sriov_manage:
        run_sriov_manage(sriov_manage, "-d", pf)
        return
    path = SysfsPaths(root).device("sriov-disable", pf, "sriov_numvfs")
    write_attribute("sriov-disable", path, "0", writer)
