"""Events after a reconcile: one Warning per blocked reason, naming the first items.

A node whose layout waits on a held vGPU can have hundreds of blocked steps (a
switch of 8 GPUs × 32 VFs); an Event per step meant a read and a write of the
API server per step, every reconcile, and a ``count`` that counted steps.
"""

from __future__ import annotations

from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.plan import ActionKind, Blocked
from vgpu_state.reconcile.status import BLOCKED_NAMED, blocked_events


def item(i: int, code: BlockedReason) -> Blocked:
    return Blocked(
        address=f"gpu[0000:81:00.0].vf[0000:81:{i // 8:02x}.{i % 8}]",
        gpu="0000:81:00.0",
        kind=ActionKind.CREATE,
        type_name="L40S-12Q",
        code=code,
        reason=f"reason {i}",
    )


def test_one_warning_per_reason_in_the_order_the_plan_names_them() -> None:
    blocked = [item(i, BlockedReason.SWITCH_DEFERRED) for i in range(256)]
    blocked.insert(3, item(300, BlockedReason.IN_USE))
    events = blocked_events(blocked)
    assert [(e.reason, e.type.value) for e in events] == [
        ("SwitchDeferred", "Warning"),
        ("InUse", "Warning"),
    ]
    deferred, held = events
    assert deferred.message == (
        "256 plan items blocked: gpu[0000:81:00.0].vf[0000:81:00.0]: reason 0; "
        "gpu[0000:81:00.0].vf[0000:81:00.1]: reason 1; and 254 more"
    )
    # A reason with one item reads as it always did: the item and why.
    assert held.message == "gpu[0000:81:00.0].vf[0000:81:25.4]: reason 300"
    assert BLOCKED_NAMED == 2


def test_two_items_are_both_named_and_nothing_blocked_is_no_event() -> None:
    [event] = blocked_events(
        [item(0, BlockedReason.NO_CAPACITY), item(1, BlockedReason.NO_CAPACITY)]
    )
    assert event.message == (
        "2 plan items blocked: gpu[0000:81:00.0].vf[0000:81:00.0]: reason 0; "
        "gpu[0000:81:00.0].vf[0000:81:00.1]: reason 1"
    )
    assert blocked_events([]) == ()
