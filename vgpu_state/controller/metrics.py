"""The controller's Prometheus metrics, in a registry of its own.

Two families: the controller's own work (``vgpu_state_controller_*``: leadership,
KubeVirt CR writes, refused reports) and the fleet view (``vgpu_state_fleet_*``: the
totals of the plan ``vgpu-state fleet plan`` makes, kept by the leader). Labels are
bounded by the catalog and the plan's enums (outcome, action kind, disruption level,
resource and type names): never a node name, so a fleet of 10,000 nodes costs the
same series as one of ten. Per-node series are the agents' own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from vgpu_state.kube.apihealth import OUTAGES_METRIC, REACHABLE_METRIC, Answer
from vgpu_state.reconcile.fleet import Totals

PREFIX = "vgpu_state"


class ControllerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        c = f"{PREFIX}_controller"
        self.leader = Gauge(
            f"{c}_leader", "1 while this replica holds the Lease and acts.", registry=r
        )
        self.passes = Counter(
            f"{c}_passes",
            "Passes over every node's report, by result (ok, error).",
            ["result"],
            registry=r,
        )
        self.last_pass = Gauge(
            f"{c}_last_pass_timestamp_seconds",
            "When the last pass that read every report and the KubeVirt CR ended (Unix time).",
            registry=r,
        )
        self.kubevirt_writes = Counter(
            f"{c}_kubevirt_writes",
            "KubeVirt CR patches sent, by result (ok, conflict, error).",
            ["result"],
            registry=r,
        )
        self.kubevirt_in_step = Gauge(
            f"{c}_kubevirt_in_step",
            "1 when the KubeVirt CR permits what the nodes report (after the last pass).",
            registry=r,
        )
        self.removals_waiting = Gauge(
            f"{c}_kubevirt_removals_waiting",
            "Permitted resources no node reports, kept until their grace period ends.",
            registry=r,
        )
        self.reports_refused = Gauge(
            f"{c}_reports_refused",
            "VGPUNodeStates the last pass refused (another node's scan, repeated PCI "
            "addresses, no NVIDIA device).",
            registry=r,
        )
        self.claims_refused = Gauge(
            f"{c}_report_entries_refused",
            "vGPUs or entries the last pass refused in reports it read, by reason (layouts: "
            "outside what the layouts document and the catalog allow; conflict: other nodes "
            "report the resource otherwise).",
            ["reason"],
            registry=r,
        )
        self.layouts_loaded = Gauge(
            f"{c}_layouts_loaded",
            "1 when a layouts document bounds the KubeVirt CR; 0: the controller adds and "
            "removes no entry.",
            registry=r,
        )
        self.refusal_events = Counter(
            f"{c}_refusal_events",
            "Warning Events written on VGPUNodeStates whose reports were refused.",
            registry=r,
        )
        self.relists = Counter(
            f"{c}_relists",
            "Lists of every VGPUNodeState a watch starts from (the first pass, then after "
            "an expired watch or a changed layouts document).",
            registry=r,
        )
        self.watch_ok = Gauge(
            f"{c}_watch_ok",
            "1 while the watch of a resource works (vgpunodestates, kubevirts); 0 once it "
            "has failed, without a success since, for its readiness bound.",
            ["resource"],
            registry=r,
        )
        self.watch_failures = Counter(
            f"{c}_watch_failures",
            "Watch requests that failed or broke off (each is resumed after a backoff).",
            ["resource"],
            registry=r,
        )
        self.evacuation_moves = Counter(
            f"{c}_evacuation_moves",
            "VMs moved off nodes whose switch waits for them (in-use: evacuate), by kind "
            "(migrate, restart) and result (started, succeeded, failed).",
            ["kind", "result"],
            registry=r,
        )
        self.evacuation_in_flight = Gauge(
            f"{c}_evacuation_in_flight",
            "The controller's moves not yet finished (migrations not Succeeded or Failed, "
            "restarts not running again).",
            registry=r,
        )
        self.evacuation_impossible = Gauge(
            f"{c}_evacuation_impossible",
            "VMs in the way of a switch that the last pass could not move (reason in an "
            "EvacuationImpossible Event).",
            registry=r,
        )
        self.evacuation_errors = Counter(
            f"{c}_evacuation_errors",
            "Evacuation steps that failed (retried on the next pass): KubeVirt's CRDs "
            "missing, a refused request, a lost term.",
            registry=r,
        )
        self.evacuation_paused = Gauge(
            f"{c}_evacuation_paused_nodes",
            "Nodes whose evacuation is paused after a failed move, until their layout changes.",
            registry=r,
        )
        f = f"{PREFIX}_fleet"
        self.fleet_nodes = Gauge(
            f"{f}_nodes",
            "Nodes in the fleet view, by plan outcome (changes, no-changes, unknown, error).",
            ["outcome"],
            registry=r,
        )
        self.fleet_actions = Gauge(
            f"{f}_planned_actions",
            "Plan actions the fleet's layouts still need, by kind (create, destroy, sriov, "
            "blocked).",
            ["kind"],
            registry=r,
        )
        self.fleet_disruption = Gauge(
            f"{f}_disruption_nodes",
            "Nodes whose plan reaches this far (none, device, gpu).",
            ["level"],
            registry=r,
        )
        self.fleet_capacity = Gauge(
            f"{f}_capacity_vgpus",
            "vGPUs of a type across the fleet, now (phase=before) and once every plan is "
            "applied (phase=after).",
            ["resource", "type", "publish", "phase"],
            registry=r,
        )
        self.fleet_held = Gauge(
            f"{f}_held_vgpus",
            "vGPUs of a type held by a VM or process.",
            ["resource", "type", "publish"],
            registry=r,
        )
        self.fleet_view = Gauge(
            f"{f}_view_timestamp_seconds",
            "When the fleet view was last made (Unix time).",
            registry=r,
        )
        self.fleet_view_errors = Counter(
            f"{f}_view_errors", "Fleet views that could not be made (layouts, cluster).", registry=r
        )

        self.apiserver_reachable = Gauge(*REACHABLE_METRIC, registry=r)
        self.apiserver_outages = Counter(*OUTAGES_METRIC, registry=r)

    def apiserver_changed(self, reachable: bool) -> None:
        """The API server's readiness flipped (``ApiServerHealth.on_change``)."""
        self.apiserver_reachable.set(1 if reachable else 0)
        if not reachable:
            self.apiserver_outages.inc()

    def fleet(self, totals: Totals, when: float) -> None:
        """Replace the fleet view with ``totals`` (series of types gone are removed)."""
        counts = {
            "changes": totals.changed,
            "no-changes": totals.unchanged,
            "unknown": totals.unknown,
            "error": totals.errors,
        }
        for outcome, n in counts.items():
            self.fleet_nodes.labels(outcome).set(n)
        for kind, n in (
            ("create", totals.create),
            ("destroy", totals.destroy),
            ("sriov", totals.sriov),
            ("blocked", totals.blocked),
        ):
            self.fleet_actions.labels(kind).set(n)
        for level, n in totals.disruption:
            self.fleet_disruption.labels(str(level)).set(n)
        self.fleet_capacity.clear()
        self.fleet_held.clear()
        for row in totals.capacity:
            key = (row.resource or "", row.type_name, str(row.publish))
            self.fleet_capacity.labels(*key, "before").set(row.before)
            self.fleet_capacity.labels(*key, "after").set(row.after)
            self.fleet_held.labels(*key).set(row.held)
        self.fleet_view.set(when)

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


Readiness = Callable[[], Answer]
"""What ``/readyz`` answers (the API server's health); ready when not given."""


def always_ready() -> Answer:
    return Answer(True, "ok")


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, kind, code = self.server.metrics.exposition(), CONTENT_TYPE_LATEST, 200
        elif path == "/healthz":
            body, kind, code = b"ok\n", "text/plain", 200
        elif path == "/readyz":
            ready = self.server.readiness()
            body, kind = (ready.reason + "\n").encode(), "text/plain; charset=utf-8"
            code = 200 if ready.ok else 503
        else:
            body, kind, code = b"not found\n", "text/plain", 404
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    metrics: ControllerMetrics
    readiness: Readiness


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` over plain HTTP on ``host:port``.

    ``/healthz`` answers while the process serves; ``/readyz`` what ``readiness`` says
    (the API server's health, :mod:`vgpu_state.kube.apihealth`)."""

    def __init__(
        self,
        metrics: ControllerMetrics,
        host: str,
        port: int,
        readiness: Readiness = always_ready,
    ) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.metrics = metrics
        self._server.readiness = readiness
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="vgpu-state-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
