"""deploy/monitoring: the alerting rules, their unit tests and the dashboard, checked
with Prometheus's own promtool against what the agent really exports.

promtool is Debian's (``hack/promtool/build.sh`` takes it out of the prometheus
package; built with Go where no package can be had), which ``make test`` puts in
place. ``promtool check rules`` and ``promtool test
rules`` (``tests/monitoring/*_test.yaml``: every alert fires where it should and
stays quiet where it should not) run on the rules of the PrometheusRule;
``promtool check metrics`` runs on the /metrics page of a real agent (a real
kube-apiserver, a FUSE-simulated A2 with a layout switch waiting for its holder)
and on a real controller's (its own ServiceAccount, a pass and a fleet view);
every metric an alert or a dashboard panel reads is one those pages declare.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from ruamel.yaml import YAML

from tests.agent_process import A2_SPEC, CONFIG, NODE, layout, running_agent, wait_for
from tests.apiserver import put_kubevirt
from tests.realcluster import ControlPlane

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "deploy" / "monitoring"
RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "dashboard.json"
UNIT_TESTS = sorted((REPO / "tests" / "monitoring").glob("*_test.yaml"))

SYNTHETIC = {"up"}
"""Series Prometheus writes itself for every target, not read from a /metrics page."""


def promtool_binary() -> str:
    directory = os.environ.get("VGPU_STATE_PROMTOOL_BIN")
    path = (
        Path(directory) / "promtool"
        if directory
        else REPO / "hack" / "promtool" / "bin" / "promtool"
    )
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    reason = f"{path} is not there (sh hack/promtool/build.sh: Debian's, or built with Go)"
    if os.environ.get("VGPU_STATE_REQUIRE_K8S") == "1":
        pytest.fail(f"promtool is required (VGPU_STATE_REQUIRE_K8S=1): {reason}")
    pytest.skip(f"no promtool: {reason}")


@pytest.fixture(scope="module")
def promtool() -> str:
    return promtool_binary()


def promtool_run(
    promtool: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], input=stdin, capture_output=True, text=True, check=False, timeout=120
    )


def rule_groups() -> list[dict[str, Any]]:
    doc = YAML(typ="safe").load(RULE.read_text())
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    groups: list[dict[str, Any]] = doc["spec"]["groups"]
    return groups


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]


def write_rules(directory: Path) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file (what the Operator loads)."""
    path = directory / "rules.yaml"
    path.write_text(json.dumps({"groups": rule_groups()}, indent=1))
    return path


def test_the_rules_pass_promtool_check_rules(promtool: str, tmp_path: Path) -> None:
    proc = promtool_run(promtool, "check", "rules", str(write_rules(tmp_path)))
    assert proc.returncode == 0, f"promtool check rules:\n{proc.stdout}{proc.stderr}"
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups())} rules found" in proc.stdout


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    """Each alert has a ``promtool test rules`` case where it fires and one where it stays
    quiet (the unit tests themselves run in the next test)."""
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        for case in YAML(typ="safe").load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names, "no alerts in the PrometheusRule"
    assert names - fires == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"
    assert (fires | quiet) - names == set(), "unit tests of alerts that do not exist"


def test_the_alerts_pass_their_promtool_unit_tests(promtool: str, tmp_path: Path) -> None:
    write_rules(tmp_path)
    copies = []
    for path in UNIT_TESTS:
        shutil.copy(path, tmp_path / path.name)
        copies.append(str(tmp_path / path.name))
    proc = promtool_run(promtool, "test", "rules", *copies)
    assert proc.returncode == 0, f"promtool test rules:\n{proc.stdout}{proc.stderr}"
    assert proc.stdout.count("SUCCESS") == len(copies), proc.stdout


