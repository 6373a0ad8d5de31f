"""New mdev UUIDs are uuid5 of ``<node>/<gpu>/<slot>``: the same on every run, every
version, and every reboot, so a VM keeps its device's name after a crash-resume."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from vgpu_state.planner.identity import NAMESPACE, derived_uuid, free_uuids


@given(st.text(max_size=80), st.text(max_size=40), st.integers(min_value=0, max_value=10**9))
def test_derived_uuid_is_rfc4122_uuid5(node: str, gpu: str, slot: int) -> None:
    expected = uuid.uuid5(NAMESPACE, f"{node}/{gpu}/{slot}")
    got = derived_uuid(node, gpu, slot)
    assert got == str(expected)
    parsed = uuid.UUID(got)
    assert (parsed.version, parsed.variant) == (5, uuid.RFC_4122)


def test_known_value_never_changes() -> None:
    # Plans and journals written by earlier versions name this UUID for slot 0.
    assert derived_uuid("gpu-node-1", "0000:41:00.0", 0) == str(
        uuid.uuid5(uuid.UUID("0b5c3d36-8e0f-5a8e-9a8e-76677075737a"), "gpu-node-1/0000:41:00.0/0")
    )


def test_free_uuids_skip_the_ones_present() -> None:
    first, second = derived_uuid("n", "g", 0), derived_uuid("n", "g", 1)
    found = free_uuids("n", "g", {first})
    assert next(found) == second
    assert next(found) == derived_uuid("n", "g", 2)
