"""A deposed controller writes nothing, on the real API server, as the controller's own
ServiceAccount: every KubeVirt CR write carries its term's token, so a write of a term that
has ended is refused by the server however late it arrives.

* In-process (wall clocks injected, so a Lease expires without waiting): a write sent in a
  term that ended before it arrived is refused (422) and not retried; a Lease created anew
  (its count back at 0) is followed by a term numbered past the CR's token; a leader that
  cannot renew steps down at the renew deadline.

Two real controller processes held past their Lease: ``tests/test_fencing_replicas.py``.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_reports import bounding
from tests.realcluster import CONTROLLER_SA, ControlPlane
from tests.test_controller_real import _report, _scan
from tests.test_fencing_replicas import LEASES, _cr, _kubevirt, _owned, _patches
from vgpu_state.controller.run import Controller, ControllerSettings
from vgpu_state.kube import lease
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.errors import ClusterUnreachableError
from vgpu_state.kube.fencing import WRITER_TERM_ANNOTATION, DeposedError, parse_token, term_of

A2 = "nvidia.com/NVIDIA_A2-4Q"
W0 = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)


def _term(cr: dict[str, Any]) -> str | None:
    token = (cr["metadata"].get("annotations") or {}).get(WRITER_TERM_ANNOTATION)
    return None if token is None else str(token)


def _controller(
    cluster: ControlPlane, tmp_path: Path, node: str, identity: str, wall: list[datetime.datetime]
) -> tuple[Controller, str]:
    """A controller replica in this process, as the controller's ServiceAccount bound to a pod
    on ``node``; its wall clock is ``wall[0]``."""
    token = cluster.agent_token(node, service_account=CONTROLLER_SA)
    api = KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / identity, token=token)))
    settings = ControllerSettings(identity=identity, grace=0.0, **bounding())
    return Controller(api, settings, wall=lambda: wall[0]), f"{CONTROLLER_SA}-{node}"


def test_a_write_sent_in_a_term_that_ended_is_refused_and_not_retried(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """The leader's patch is held on its way until its Lease has expired and the other replica
    has taken over; that replica has nothing to change but claims the CR. The late patch
    reaches the server: refused, since its term's token is no longer the CR's, and the
    deposed replica re-checks the Lease and stops instead of planning again."""
    _kubevirt(cluster)
    wall_one, wall_two = [W0], [W0]
    one, pod_one = _controller(cluster, tmp_path, "control-node", "c-0", wall_one)
    two, _ = _controller(cluster, tmp_path, "control-node-2", "c-1", wall_two)
    # it keeps what nobody reports
    two.settings = ControllerSettings(identity="c-1", grace=300.0, **bounding())
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1"))
    assert one.run_once() is not None
    claimed = _cr(cluster)
    assert A2 in _owned(claimed) and _term(claimed) == one.term.token  # type: ignore[union-attr]
    # The node no longer reports A2: one removes it (grace 0), and its patch is held.
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1").model_copy(update={"gpus": ()}))
    real_patch = one.api.patch

    def held(path: str, body: Any, kind: Any) -> Any:
        wall_two[0] = W0 + datetime.timedelta(seconds=31)  # one's Lease has expired
        taken = two.run_once()
        assert taken is not None and taken.write.writes == 1 and not taken.write.changes
        return real_patch(path, body, kind)

    one.api.patch = held  # type: ignore[method-assign]
    mark = cluster.audit_mark()
    with pytest.raises(DeposedError):
        one.run_once()
    assert _patches(cluster, mark, pod_one) == [422], "refused once, not retried"
    after = _cr(cluster)
    assert A2 in _owned(after), "the deposed replica's removal did not land"
    assert _term(after) == two.term.token  # type: ignore[union-attr]
    assert not one.leading and one.term is None


def test_a_lease_created_anew_is_followed_by_a_term_past_the_crs(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """Someone deletes the Lease: the replica creates it again, its count back at 0, while
    the CR carries the token of term 0 of the old Lease. The replica does not take that for
    a newer term's forever: the Lease still shows its own term, so it starts one past the
    CR's, and claims the CR with it."""
    _kubevirt(cluster)
    wall = [W0]
    one, pod = _controller(cluster, tmp_path, "control-node", "c-0", wall)
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1"))
    assert one.run_once() is not None
    old = parse_token(_term(_cr(cluster)))
    assert old is not None and old.number == 0
    cluster.request("DELETE", f"{LEASES}/{lease.LEASE_NAME}")
    wall[0] = W0 + datetime.timedelta(seconds=1)
    with pytest.raises(DeposedError):
        one.run_once()
    shown = term_of(cluster.request("GET", f"{LEASES}/{lease.LEASE_NAME}"))
    assert shown is not None and shown.number == 1 and shown == one.term
    mark = cluster.audit_mark()
    again = one.run_once()
    assert again is not None and again.write.writes == 1
    assert _term(_cr(cluster)) == shown.token
    assert _patches(cluster, mark, pod) == [200]


def test_a_leader_that_cannot_renew_steps_down_at_the_renew_deadline(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """Renewals fail (the API server unreachable): the leader leads on until the renew
    deadline (20 s, well inside the 30 s Lease), then steps down and writes nothing. Back in
    reach before anyone took over, it renews its Lease in the same term."""
    _kubevirt(cluster)
    one, _ = _controller(cluster, tmp_path, "control-node", "c-0", [W0])
    clock = [0.0]
    one.clock = lambda: clock[0]
    assert one.lead()
    term = one.term
    reachable = one.api.get

    def unreachable(path: str) -> Any:
        raise ClusterUnreachableError(f"GET {path}: connection refused")

    one.api.get = unreachable  # type: ignore[method-assign]
    clock[0] = 19.0
    with pytest.raises(ClusterUnreachableError):
        one.lead()
    assert one.leading, "within the renew deadline"
    clock[0] = 20.5
    with pytest.raises(ClusterUnreachableError):
        one.lead()
    assert not one.leading
    with pytest.raises(DeposedError):
        one.sync()
    one.api.get = reachable
    assert one.lead() and one.term == term
