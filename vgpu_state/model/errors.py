"""The one error tree of vgpu-state: errors that say what happened and what to do next.

Every error vgpu-state raises on purpose is a :class:`VgpuStateError`, and each
belongs to one of three kinds (:class:`ErrorKind`) that tell a caller what to do:

``user`` — :class:`UserError`
    The input is wrong: the config document (:class:`ConfigError`, with file,
    line and column), the node's selection (:class:`SelectionError`), a layout
    the node cannot hold (:class:`PlanningError`), a plan with blocked items
    (:class:`BlockedError`). Retrying the same input fails the same way; the CLI
    exits 1, the agent reports the condition and waits for a change.
``host`` — :class:`HostError`
    The node refused: a sysfs write or a driver tool failed
    (:class:`DriverError` and its subclasses carry the path, the value and the
    ``errno``), or the host does not show what an apply made. Someone has to
    look at the host; the agent reports it and retries on its normal schedule.
``transient`` — :class:`TransientError`
    A temporary condition (another apply holds the host lock, the API server
    is unreachable). Retry after :attr:`TransientError.delay` seconds, as
    kopf's ``TemporaryError`` does.

Each error carries a :class:`Reason`: a stable, CamelCase code (the ``reason``
of a Kubernetes status condition or Event) beside the human message. Blocked
plan items carry a reason code too (:class:`BlockedReason`). Messages name
files, values and objects, never a command-line flag: the shell that called
the library says which flag changes what.
"""

from __future__ import annotations

import errno as errno_mod
import os
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol


class ErrorKind(StrEnum):
    """Whose problem an error is, and so what the caller does next."""

    USER = "user"
    """Fix the input (config, labels, command); retrying the same input fails again."""
    HOST = "host"
    """The host refused or disagrees; look at the host (the errno says why)."""
    TRANSIENT = "transient"
    """Temporary; retry after a delay."""


class Reason(StrEnum):
    """Stable reason codes of errors (Kubernetes condition and Event reasons)."""

    CONFIG_INVALID = "ConfigInvalid"
    SELECTION_INVALID = "SelectionInvalid"
    NO_CONFIG_SELECTED = "NoConfigSelected"
    LAYOUT_UNREACHABLE = "LayoutUnreachable"
    BLOCKED = "Blocked"
    PLAN_STALE = "PlanStale"
    PLAN_INVALID = "PlanInvalid"
    INPUT_INVALID = "InputInvalid"
    DRIVER_ERROR = "DriverError"
    DEVICE_BUSY = "DeviceBusy"
    TYPE_NOT_CREATABLE = "TypeNotCreatable"
    INTERFACE_MISSING = "InterfaceMissing"
    ALREADY_EXISTS = "AlreadyExists"
    VERIFICATION_FAILED = "VerificationFailed"
    HOST_UNREADABLE = "HostUnreadable"
    LOCKED = "Locked"
    TRANSIENT = "Transient"
    CLUSTER_UNREACHABLE = "ClusterUnreachable"
    CLUSTER_REFUSED = "ClusterRefused"
    CLUSTER_CONFLICT = "ClusterConflict"
    IN_USE_UNKNOWN = "InUseUnknown"
    NO_GPUS = "NoGpus"


class BlockedReason(StrEnum):
    """Why a plan item is blocked (the prose beside it says it for a person)."""

    IN_USE = "InUse"
    """A pod or VM holds the vGPU; the item names the holder."""
    PRUNE_DISABLED = "PruneDisabled"
    """The layout does not want the vGPU, and the policy keeps unwanted vGPUs."""
    NO_VGPU_MANAGER = "NoVgpuManager"
    """The GPU has no vGPU manager (driver, layout) to create vGPUs with."""
    NO_CAPACITY = "NoCapacity"
    """The GPU cannot hold the vGPUs (framebuffer, instances, or held vGPUs in the way)."""
    SRIOV_OFF = "SriovOff"
    """The creates need virtual functions and the policy does not enable SR-IOV."""
    SWITCH_DEFERRED = "SwitchDeferred"
    """A layout change of the GPU waits: vGPUs that stay (held, or kept) block every
    create it needs, so the free vGPUs it would destroy are kept until it can complete."""
    KUBEVIRT_MDEV_MANAGEMENT = "KubeVirtMdevManagementActive"
    """KubeVirt would create and remove mdevs itself; its CR must hand them over first."""
    KUBEVIRT_MANAGED_BY_HCO = "KubeVirtManagedByHCO"
    """The KubeVirt CR is reconciled by the HyperConverged operator; edit that CR instead."""
    KUBEVIRT_ADVERTISES_VFS = "KubeVirtAdvertisesVFs"
    """A ``pciHostDevices`` entry vgpu-state does not own, without
    ``externalResourceProvider``, selects the node's vGPU VFs: KubeVirt would advertise
    them too."""
    OTHER = "Other"


