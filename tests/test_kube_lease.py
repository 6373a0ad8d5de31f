"""The controller's leader-election Lease: one holder at a time, renewal, take-over after
expiry.

On the real API server, as the controller (its ServiceAccount's token, shipped RBAC).
"""

from __future__ import annotations

import datetime
import threading
from pathlib import Path

import pytest

from tests.apiserver import LEASES
from tests.realcluster import ControlPlane
from vgpu_state.kube import lease
from vgpu_state.kube.api import KubeApi

T0 = datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.UTC)


@pytest.fixture
def api(cluster: ControlPlane, tmp_path: Path) -> KubeApi:
    """The API as the controller sees it: the Lease is its leader election."""
    token = cluster.agent_token("node-a", service_account="vgpu-state-controller")
    return KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)))


def test_first_comer_holds_others_wait_until_it_expires(
    cluster: ControlPlane, api: KubeApi
) -> None:
    first = lease.hold_term(api, "node-a", None, duration=60, now=T0)
    assert first.held
    later = T0 + datetime.timedelta(seconds=30)
    other = lease.hold_term(api, "node-b", None, duration=60, now=later)
    assert not other.held and other.holder == "node-a"
    # The holder renews in its term; the expiry moves with it.
    assert lease.hold_term(api, "node-a", first.term, duration=60, now=later).held
    still = lease.hold_term(api, "node-b", None, now=T0 + datetime.timedelta(seconds=80))
    assert not still.held
    # node-a stops renewing: after the duration node-b takes over.
    taken = lease.hold_term(api, "node-b", None, now=T0 + datetime.timedelta(seconds=91))
    assert taken.held
    stored = cluster.get(LEASES, lease.LEASE_NAME, lease.DEFAULT_NAMESPACE)
    assert stored is not None
    assert stored["spec"]["holderIdentity"] == "node-b"
    assert stored["spec"]["leaseTransitions"] == 1
    back = lease.hold_term(api, "node-a", first.term, now=T0 + datetime.timedelta(seconds=92))
    assert not back.held


def test_release_lets_another_take_it_at_once(api: KubeApi) -> None:
    assert lease.hold_term(api, "node-a", None, now=T0).held
    lease.release(api, "node-a")
    assert lease.hold_term(api, "node-b", None, now=T0 + datetime.timedelta(seconds=1)).held


def test_racing_replicas_never_both_hold_it(cluster: ControlPlane, tmp_path: Path) -> None:
    winners: list[str] = []
    token = cluster.agent_token("node-a", service_account="vgpu-state-controller")
    config = str(cluster.write_kubeconfig(tmp_path / "kc", token=token))
    start = threading.Barrier(12)

    def contend(name: str) -> None:
        api = KubeApi.connect(config)
        start.wait()
        if lease.hold_term(api, name, None, now=T0).held:
            winners.append(name)

    threads = [threading.Thread(target=contend, args=(f"node-{i}",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(winners) == 1
    stored = cluster.get(LEASES, lease.LEASE_NAME, lease.DEFAULT_NAMESPACE)
    assert stored is not None and stored["spec"]["holderIdentity"] == winners[0]


def test_every_hold_that_begins_is_a_new_term(api: KubeApi) -> None:
    """The controller's terms (its fencing tokens): a renewal stays in its term; a Lease taken
    by another identity, taken again after its hold ended, or taken by a new process of the
    same identity (a restarted pod keeps its name) begins a new one, numbered past the last."""

    def at(seconds: float) -> datetime.datetime:
        return T0 + datetime.timedelta(seconds=seconds)

    first = lease.hold_term(api, "c-0", None, duration=10, now=at(0))
    assert first.held and first.term is not None and first.term.number == 0
    renewed = lease.hold_term(api, "c-0", first.term, duration=10, now=at(5))
    assert renewed.held and renewed.term == first.term
    # A new process of c-0 while the old one's hold lasts: a new term, and the old one's ended.
    restarted = lease.hold_term(api, "c-0", None, duration=10, now=at(6))
    assert restarted.held and restarted.term is not None and restarted.term.number == 1
    assert restarted.term.acquired != first.term.acquired
    old = lease.hold_term(api, "c-0", first.term, duration=10, now=at(7))
    assert not old.held and old.term == restarted.term
    # The old one does not take it back while the new one's hold lasts.
    assert not lease.hold_term(api, "c-0", None, duration=10, now=at(8), take_own=False).held
    # c-0 does not renew in time and takes it again: its hold had ended, a new term.
    again = lease.hold_term(api, "c-0", restarted.term, duration=10, now=at(17))
    assert again.held and again.term is not None and again.term.number == 2
    assert not lease.hold_term(api, "c-1", None, duration=10, now=at(20)).held
    taken = lease.hold_term(api, "c-1", None, duration=10, now=at(28))
    assert taken.held and taken.term is not None and taken.term.number == 3
    # The KubeVirt CR shows term 9 (the Lease was deleted since): the next term is past it.
    past = lease.hold_term(api, "c-1", taken.term, duration=10, now=at(29), after=9)
    assert past.held and past.term is not None and past.term.number == 10
    assert past.term.holder == "c-1" and past.term.acquired != taken.term.acquired
