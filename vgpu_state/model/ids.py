"""Identifiers every layer agrees on: NVIDIA's PCI vendor id and the mdev UUID form."""

from __future__ import annotations

import re

NVIDIA_VENDOR_ID = 0x10DE
"""The PCI vendor id of NVIDIA (``0x10de`` in sysfs, ``10DE`` in device filters)."""

UUID_PATTERN = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
"""An mdev UUID as sysfs and the ``create`` file accept it (8-4-4-4-12 hex digits)."""


def is_uuid(text: str) -> bool:
    """True when ``text`` is an mdev UUID (either case)."""
    return UUID_PATTERN.match(text) is not None
