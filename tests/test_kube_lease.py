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
    assert lease.try_acquire(api, "node-a", duration=60, now=T0).held
    later = T0 + datetime.timedelta(seconds=30)
    other = lease.try_acquire(api, "node-b", duration=60, now=later)
    assert not other.held and other.holder == "node-a"
    # The holder renews; the expiry moves with it.
    assert lease.try_acquire(api, "node-a", duration=60, now=later).held
    still = lease.try_acquire(api, "node-b", now=T0 + datetime.timedelta(seconds=80))
    assert not still.held
    # node-a stops renewing: after the duration node-b takes over.
    taken = lease.try_acquire(api, "node-b", now=T0 + datetime.timedelta(seconds=91))
    assert taken.held
    stored = cluster.get(LEASES, lease.LEASE_NAME, lease.DEFAULT_NAMESPACE)
    assert stored is not None
    assert stored["spec"]["holderIdentity"] == "node-b"
    assert stored["spec"]["leaseTransitions"] == 1
    assert not lease.try_acquire(api, "node-a", now=T0 + datetime.timedelta(seconds=92)).held


def test_release_lets_another_take_it_at_once(api: KubeApi) -> None:
    assert lease.try_acquire(api, "node-a", now=T0).held
    lease.release(api, "node-a")
    assert lease.try_acquire(api, "node-b", now=T0 + datetime.timedelta(seconds=1)).held


def test_racing_replicas_never_both_hold_it(cluster: ControlPlane, tmp_path: Path) -> None:
    winners: list[str] = []
    token = cluster.agent_token("node-a", service_account="vgpu-state-controller")
    config = str(cluster.write_kubeconfig(tmp_path / "kc", token=token))
    start = threading.Barrier(12)

    def contend(name: str) -> None:
        api = KubeApi.connect(config)
        start.wait()
        if lease.try_acquire(api, name, now=T0).held:
            winners.append(name)

    threads = [threading.Thread(target=contend, args=(f"node-{i}",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(winners) == 1
    stored = cluster.get(LEASES, lease.LEASE_NAME, lease.DEFAULT_NAMESPACE)
    assert stored is not None and stored["spec"]["holderIdentity"] == winners[0]
