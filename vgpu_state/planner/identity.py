"""Stable identities: new mdev UUIDs are derived, never random.

A UUID is uuid5 of a fixed namespace and ``<node>/<gpu address>/<slot>``, so a
crash-resume or a reboot recreates the same IDs and VMs keep their device names.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Set

NAMESPACE = uuid.UUID("0b5c3d36-8e0f-5a8e-9a8e-76677075737a")
_NAMESPACE_BYTES = NAMESPACE.bytes


def derived_uuid(node: str, gpu: str, slot: int) -> str:
    """``str(uuid.uuid5(NAMESPACE, f"{node}/{gpu}/{slot}"))``, spelled out (RFC 4122:
    the first 16 bytes of the SHA-1 of namespace and name, with the version and variant
    bits set) so that a fleet's plans, which derive one per create, skip building a
    ``UUID`` object for each."""
    digest = bytearray(
        hashlib.sha1(_NAMESPACE_BYTES + f"{node}/{gpu}/{slot}".encode()).digest()[:16]
    )
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def free_uuids(node: str, gpu: str, taken: Set[str]) -> Iterator[str]:
    """Derived UUIDs for slots 0, 1, … skipping those already present on the host."""
    slot = 0
    while True:
        candidate = derived_uuid(node, gpu, slot)
        if candidate not in taken:
            yield candidate
        slot += 1