def test_each_alert_names_its_runbook_section_in_docs_alerts_md() -> None:
    doc = (REPO / "docs" / "alerts.md").read_text()
    headings = {h.strip().lower() for h in re.findall(r"^### (\S+)", doc, re.MULTILINE)}
    for alert in alerts():
        anchor = alert["alert"].lower()
        assert alert["annotations"]["runbook"] == f"docs/alerts.md#{anchor}"
        assert anchor in headings, f"docs/alerts.md has no section for {alert['alert']}"
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}


def kustomize(tmp_path: Path, extra: str = "") -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is required to render deploy/ (kubectl kustomize) but is not on PATH")
    # kustomize takes relative paths only.
    text = f"resources: [{os.path.relpath(REPO / 'deploy', tmp_path)}]\n{extra}"
    (tmp_path / "kustomization.yaml").write_text(text)
    proc = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in YAML(typ="safe").load_all(proc.stdout) if d]


def test_monitoring_is_an_optional_component_of_the_base(tmp_path: Path) -> None:
    """The base renders no Prometheus Operator object (a cluster without the Operator's
    CRDs installs it); with the component, one PodMonitor selects the agent's pods and
    port and another the controller's, in the base's namespace, each with the job label
    its alerts select on."""
    base = kustomize(tmp_path)
    assert not [d for d in base if d["apiVersion"].startswith("monitoring.coreos.com/")]
    relative = os.path.relpath(MONITORING, tmp_path)
    objects = kustomize(tmp_path, f"components: [{relative}]\n")
    extra = {(d["kind"], d["metadata"]["name"]) for d in objects} - {
        (d["kind"], d["metadata"]["name"]) for d in base
    }
    assert extra == {
        ("PodMonitor", "vgpu-state-agent"),
        ("PodMonitor", "vgpu-state-controller"),
        ("PrometheusRule", "vgpu-state"),
    }
    workloads = {"vgpu-state-agent": "DaemonSet", "vgpu-state-controller": "Deployment"}
    for monitor in (d for d in objects if d["kind"] == "PodMonitor"):
        name = monitor["metadata"]["name"]
        workload = next(d for d in objects if d["kind"] == workloads[name])
        assert monitor["metadata"]["namespace"] == workload["metadata"]["namespace"]
        assert workload["metadata"]["namespace"] == "vgpu-state"
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items(), name
        containers = workload["spec"]["template"]["spec"]["containers"]
        ports = {p["name"] for c in containers for p in c.get("ports", [])}
        assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports, name
        # The alerts select each component's series by the job its PodMonitor sets.
        jobs = {
            r["replacement"]
            for e in monitor["spec"]["podMetricsEndpoints"]
            for r in e["relabelings"]
            if r["targetLabel"] == "job"
        }
        assert jobs == {name}
    for alert in alerts():
        if "up" in names_in(alert["expr"]):
            assert re.search(r'job="vgpu-state-(agent|controller)"', alert["expr"]), alert


# PromQL: the metric names an expression reads ----------------------------------------
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}  # fmt: skip


