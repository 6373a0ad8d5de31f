"""Errors that say what happened and what to do next."""

from __future__ import annotations

import errno as errno_mod
import os
from dataclasses import dataclass


class VgpuStateError(Exception):
    """Base of every error vgpu-state raises on purpose."""


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config document, with its position (1-based line and column)."""

    file: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"{self.file}:{self.line}:{self.column}: {self.message}{where}"


class ConfigError(VgpuStateError):
    """The config document (or a selection input) is invalid. Exit code 1."""

    def __init__(self, issues: list[ConfigIssue] | tuple[ConfigIssue, ...]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class SelectionError(VgpuStateError):
    """A node's selection input (its config label) names a config the file does not define.

    Exit code 1, like :class:`ConfigError`: fix the label or the file.
    """


class PlanningError(VgpuStateError):
    """The desired layout cannot be reached on this node (e.g. it does not fit)."""


class BlockedError(VgpuStateError):
    """The plan contains blocked steps and the caller did not allow skipping them."""


class TransientError(VgpuStateError):
    """A temporary condition; retrying later may succeed."""


_MEANINGS: dict[int, str] = {
    errno_mod.EBUSY: "the device is in use (a VM or another process holds it)",
    errno_mod.EINVAL: "the driver rejected the value: the type cannot be created here "
    "or the value is malformed",
    errno_mod.ENOENT: "the driver or the sysfs interface is missing",
    errno_mod.EEXIST: "a vGPU with that UUID already exists",
    errno_mod.ERANGE: "the value is out of range for this device",
    errno_mod.EIO: "the driver failed the request (I/O error)",
    errno_mod.ENXIO: "no vGPU exists on that device",
    errno_mod.EACCES: "permission denied: run as root or mount sysfs read-write",
    errno_mod.EROFS: "sysfs is mounted read-only",
}


def errno_meaning(code: int) -> str:
    return _MEANINGS.get(code, os.strerror(code))


class DriverError(VgpuStateError):
    """A sysfs write or a driver tool failed; carries the path, value and errno."""

    def __init__(self, operation: str, path: str, value: str, code: int, detail: str = "") -> None:
        self.operation = operation
        self.path = path
        self.value = value
        self.errno = code
        self.meaning = errno_meaning(code)
        self.detail = detail
        name = errno_mod.errorcode.get(code, str(code))
        extra = f"; {detail}" if detail else ""
        super().__init__(
            f"{operation} failed: writing {value!r} to {path}: {name} "
            f"({os.strerror(code)}): {self.meaning}{extra}"
        )


class DeviceBusyError(DriverError):
    """EBUSY: the device is in use."""


class TypeNotCreatableError(DriverError):
    """EINVAL/EIO on create: the type cannot be created on that parent now."""


class InterfaceMissingError(DriverError):
    """ENOENT: the driver or the sysfs interface is missing."""


class AlreadyExistsError(DriverError):
    """EEXIST: the UUID already exists."""
