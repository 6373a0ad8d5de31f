"""Rollout slots as Leases on the real API server (its optimistic concurrency), as agents.

Each node's slots use that node's agent token (``tests/realcluster.py``) under
the shipped RBAC.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest

from tests.realcluster import ApiError, ControlPlane, api_path
from vgpu_state.kube.api import InvalidError, KubeApi
from vgpu_state.kube.rollout import RolloutSlots, utc_now

LEASES = "coordination.k8s.io/v1/leases"
NS = "vgpu-state"
T0 = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


def slots(kube: ControlPlane, holder: str, n: int = 1, clock: Clock | None = None) -> RolloutSlots:
    api = KubeApi(kube.api_client(kube.agent_token(holder)), holder, (5.0, 30.0))
    return RolloutSlots(api, NS, holder, slots=n, lease_seconds=60, clock=clock or Clock())


def lease(kube: ControlPlane, name: str) -> dict[str, Any]:
    found = kube.get(LEASES, name, NS)
    assert found is not None, f"no Lease {name}"
    return found


def test_one_slot_goes_to_one_node_until_it_reports_success(cluster: ControlPlane) -> None:
    kube = cluster
    a, b = slots(kube, "node-a"), slots(kube, "node-b")
    got = a.acquire()
    assert got is not None and got.name == "vgpu-state-rollout-0"
    spec = lease(kube, "vgpu-state-rollout-0")["spec"]
    assert spec["holderIdentity"] == "node-a"  # type: ignore[index]
    assert spec["leaseDurationSeconds"] == 60  # type: ignore[index]
    assert b.acquire() is None
    assert a.release(got)
    assert b.holders() == {"vgpu-state-rollout-0": None}
    other = b.acquire()
    assert other is not None and other.name == "vgpu-state-rollout-0"
    assert b.holders() == {"vgpu-state-rollout-0": "node-b"}
    assert not a.release(got), "a slot another node holds is not released"


def test_a_restarted_agent_gets_back_the_slot_it_held(cluster: ControlPlane) -> None:
    kube = cluster
    first = slots(kube, "node-a", n=2).acquire()
    again = slots(kube, "node-a", n=2).acquire()
    assert first is not None and again is not None and again.name == first.name
    assert slots(kube, "node-b", n=2).acquire() is not None
    assert slots(kube, "node-c", n=2).acquire() is None, "two slots, two holders"


def test_a_slot_whose_holder_died_is_taken_after_the_lease_expires(cluster: ControlPlane) -> None:
    kube = cluster
    clock = Clock()
    a, b = slots(kube, "node-a", clock=clock), slots(kube, "node-b", clock=clock)
    held = a.acquire()
    assert held is not None
    clock.now = T0 + dt.timedelta(seconds=59)
    assert b.acquire() is None, "not expired yet"
    clock.now = T0 + dt.timedelta(seconds=61)
    taken = b.acquire()
    assert taken is not None and taken.name == held.name
    spec = lease(kube, held.name)["spec"]
    assert spec["holderIdentity"] == "node-b" and spec["leaseTransitions"] == 1  # type: ignore[index]
    assert a.renew(held) is None, "the old holder learns it lost the slot"


def test_renewing_while_applying_keeps_the_slot(cluster: ControlPlane) -> None:
    kube = cluster
    clock = Clock()
    a = slots(kube, "node-a", clock=clock)
    held = a.acquire()
    assert held is not None
    before = lease(kube, held.name)["spec"]["renewTime"]  # type: ignore[index]
    with a.held(held, every=0.05) as lost:
        clock.now = T0 + dt.timedelta(seconds=30)
        deadline = time.monotonic() + 5
        while lease(kube, held.name)["spec"]["renewTime"] == before:  # type: ignore[index]
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not lost.is_set()
    clock.now = T0 + dt.timedelta(seconds=80)  # 50 s after the renewal: still valid
    assert slots(kube, "node-b", clock=clock).acquire() is None


@pytest.mark.parametrize("max_unavailable", [1, 2])
def test_contending_nodes_never_exceed_max_unavailable(
    cluster: ControlPlane, max_unavailable: int
) -> None:
    kube = cluster
    active: list[str] = []
    peak = [0]
    rounds = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def node(name: str) -> None:
        try:
            mine = slots(kube, name, n=max_unavailable)
            for _ in range(3):
                while (slot := mine.acquire()) is None:
                    time.sleep(0.01)
                with lock:
                    active.append(name)
                    peak[0] = max(peak[0], len(active))
                time.sleep(0.03)
                with lock:
                    active.remove(name)
                    rounds[0] += 1
                assert mine.release(slot)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(f"node-{i}",)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert rounds[0] == 15, "every node applied three times"
    assert 1 <= peak[0] <= max_unavailable


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _slot_body(name: str, holder: str, renewed: str, seconds: int = 60) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds, "renewTime": renewed},
    }


def test_a_hostile_node_cannot_hold_the_slots_for_ever(cluster: ControlPlane) -> None:
    """A node whose agent token writes every slot (and more) dated 2099, or lasting a day:
    the API server refuses each, and an honest node still gets a slot."""
    kube = cluster
    evil = kube.agent_token("node-evil")
    path = api_path(LEASES, None, NS) + "?fieldManager=vgpu-state-rollout"
    attempts = [
        _slot_body(f"vgpu-state-rollout-{i}", "node-evil", "2099-01-01T00:00:00.000000Z")
        for i in range(4)
    ] + [
        _slot_body(name, "node-evil", _stamp(utc_now()), seconds)
        for name, seconds in (
            ("vgpu-state-rollout-0", 86400),
            ("vgpu-state-rollout-64", 60),
            ("vgpu-state-rollout-999", 60),
            ("vgpu-state-rollout-x", 60),
        )
    ]
    for body in attempts:
        with pytest.raises(ApiError, match="ValidatingAdmissionPolicy"):
            kube.request("POST", path, body, token=evil)
    assert kube.list(LEASES, NS) == []
    honest = RolloutSlots(
        KubeApi(kube.api_client(kube.agent_token("node-a")), "node-a", (5.0, 30.0)),
        NS, "node-a", slots=4, lease_seconds=60,
    )  # fmt: skip
    got = honest.acquire()
    assert got is not None and got.name == "vgpu-state-rollout-0"


@pytest.mark.parametrize(
    ("renewed", "seconds"),
    [(dt.datetime(2099, 1, 1, tzinfo=dt.UTC), 60), (None, 86400)],
    ids=["renewed in 2099", "lasting a day"],
)
def test_a_slot_no_honest_agent_writes_is_taken_over(
    cluster: ControlPlane, renewed: dt.datetime | None, seconds: int
) -> None:
    """Slots dated far in the future or lasting a day (left by an older release, or a node
    whose clock ran ahead; the admission policy refuses such writes now) held by a node
    that still exists: every slot, and more Leases named like slots. An honest agent
    counts them as free, takes one over, and the API server lets it."""
    kube = cluster
    kube.ensure_node("node-evil")
    stamp = _stamp(renewed or utc_now())
    for name in ("vgpu-state-rollout-0", "vgpu-state-rollout-1", "vgpu-state-rollout-64"):
        kube.request(
            "POST", api_path(LEASES, None, NS), _slot_body(name, "node-evil", stamp, seconds)
        )
    honest = RolloutSlots(
        KubeApi(kube.api_client(kube.agent_token("node-a")), "node-a", (5.0, 30.0)),
        NS, "node-a", slots=2, lease_seconds=60,
    )  # fmt: skip
    assert honest.holders() == {"vgpu-state-rollout-0": None, "vgpu-state-rollout-1": None}
    got = honest.acquire()
    assert got is not None and got.name == "vgpu-state-rollout-0"
    spec = lease(kube, "vgpu-state-rollout-0")["spec"]
    assert spec["holderIdentity"] == "node-a" and spec["leaseTransitions"] == 1  # type: ignore[index]
    assert lease(kube, "vgpu-state-rollout-64")["spec"]["holderIdentity"] == "node-evil"  # type: ignore[index]


def test_a_slot_held_by_a_deleted_node_is_taken_over(cluster: ControlPlane) -> None:
    """A node takes the only slot and is deleted from the cluster while its Lease is still
    live: the next node does not wait for the Lease to run out."""
    kube = cluster
    gone = RolloutSlots(
        KubeApi(kube.api_client(kube.agent_token("node-gone")), "node-gone", (5.0, 30.0)),
        NS, "node-gone", lease_seconds=600,
    )  # fmt: skip
    held = gone.acquire()
    assert held is not None
    honest = RolloutSlots(
        KubeApi(kube.api_client(kube.agent_token("node-b")), "node-b", (5.0, 30.0)),
        NS, "node-b", lease_seconds=60,
    )  # fmt: skip
    assert honest.acquire() is None, "its node exists: the slot is held"
    kube.delete("v1/nodes", "node-gone")
    assert honest.holders() == {"vgpu-state-rollout-0": None}
    taken = honest.acquire()
    assert taken is not None and taken.name == held.name
    spec = lease(kube, held.name)["spec"]
    assert spec["holderIdentity"] == "node-b" and spec["leaseTransitions"] == 1  # type: ignore[index]


def test_a_holder_whose_clock_runs_up_to_a_minute_ahead_still_holds(cluster: ControlPlane) -> None:
    kube = cluster
    ahead, behind = Clock(), Clock()
    ahead.now = T0 + dt.timedelta(seconds=50)
    held = slots(kube, "node-a", clock=ahead).acquire()
    assert held is not None
    b = slots(kube, "node-b", clock=behind)
    assert b.holders() == {held.name: "node-a"}
    assert b.acquire() is None
    ahead.now = T0 + dt.timedelta(seconds=70)  # a renewal 70 s ahead of node-b: not believed
    assert slots(kube, "node-a", clock=ahead).renew(held) is not None
    assert b.holders() == {held.name: None}
    taken = b.acquire()
    assert taken is not None and taken.name == held.name


def test_a_take_over_the_server_refuses_moves_on_to_the_next_slot(cluster: ControlPlane) -> None:
    """node-a's clock runs 50 s ahead of the API server's: by it, node-x's slot has run out;
    by the server's it has not, and the take-over is refused. node-a takes the next slot,
    and with no other slot it gets the server's refusal."""
    kube = cluster
    kube.ensure_node("node-x")
    renewed = _stamp(utc_now() - dt.timedelta(seconds=20))
    kube.request(
        "POST", api_path(LEASES, None, NS), _slot_body("vgpu-state-rollout-0", "node-x", renewed)
    )
    api = KubeApi(kube.api_client(kube.agent_token("node-a")), "node-a", (5.0, 30.0))

    def ahead() -> dt.datetime:
        return utc_now() + dt.timedelta(seconds=50)

    two = RolloutSlots(api, NS, "node-a", slots=2, lease_seconds=60, clock=ahead)
    got = two.acquire()
    assert got is not None and got.name == "vgpu-state-rollout-1"
    one = RolloutSlots(api, NS, "node-a", slots=1, lease_seconds=60, clock=ahead)
    with pytest.raises(InvalidError, match="has not expired"):
        one.acquire()
    assert lease(kube, "vgpu-state-rollout-0")["spec"]["holderIdentity"] == "node-x"  # type: ignore[index]


def test_a_lease_longer_than_the_bound_is_refused_before_any_request() -> None:
    with pytest.raises(ValueError, match="1 to 600 s"):
        RolloutSlots(KubeApi(None, "nowhere", (1.0, 1.0)), NS, "node-a", lease_seconds=3600)


def test_zero_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RolloutSlots(KubeApi(None, "nowhere", (1.0, 1.0)), NS, "node-a", slots=0)
