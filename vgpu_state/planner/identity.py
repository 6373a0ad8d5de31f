"""Stable identities: new mdev UUIDs are derived, never random.

A UUID is uuid5 of a fixed namespace and ``<node>/<gpu address>/<slot>``, so a
crash-resume or a reboot recreates the same IDs and VMs keep their device names.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Set

NAMESPACE = uuid.UUID("0b5c3d36-8e0f-5a8e-9a8e-76677075737a")


def derived_uuid(node: str, gpu: str, slot: int) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{node}/{gpu}/{slot}"))


def free_uuids(node: str, gpu: str, taken: Set[str]) -> Iterator[str]:
    """Derived UUIDs for slots 0, 1, … skipping those already present on the host."""
    slot = 0
    while True:
        candidate = derived_uuid(node, gpu, slot)
        if candidate not in taken:
            yield candidate
        slot += 1