class VgpuStateError(Exception):
    """Base of every error vgpu-state raises on purpose."""

    kind: ClassVar[ErrorKind] = ErrorKind.USER
    default_reason: ClassVar[Reason] = Reason.CONFIG_INVALID

    _reason: Reason | None = None

    @property
    def reason(self) -> Reason:
        """The stable reason code of this error."""
        return self._reason or self.default_reason


class UserError(VgpuStateError):
    """The input is wrong; fixing the input is the way out. Exit code 1."""

    kind = ErrorKind.USER


class HostError(VgpuStateError):
    """The host refused or does not show what it should. ``errno`` when a call failed."""

    kind = ErrorKind.HOST
    default_reason = Reason.DRIVER_ERROR
    errno: int = 0


class TransientError(VgpuStateError):
    """A temporary condition; retrying after :attr:`delay` seconds may succeed."""

    kind = ErrorKind.TRANSIENT
    default_reason = Reason.TRANSIENT

    def __init__(self, message: str, delay: float = 10.0) -> None:
        super().__init__(message)
        self.delay = delay


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


class ConfigError(UserError):
    """The config document (or a selection input) is invalid. Exit code 1."""

    default_reason = Reason.CONFIG_INVALID

    def __init__(self, issues: list[ConfigIssue] | tuple[ConfigIssue, ...]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class SelectionError(UserError):
    """A node's selection input (its config label) names a config the file does not define.

    Exit code 1, like :class:`ConfigError`: fix the label or the file.
    """

    default_reason = Reason.SELECTION_INVALID


class PlanningError(UserError):
    """The desired layout cannot be reached on this node (e.g. it does not fit)."""

    default_reason = Reason.LAYOUT_UNREACHABLE


class BlockedError(UserError):
    """The plan contains blocked steps and the caller did not allow skipping them."""

    default_reason = Reason.BLOCKED


class StalePlanError(UserError):
    """A saved plan no longer matches the host; ``changes`` says what moved. Plan again."""

    default_reason = Reason.PLAN_STALE

    def __init__(self, message: str, changes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.changes = changes


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


class DriverError(HostError):
    """A sysfs write or a driver tool failed; carries the path, value and errno."""

    default_reason = Reason.DRIVER_ERROR

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

    default_reason = Reason.DEVICE_BUSY


class TypeNotCreatableError(DriverError):
    """EINVAL/EIO on create: the type cannot be created on that parent now."""

    default_reason = Reason.TYPE_NOT_CREATABLE


class TypeNotListedError(DriverError):
    """A create whose type id is read from the driver's lists found the type not listed."""

    default_reason = Reason.TYPE_NOT_CREATABLE

    def __init__(self, parent: str, name: str, listed: tuple[str, ...]) -> None:
        HostError.__init__(
            self,
            f"create failed: the driver does not list {name} on {parent} "
            f"(it lists: {', '.join(listed) or 'nothing'}); nothing was written",
        )
        self.operation = "create"
        self.path = parent
        self.value = name
        self.errno = errno_mod.ENOENT
        self.meaning = "the driver does not offer the type there now"
        self.detail = ""


class InterfaceMissingError(DriverError):
    """ENOENT: the driver or the sysfs interface is missing."""

    default_reason = Reason.INTERFACE_MISSING


class AlreadyExistsError(DriverError):
    """EEXIST: the UUID already exists."""

    default_reason = Reason.ALREADY_EXISTS


class HostUnreadableError(HostError):
    """The host could not be read (no sysfs, an empty one, a dead mount): nothing
    can be said about it, so nothing is planned, applied or asserted."""

    default_reason = Reason.HOST_UNREADABLE


def require_readable(snapshot: NodeSnapshotLike) -> None:
    """Raise :class:`HostUnreadableError` when the scan could not read the host."""
    if snapshot.error is not None:
        raise HostUnreadableError(snapshot.error)


class NodeSnapshotLike(Protocol):
    @property
    def error(self) -> str | None: ...
