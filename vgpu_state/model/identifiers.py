"""The exact forms of the identifiers that end up in sysfs paths and values."""

from __future__ import annotations

import re

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
MAX_TYPE_ID = 2**31 - 1


def is_uuid(value: object) -> bool:
    """A lower-case mdev UUID (``8-4-4-4-12`` hex digits), nothing else."""
    return isinstance(value, str) and _UUID.fullmatch(value) is not None


def is_pci_address(value: object) -> bool:
    """A canonical PCI address ``dddd:bb:dd.f`` (lower-case hex), nothing else."""
    return isinstance(value, str) and _PCI.fullmatch(value) is not None


def is_type_id(value: object) -> bool:
    """A vGPU type id: an ``int`` (not a bool) from 0 to 2**31 - 1."""
    return type(value) is int and 0 <= value <= MAX_TYPE_ID