def names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (identifiers that are not functions,
    keywords, label names, label values or durations)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values and other strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables ($__rate_interval)
    found = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)\s*(\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        found.add(name)
    return found


def test_names_in_finds_the_metrics_of_an_expression() -> None:
    expr = (
        'sum by (node) (rate(vgpu_state_reconciles_total{result="failed"}[$__rate_interval]))'
        ' / on (node) group_left count(up{job="a"}) unless vgpu_state_x offset 5m'
    )
    assert names_in(expr) == {"vgpu_state_reconciles_total", "up", "vgpu_state_x"}


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            exprs.append(target["expr"])
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") == "query" and query:
            exprs.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", query))
    return exprs


def exported_names(page: str) -> set[str]:
    """Every series name a /metrics page declares, with the suffixes of its type."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created"),
    }
    names = set()
    for family in text_string_to_metric_families(page):
        if family.type in suffixes:
            names.update(family.name + s for s in suffixes[family.type])
        else:
            names.add(family.name)
    return names


# The real agent ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def agent_pages(
    control_plane_session: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """/metrics pages of a real agent: ``before`` the controller has permitted the node's
    vGPU types in the KubeVirt CR, and ``deferred`` (after a controller pass) while its
    node waits for a holder: a vGPU held by a VM is in the way of the layout it is
    labelled with, so the switch is deferred."""
    from vgpu_state.sim.fuse import fuse_unavailable_reason

    reason = fuse_unavailable_reason()
    if reason is not None:
        if os.environ.get("VGPU_STATE_REQUIRE_FUSE") == "1":
            pytest.fail(f"FUSE is required (VGPU_STATE_REQUIRE_FUSE=1) but unusable: {reason}")
        pytest.skip(f"FUSE unusable: {reason}")
    kube = control_plane_session
    tmp = tmp_path_factory.mktemp("agent")
    kube.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4g"}}})
    # KubeVirt with its own mdev handling off, and no vGPU type permitted yet.
    put_kubevirt(kube)
    # The in-use file says who holds the A2-4C; the simulated driver holds nothing itself.
    spec = tmp / "a2.yaml"
    spec.write_text(A2_SPEC.read_text().replace(', in-use: "vm default/win-1"', ""))
    try:
        with running_agent(kube, tmp, spec) as running:
            running.edit_config(
                CONFIG + "  a2-8q:\n    - devices: all\n      vgpu-devices: {A2-8Q: 2}\n"
            )
            proc = running.start()
            wait_for("the first reconcile", lambda: running.state() == "success", proc)
            before = running.get("/metrics")[1]
            # The controller permits the node's three types; the agent's next reconcile
            # (the label below) finds them in the CR.
            assert running.controller_pass().exit_code == 0
            running.label("a2-8q")
            since = "vgpu_state_layout_switch_deferred_since_timestamp_seconds{gpu="
            wait_for(
                "the deferred switch exported", lambda: since in running.get("/metrics")[1], proc
            )
            assert layout(running.root) == {"A2-4C": 1, "A2-4Q": 1, "A2-4A": 1}, "none destroyed"
            status, page = running.get("/metrics")
            assert status == 200
            yield {"before": before, "deferred": page}
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        kube.reset()


@pytest.fixture(scope="module")
def agent_metrics(agent_pages: dict[str, str]) -> str:
    return agent_pages["deferred"]


# The real controller -----------------------------------------------------------------
CONTROLLER_LAYOUTS = CONFIG + "  a2-8q:\n    - devices: all\n      vgpu-devices: {A2-8Q: 2}\n"


@pytest.fixture(scope="module")
def controller_metrics(
    control_plane_session: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The /metrics page a real controller serves over HTTP, as its own ServiceAccount,
    after a pass that wrote the KubeVirt CR and a fleet view of two reporting nodes
    (one whose layout changes)."""
    import urllib.request

    from tests.test_controller_real import _report, _scan
    from vgpu_state.catalog import default_catalog
    from vgpu_state.config import FileConfigSource
    from vgpu_state.controller.metrics import MetricsServer
    from vgpu_state.controller.run import Controller, ControllerSettings, FleetViewSettings
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.reconcile.settings import Settings

    kube = control_plane_session
    tmp = tmp_path_factory.mktemp("controller")
    layouts = tmp / "layouts.yaml"
    layouts.write_text(CONTROLLER_LAYOUTS)
    kube.request("POST", "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts", {
        "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt"},
        "spec": {},
    })  # fmt: skip
    for node, config in (("gpu-1", "a2-4g"), ("gpu-2", "a2-8q")):
        kube.ensure_node(node, {"nvidia.com/vgpu.config": config})
        _report(kube, node, _scan("a2-host.yaml", node))
    api = KubeApi.connect(str(kube.controller_kubeconfig(tmp / "kubeconfig")))
    catalog = default_catalog()
    fleet = FleetViewSettings(FileConfigSource(layouts, catalog), Settings(catalog=catalog))
    ctl = Controller(api, ControllerSettings(identity="c-0", fleet=fleet))
    server = MetricsServer(ctl.metrics, "127.0.0.1", 0).start()
    try:
        assert ctl.run_once() is not None, "the controller leads and passes"
        assert ctl.fleet_view() is True
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            page = response.read().decode()
    finally:
        server.stop()
        api.close()
        kube.reset()  # before the page is used: the agent's tests want a cluster of their own
    yield page


