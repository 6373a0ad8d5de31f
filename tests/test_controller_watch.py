"""The running controller watches: a node's status change reaches the KubeVirt CR within
a second or two, not at the next interval (a burst of changes makes one pass); a watch
whose version the server no longer has (410 Gone) is followed by one list and the
controller converges; an entry nobody reports leaves when its grace period ends, with no
further change; the fleet view is kept per node and lists nothing while nothing changes;
a watch the server keeps refusing makes the controller unready; a watch event past its
bounds is refused before it is decoded.

Against the real API server, as the controller's own ServiceAccount; the event bounds
with a fake stream (the real server cannot send an event past them: the CRD bounds a
node's status far below)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_reports import bounding, layouts
from tests.realcluster import ControlPlane
from tests.test_controller_real import FOREIGN, KUBEVIRT, _owned, _report, _scan
from vgpu_state.background import Backoff
from vgpu_state.catalog import default_catalog
from vgpu_state.controller.fleetview import fleet_totals
from vgpu_state.controller.informers import Trigger
from vgpu_state.controller.run import Controller, ControllerSettings, FleetViewSettings
from vgpu_state.kube import informer
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.informer import CollectionWatch, EventError, WatchHealth
from vgpu_state.reconcile.fleet import Totals
from vgpu_state.reconcile.settings import Settings

INTERVAL = 15.0
"""Seconds between Lease renewals (the longest the Lease timings allow): a pass that waited
for it would take this long."""


@pytest.fixture
def running(cluster: ControlPlane, tmp_path: Path) -> Iterator[tuple[ControlPlane, Controller]]:
    with _running(cluster, tmp_path) as both:
        yield both


@contextlib.contextmanager
def _running(
    cluster: ControlPlane,
    tmp_path: Path,
    fleet: FleetViewSettings | None = None,
    grace: float = 300.0,
) -> Iterator[tuple[ControlPlane, Controller]]:
    cluster.request(
        "POST",
        KUBEVIRT,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt"},
            "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": [FOREIGN]}}},
        },
    )
    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    settings = ControllerSettings(
        identity="controller-0", grace=grace, interval=INTERVAL, fleet=fleet, **bounding()
    )
    ctl = Controller(api, settings)
    stop = threading.Event()
    thread = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield cluster, ctl
    finally:
        stop.set()
        thread.join(30)


def _passes(ctl: Controller) -> float:
    return float(ctl.metrics.passes.labels("ok")._value.get())


def _until(what: str, check: Any, timeout: float) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout:g} s"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_status_change_reaches_the_cr_without_waiting_for_the_interval(
    running: tuple[ControlPlane, Controller],
) -> None:
    cluster, ctl = running
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1"))
    _until("the first pass", lambda: "nvidia.com/NVIDIA_A2-4Q" in _owned(cluster), 30)
    # Right after a pass: a controller that polls would see the next change an interval on.
    passes = _passes(ctl)
    _until("a pass", lambda: _passes(ctl) > passes, 30)
    _report(cluster, "gpu-2", _scan("mixed.yaml", "gpu-2"))
    took = _until(
        "the new node's L40S type in the KubeVirt CR",
        lambda: "nvidia.com/NVIDIA_L40S-12Q" in _owned(cluster),
        INTERVAL,
    )
    assert took < 5.0, f"the change reached the CR after {took:.1f} s"
    assert ctl.metrics.relists._value.get() == 1, "one list, then the watch"


def test_an_expired_watch_is_followed_by_one_list_and_the_controller_converges(
    running: tuple[ControlPlane, Controller],
) -> None:
    cluster, ctl = running
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1"))
    _until("the first pass", lambda: "nvidia.com/NVIDIA_A2-4Q" in _owned(cluster), 30)
    watch = ctl._watches["vgpunodestates"]
    # The server no longer has this version (as after a compaction or its own restart): it
    # answers the watch with 410 Gone.
    watch.resume("1")
    _until("a second list", lambda: ctl.metrics.relists._value.get() == 2, 30)
    _report(cluster, "gpu-2", _scan("mixed.yaml", "gpu-2"))
    _until(
        "the new node's L40S type in the KubeVirt CR",
        lambda: "nvidia.com/NVIDIA_L40S-12Q" in _owned(cluster),
        10,
    )
    assert watch.version not in (None, "1")


def test_an_entry_no_node_reports_leaves_when_its_grace_period_ends(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """No further change comes: the pass that removes it is due at the end of its grace."""
    with _running(cluster, tmp_path, grace=3.0) as (cluster, _):
        _report(cluster, "gpu-1", _scan("mixed.yaml", "gpu-1"))
        _until("the first pass", lambda: "nvidia.com/NVIDIA_L40S-12Q" in _owned(cluster), 30)
        mixed = _scan("mixed.yaml", "gpu-1")
        _report(cluster, "gpu-1", mixed.model_copy(
            update={"gpus": tuple(g for g in mixed.gpus if g.model != "L40S")}))  # fmt: skip
        took = _until(
            "the L40S type gone from the KubeVirt CR",
            lambda: "nvidia.com/NVIDIA_L40S-12Q" not in _owned(cluster),
            3.0 + INTERVAL,
        )
        assert took < 3.0 + 3.0, f"removed {took:.1f} s after the change (grace 3 s)"


LABEL = "nvidia.com/vgpu.config"


def _gauges(ctl: Controller) -> tuple[float, ...]:
    m = ctl.metrics
    return (
        *(m.fleet_nodes.labels(o)._value.get() for o in ("changes", "no-changes", "unknown")),
        m.fleet_nodes.labels("error")._value.get(),
        *(m.fleet_actions.labels(k)._value.get() for k in ("create", "destroy", "blocked")),
    )


def _expected(t: Totals) -> tuple[float, ...]:
    return (t.changed, t.unchanged, t.unknown, t.errors, t.create, t.destroy, t.blocked)


def test_the_fleet_view_is_kept_per_node_and_lists_nothing_while_nothing_changes(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    catalog = default_catalog()
    view = FleetViewSettings(layouts(), Settings(catalog=catalog), interval=0.5)
    cluster.ensure_node("gpu-1", {LABEL: "a2-4q"})
    cluster.ensure_node("gpu-2", {LABEL: "l40s-12q"})
    cluster.ensure_node("gpu-3", {LABEL: "a2-4c"})  # no VGPUNodeState: not in the view
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1"))
    _report(cluster, "gpu-2", _scan("mixed.yaml", "gpu-2"))
    with _running(cluster, tmp_path, view) as (cluster, ctl):
        api = ctl.api

        def fresh() -> tuple[float, ...]:
            now = ctl.wall()
            return _expected(fleet_totals(api, view.layouts, view.settings, now, view.max_age))

        def agrees(what: str) -> None:
            _until(what, lambda: _gauges(ctl) == fresh(), 15)

        agrees("the first fleet view")
        assert sum(_gauges(ctl)[:4]) == 2
        _until("a view", lambda: ctl.metrics.fleet_view._value.get() > 0, 5)
        # Nothing changes: views go on, and list nothing.
        mark = cluster.audit_mark()
        made = ctl.metrics.fleet_view._value.get()
        _until("more views", lambda: ctl.metrics.fleet_view._value.get() > made + 1, 10)
        listed = [
            e["requestURI"]
            for e in cluster.audit(mark, "system:serviceaccount:vgpu-state:vgpu-state-controller")
            if e.get("verb") == "list"
        ]
        assert listed == [], "views from the kept parts"
        before = _gauges(ctl)
        cluster.ensure_node("gpu-1", {LABEL: "l40s-12q"})  # a layout its GPU cannot have
        agrees("gpu-1's new label planned")
        assert _gauges(ctl) != before
        _report(cluster, "gpu-2", _scan("a2-host.yaml", "gpu-2"))
        agrees("gpu-2's new status planned")
        cluster.delete("vgpu-state.io/v1alpha1/vgpunodestates", "gpu-2")
        agrees("gpu-2's VGPUNodeState gone")
        assert sum(_gauges(ctl)[:4]) == 1


def test_a_watch_the_server_keeps_refusing_makes_the_controller_unready(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    health = WatchHealth("things", bound=1.0)
    expired: list[str] = []
    # A collection the controller may not watch: the server refuses every attempt.
    watch = CollectionWatch(
        api,
        "/api/v1/secrets",
        lambda kind, obj: None,
        expired.append,
        what="secrets",
        health=health,
        backoff=Backoff(0.1, 0.2),
    )
    watch.resume("1")
    try:
        _until("unready", lambda: not health.check().ok, 10)
        assert "watch of things has failed" in health.check().reason
        assert "403" in health.check().reason
        assert health.failures >= 2, "retried"
        assert not expired
    finally:
        watch.stop()
    cluster.refusals_expected = True


class _Stream:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.chunks


def _event(obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": "MODIFIED", "object": obj}).encode() + b"\n"


def test_a_watch_event_past_its_bounds_is_refused_before_it_is_decoded() -> None:
    ok = _event({"metadata": {"name": "gpu-1", "resourceVersion": "5"}})
    # Split across chunks as a stream delivers it.
    assert [e["object"]["metadata"]["name"] for e in informer.events(
        _Stream([ok[:7], ok[7:] + ok]), "a watch event")] == ["gpu-1", "gpu-1"]  # fmt: skip
    deep = _event({"metadata": {"name": "gpu-1"}, "status": json.loads("[" * 100 + "]" * 100)})
    with pytest.raises(EventError, match="nested more than 64 levels"):
        list(informer.events(_Stream([deep]), "a watch event"))
    # A line that never ends is refused once it passes the bound, not held whole.
    endless = (b'{"type":"MODIFIED","object":{"x":"' + b"a" * 1000 for _ in range(100))
    with pytest.raises(EventError, match="more than 4096 bytes"):
        list(informer.events(_Stream(list(endless)), "a watch event", limit=4096))


def test_a_burst_of_changes_makes_one_pass_within_the_max_delay() -> None:
    now = [0.0]
    trigger = Trigger(quiet=0.2, max_delay=1.0, clock=lambda: now[0])
    assert trigger.when() is None and not trigger.take()
    for _ in range(30):  # a change every 0.1 s for 3 s
        trigger.changed()
        now[0] += 0.1
        if trigger.take():
            break
    assert now[0] == pytest.approx(1.1), "due 1 s after the burst's first change"
    assert not trigger.take(), "one pass for the burst so far"
    trigger.changed()
    now[0] += 0.1
    assert not trigger.take()
    now[0] += 0.15
    assert trigger.take(), "due once the changes stop for 0.2 s"
