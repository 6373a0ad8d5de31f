"""The agent writes its /metrics page itself (vgpu_state.agent.promtext): the page is
the one Prometheus's Python client writes for the same metrics and the same updates
(names, types, HELP, label order and escaping, number format), only the ``_created``
times differ. promtool checks the real agent's page (tests/test_monitoring.py)."""

from __future__ import annotations

import re

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from vgpu_state.agent import promtext
from vgpu_state.agent.metrics import AgentMetrics

BUCKETS = (0.01, 0.5, 1, 120, 300)
ODD = 'a "quoted" \\ back\nslash'


def _exercise(lib: object) -> bytes:
    """The same metrics and updates in ``lib`` (``prometheus_client`` or ``promtext``)."""
    if lib is prometheus_client:
        registry: object = prometheus_client.CollectorRegistry(auto_describe=True)
    else:
        registry = promtext.Registry()
    counter = lib.Counter(
        "t_events", "Events, by kind.\nSecond \\ line.", ["kind"], registry=registry
    )  # type: ignore[attr-defined]
    plain = lib.Counter("t_outages", "Outages.", registry=registry)  # type: ignore[attr-defined]
    empty = lib.Counter("t_never", "Never counted.", ["x"], registry=registry)  # type: ignore[attr-defined]
    gauge = lib.Gauge("t_vgpus", "vGPUs.", ["type", "state"], registry=registry)  # type: ignore[attr-defined]
    scalar = lib.Gauge("t_when", "A time.", registry=registry)  # type: ignore[attr-defined]
    histogram = lib.Histogram(  # type: ignore[attr-defined]
        "t_seconds", "Durations.", ["mode", "result"], buckets=BUCKETS, registry=registry
    )
    counter.labels(kind="b").inc()
    counter.labels(kind=ODD).inc(2.5)
    counter.labels(kind="a").inc(0)
    plain.inc()
    gauge.labels(type="A2-4Q", state="free").set(3)
    gauge.labels(type="A2-8Q", state="in_use").set(-1.5)
    gauge.labels(type="gone", state="free").set(1)
    gauge.remove("gone", "free")
    scalar.set(1_795_910_356.055)
    for value in (0.005, 0.01, 0.3, 7, 1000):
        histogram.labels(mode="enforce", result="success").observe(value)
    histogram.labels(mode="plan-only", result="failed")
    del empty
    if lib is prometheus_client:
        return bytes(prometheus_client.generate_latest(registry))  # type: ignore[arg-type]
    assert isinstance(registry, promtext.Registry)
    return registry.render()


def _without_created_times(page: bytes) -> str:
    return re.sub(r"^(\w+_created(?:\{[^}]*\})?) \S+$", r"\1 T", page.decode(), flags=re.M)


def test_the_page_is_the_one_prometheus_client_writes() -> None:
    ours = _exercise(promtext)
    theirs = _exercise(prometheus_client)
    assert _without_created_times(ours) == _without_created_times(theirs)


def test_the_agents_page_parses_with_its_types_and_help() -> None:
    metrics = AgentMetrics()
    metrics.reconciles.labels(result="success").inc()
    metrics.reconcile_duration.labels(mode="enforce", result="success").observe(0.2)
    metrics.set_vgpus({("A2-4Q", "free"): 3})
    metrics.set_switches_deferred(["0000:01:00.0"], 1_700_000_000.5)
    metrics.set_switches_deferred(["0000:01:00.0", "0000:02:00.0"], 1_700_000_100.0)
    metrics.apiserver_changed(False)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert families["vgpu_state_reconciles"].type == "counter"
    assert families["vgpu_state_reconcile_duration_seconds"].type == "histogram"
    assert families["vgpu_state_vgpus"].documentation.startswith("vGPUs on the node")
    deferred = {
        s.labels["gpu"]: s.value
        for s in families["vgpu_state_layout_switch_deferred_since_timestamp_seconds"].samples
    }
    # A GPU still deferred keeps its since-time.
    assert deferred == {"0000:01:00.0": 1_700_000_000.5, "0000:02:00.0": 1_700_000_100.0}
    metrics.set_switches_deferred([], 1_700_000_200.0)
    assert "vgpu_state_layout_switch_deferred_since_timestamp_seconds{" not in (
        metrics.render().decode()
    )
