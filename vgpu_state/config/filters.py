"""``device-filter`` strings: ``0xDDDDVVVV`` or ``0xDDDDVVVV:0xSSSSVVVV``.

``DDDD`` is the PCI device id, ``VVVV`` the vendor id (NVIDIA: ``10DE``); the
optional second half is the subsystem device id and subsystem vendor id, which
tells apart GPUs that share a device id (A2 ``0x25B610DE:0x157E10DE`` and A16
``0x25B610DE:0x14A910DE``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vgpu_state.model.ids import NVIDIA_VENDOR_ID
from vgpu_state.model.snapshot import Gpu

_FILTER = re.compile(
    r"^0[xX]([0-9a-fA-F]{4})([0-9a-fA-F]{4})(?::0[xX]([0-9a-fA-F]{4})([0-9a-fA-F]{4}))?$"
)


@dataclass(frozen=True)
class DeviceFilter:
    device_id: int
    vendor_id: int
    subsystem_device_id: int | None = None
    subsystem_vendor_id: int | None = None

    def __str__(self) -> str:
        text = f"0x{self.device_id:04X}{self.vendor_id:04X}"
        if self.subsystem_device_id is not None and self.subsystem_vendor_id is not None:
            text += f":0x{self.subsystem_device_id:04X}{self.subsystem_vendor_id:04X}"
        return text

    def matches(self, gpu: Gpu) -> bool:
        if (gpu.device_id, gpu.vendor_id) != (self.device_id, self.vendor_id):
            return False
        if self.subsystem_device_id is None:
            return True
        return (gpu.subsystem_device_id, gpu.subsystem_vendor_id) == (
            self.subsystem_device_id,
            self.subsystem_vendor_id,
        )


def parse_device_filter(text: str) -> DeviceFilter:
    """Parse a filter (hex is case-insensitive); ``ValueError`` says what is wrong."""
    m = _FILTER.match(text.strip())
    if m is None:
        raise ValueError(
            f"bad device-filter {text!r}: expected 0xDDDDVVVV or 0xDDDDVVVV:0xSSSSVVVV "
            "(PCI device and vendor id in hex), e.g. 0x223610DE"
        )
    parsed = DeviceFilter(
        device_id=int(m.group(1), 16),
        vendor_id=int(m.group(2), 16),
        subsystem_device_id=int(m.group(3), 16) if m.group(3) else None,
        subsystem_vendor_id=int(m.group(4), 16) if m.group(4) else None,
    )
    if parsed.vendor_id != NVIDIA_VENDOR_ID:
        raise ValueError(
            f"bad device-filter {text!r}: vendor id 0x{parsed.vendor_id:04X} is not NVIDIA's "
            f"(0x10DE); did you mean 0x{parsed.device_id:04X}10DE?"
        )
    return parsed
