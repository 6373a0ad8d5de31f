"""Every sysfs path vgpu-state writes to, built in one place.

Each builder takes the values a write is about (a PCI address, an mdev UUID, a
vGPU type id), checks that each one has exactly its form, joins the path and
refuses it when it resolves outside the sysfs root. No other code joins a path
that is written to, so no value from a file (a saved plan, a journal, a spec)
can steer a write anywhere else, e.g. to a PCI device's ``remove``.
"""

from __future__ import annotations

import errno
import os

from vgpu_state.model.errors import DriverError
from vgpu_state.model.ids import is_canonical_uuid, is_pci_address, is_type_id


class UnsafePathError(DriverError):
    """A write was refused: a value does not have its form, or the path leaves the root."""

    def __init__(self, operation: str, path: str, value: str, reason: str) -> None:
        super().__init__(operation, path, value, errno.EPERM, f"refused: {reason}")


class SysfsPaths:
    """The attribute paths under one sysfs root."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _confined(self, operation: str, value: str, *parts: str) -> str:
        path = os.path.join(self.root, *parts)
        real_root = os.path.realpath(self.root)
        real = os.path.realpath(path)
        if os.path.commonpath([real_root, real]) != real_root:
            raise UnsafePathError(
                operation, path, value, f"the path resolves to {real}, outside {real_root}"
            )
        return path

    @staticmethod
    def _pci(operation: str, what: str, value: object) -> str:
        if not is_pci_address(value):
            raise UnsafePathError(
                operation, "", repr(value), f"{what} {value!r} is not a PCI address dddd:bb:dd.f"
            )
        assert isinstance(value, str)
        return value

    def device(self, operation: str, address: object, *parts: str) -> str:
        """``<root>/bus/pci/devices/<address>/<parts>``."""
        bdf = self._pci(operation, "device", address)
        return self._confined(operation, "", "bus", "pci", "devices", bdf, *parts)

    def mdev_create(self, parent: object, type_id: object) -> str:
        if not is_type_id(type_id):
            raise UnsafePathError(
                "create", "", repr(type_id), f"type id {type_id!r} is not a number"
            )
        bdf = self._pci("create", "parent", parent)
        return self._confined(
            "create",
            "",
            "bus",
            "pci",
            "devices",
            bdf,
            "mdev_supported_types",
            f"nvidia-{type_id}",
            "create",
        )

    def mdev_remove(self, uuid: object) -> str:
        if not is_canonical_uuid(uuid):
            raise UnsafePathError("remove", "", repr(uuid), f"{uuid!r} is not an mdev UUID")
        assert isinstance(uuid, str)
        return self._confined("remove", "1", "bus", "mdev", "devices", uuid, "remove")

    def vf_type(self, operation: str, vf: object) -> str:
        bdf = self._pci(operation, "VF", vf)
        return self._confined(
            operation, "", "bus", "pci", "devices", bdf, "nvidia", "current_vgpu_type"
        )
