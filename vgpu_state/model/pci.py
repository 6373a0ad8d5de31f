"""PCI addresses in the canonical sysfs form ``dddd:bb:dd.f`` (lower-case hex)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema

_FULL = re.compile(r"^([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$")
_CANONICAL = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]")
_SHORT = re.compile(r"^([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$")


def parse_pci_address(text: str) -> str:
    """Return ``text`` as a canonical address; accept the short ``bb:dd.f`` form.

    Raises ``ValueError`` with a message a person can act on.
    """
    value = text.strip()
    m = _FULL.match(value)
    if m:
        return f"{m.group(1)}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower()
    m = _SHORT.match(value)
    if m:
        return f"0000:{m.group(1)}:{m.group(2)}.{m.group(3)}".lower()
    raise ValueError(
        f"{text!r} is not a PCI address; expected dddd:bb:dd.f such as 0000:3b:00.0 "
        "(or the short form 3b:00.0)"
    )


def format_pci_address(domain: int, bus: int, device: int, function: int) -> str:
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def pci_routing_id(address: str) -> tuple[int, int]:
    """Return (domain, routing id) where routing id = bus << 8 | devfn."""
    canonical = parse_pci_address(address)
    domain = int(canonical[0:4], 16)
    bus = int(canonical[5:7], 16)
    dev = int(canonical[8:10], 16)
    fn = int(canonical[11], 16)
    return domain, (bus << 8) | (dev << 3) | fn


def address_from_routing_id(domain: int, rid: int) -> str:
    return format_pci_address(domain, (rid >> 8) & 0xFF, (rid >> 3) & 0x1F, rid & 0x7)


def vf_address(pf: str, offset: int, stride: int, index: int) -> str:
    """Address of VF ``index`` (0-based) with ARI numbering, as the PCI core computes it."""
    domain, rid = pci_routing_id(pf)
    return address_from_routing_id(domain, rid + offset + index * stride)


class PciAddress(str):
    """A PCI address (GPU or virtual function), validated and in canonical form.

    ``PciAddress("3B:00.0") == "0000:3b:00.0"``; text that is not an address raises
    ``ValueError``. It is a ``str``: it serialises, compares and hashes as the plain
    string, so plans, snapshots and status read and write the same JSON as before.
    As a pydantic field type it accepts a string and validates it.
    """

    __slots__ = ()

    def __new__(cls, text: str) -> PciAddress:
        if type(text) is cls:
            return text
        if _CANONICAL.fullmatch(text) is None:  # the usual case skips the parser
            text = parse_pci_address(text)
        return str.__new__(cls, text)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(
            _known_address,
            core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(
                str, return_schema=core_schema.str_schema()
            ),
        )


_KNOWN: dict[str, PciAddress] = {}
_KNOWN_LIMIT = 1 << 16


def _known_address(text: str) -> PciAddress:
    """``PciAddress(text)``, looked up when seen before: addresses repeat (nodes share bus
    layouts), and a fleet's scans hold about a hundred thousand of them."""
    found = _KNOWN.get(text)
    if found is None:
        found = PciAddress(text)
        if len(_KNOWN) < _KNOWN_LIMIT:
            _KNOWN[text] = found
    return found
