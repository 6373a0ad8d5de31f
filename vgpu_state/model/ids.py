"""Identifiers every layer agrees on: NVIDIA's PCI vendor id and the mdev UUID form."""

from __future__ import annotations

import re

NVIDIA_VENDOR_ID = 0x10DE
"""The PCI vendor id of NVIDIA (``0x10de`` in sysfs, ``10DE`` in device filters)."""

UUID_PATTERN = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
"""An mdev UUID as sysfs and the ``create`` file accept it (8-4-4-4-12 hex digits)."""


_CANONICAL_PCI = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]")
MAX_TYPE_ID = 2**31 - 1


def is_canonical_uuid(value: object) -> bool:
    """An mdev UUID in the lower case the scan reports, and nothing else."""
    return (
        isinstance(value, str)
        and UUID_PATTERN.fullmatch(value) is not None
        and value == value.lower()
    )


def is_pci_address(value: object) -> bool:
    """A canonical PCI address ``dddd:bb:dd.f`` (lower-case hex), and nothing else."""
    return isinstance(value, str) and _CANONICAL_PCI.fullmatch(value) is not None


def is_type_id(value: object) -> bool:
    """A vGPU type id: an ``int`` (not a bool) from 0 to 2**31 - 1."""
    return type(value) is int and 0 <= value <= MAX_TYPE_ID