def test_the_real_controllers_metrics_pass_promtool_check_metrics(
    promtool: str, controller_metrics: str
) -> None:
    proc = promtool_run(promtool, "check", "metrics", stdin=controller_metrics)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        f"promtool check metrics:\n{proc.stdout}{proc.stderr}\n--- the page:\n{controller_metrics}"
    )
    # What the controller alerts read, with this pass's values: it leads, its pass
    # ended well, and the fleet view planned the node whose layout changes.
    assert sample(controller_metrics, "vgpu_state_controller_leader") == 1
    assert sample(controller_metrics, "vgpu_state_controller_last_pass_timestamp_seconds") > 0
    assert sample(controller_metrics, "vgpu_state_controller_kubevirt_in_step") == 1
    assert 'vgpu_state_fleet_nodes{outcome="changes"} 1.0' in controller_metrics
    assert 'vgpu_state_fleet_nodes{outcome="no-changes"} 1.0' in controller_metrics


def sample(page: str, name: str) -> float:
    values = [
        s.value
        for f in text_string_to_metric_families(page)
        for s in f.samples
        if s.name == name and not s.labels
    ]
    assert len(values) == 1, f"{name} is not on the page once"
    return values[0]


def test_kubevirt_cr_entries_the_controller_has_not_written_are_counted(
    agent_pages: dict[str, str],
) -> None:
    """What VgpuStateKubeVirtCRNotUpdated reads: before a controller pass the CR permits
    none of the node's three vGPU types; after it, nothing is missing."""
    name = "vgpu_state_kubevirt_cr_entries_missing"
    assert sample(agent_pages["before"], name) == 3
    assert sample(agent_pages["deferred"], name) == 0


def test_the_real_agents_metrics_pass_promtool_check_metrics(
    promtool: str, agent_metrics: str
) -> None:
    proc = promtool_run(promtool, "check", "metrics", stdin=agent_metrics)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        f"promtool check metrics:\n{proc.stdout}{proc.stderr}\n--- the page:\n{agent_metrics}"
    )
    # The facts the alerts read are on the page, with the values this node has.
    assert 'vgpu_state_node_state{mode="enforce",state="pending"} 1.0' in agent_metrics
    assert "vgpu_state_kubelet_allocatable_mismatched_resources 0.0" in agent_metrics


def test_every_metric_the_alerts_and_the_dashboard_read_is_exported(
    agent_metrics: str, controller_metrics: str
) -> None:
    exported = exported_names(agent_metrics) | exported_names(controller_metrics) | SYNTHETIC
    for alert in alerts():
        names = names_in(alert["expr"])
        assert names, f"{alert['alert']}: no metric found in {alert['expr']!r}"
        assert names <= exported, f"{alert['alert']} reads what no /metrics page exports"
    exprs = dashboard_exprs()
    assert len(exprs) >= 8, "the dashboard has panels with queries"
    read = set()
    for expr in exprs:
        names = names_in(expr)
        assert names, f"dashboard: no metric found in {expr!r}"
        assert names <= exported, f"dashboard reads what no /metrics page exports: {expr!r}"
        read |= names
    # Each of the agent's facts is on the dashboard.
    # (prometheus-client's *_created series, the time a counter was created, aside.)
    agent_families = {
        f.name
        for f in text_string_to_metric_families(agent_metrics)
        if not f.name.endswith("_created")
    }
    missing = {n for n in agent_families if not any(r.startswith(n) for r in read)}
    assert missing == set(), "agent metrics no dashboard panel shows"
