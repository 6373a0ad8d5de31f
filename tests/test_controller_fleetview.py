"""The controller's fleet view and metrics against the real API server: the same totals
as ``vgpu-state fleet plan -o json`` on the same fleet, as the controller's own
ServiceAccount (its RBAC: Nodes listed, reports read), and a scrape that parses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.hostile_reports import bounding
from tests.realcluster import ControlPlane
from tests.test_controller_real import _report, _scan
from vgpu_state.catalog import default_catalog
from vgpu_state.config import FileConfigSource
from vgpu_state.controller.run import Controller, ControllerSettings, FleetViewSettings
from vgpu_state.kube.api import KubeApi
from vgpu_state.reconcile.settings import Settings

REPO = Path(__file__).resolve().parent.parent
LAYOUTS = """\
version: v1
vgpu-configs:
  a2-4g:
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 1, A2-4A: 1}
  swap:
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 3}
"""


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_fleet_view_is_the_fleet_plan_as_metrics(cluster: ControlPlane, tmp_path: Path) -> None:
    layouts = tmp_path / "layouts.yaml"
    layouts.write_text(LAYOUTS)
    for node, layout in (("gpu-1", "a2-4g"), ("gpu-2", "swap"), ("gpu-3", "swap")):
        cluster.ensure_node(node, {"nvidia.com/vgpu.config": layout})
        _report(cluster, node, _scan("a2-host.yaml", node))
    cluster.ensure_node("gpu-4", {"nvidia.com/vgpu.config": "swap"})  # no report: not planned

    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    catalog = default_catalog()
    fleet = FleetViewSettings(FileConfigSource(layouts, catalog), Settings(catalog=catalog))
    ctl = Controller(api, ControllerSettings(identity="c-0", fleet=fleet))
    assert ctl.fleet_view() is True
    assert ctl.fleet_view() is False, "the next view waits for its interval"
    got = samples(ctl.metrics.exposition().decode())

    admin = cluster.workdir / "kubeconfig"
    proc = subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", "fleet", "plan", "-f", str(layouts),
         "--kubeconfig", str(admin), "-o", "json"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    totals = json.loads(proc.stdout)["totals"]
    assert totals["nodes"] == 3 and totals["changed"] == 2

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    for outcome, key in (("changes", "changed"), ("no-changes", "unchanged"),
                         ("unknown", "unknown"), ("error", "errors")):  # fmt: skip
        assert value("vgpu_state_fleet_nodes", outcome=outcome) == totals[key], outcome
    for kind in ("create", "destroy", "sriov", "blocked"):
        assert value("vgpu_state_fleet_planned_actions", kind=kind) == totals[kind], kind
    for level, n in totals["disruption"].items():
        assert value("vgpu_state_fleet_disruption_nodes", level=level) == n, level
    assert totals["capacity"], "the plan has capacity rows"
    for row in totals["capacity"]:
        key = {
            "resource": row["resource"] or "",
            "type": row["type_name"],
            "publish": row["publish"],
        }
        assert value("vgpu_state_fleet_capacity_vgpus", **key, phase="before") == row["before"]
        assert value("vgpu_state_fleet_capacity_vgpus", **key, phase="after") == row["after"]
        assert value("vgpu_state_fleet_held_vgpus", **key) == row["held"]
    # Two nodes swap the A2-4A for two A2-4Q: fewer A2-4A after, more A2-4Q.
    a2_4a = next(r for r in totals["capacity"] if r["type_name"].endswith("A2-4A"))
    assert (a2_4a["before"], a2_4a["after"]) == (3, 1)


def test_the_controller_reports_its_passes_and_leadership(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    cluster.request("POST", "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts", {
        "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt"},
        "spec": {},
    })  # fmt: skip
    _report(cluster, "gpu-1", _scan("a2-host.yaml", "gpu-1"))
    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    ctl = Controller(api, ControllerSettings(identity="c-0", **bounding()))
    assert ctl.run_once() is not None
    assert ctl.run_once() is not None
    got = samples(ctl.metrics.exposition().decode())
    assert got[("vgpu_state_controller_leader", ())] == 1
    assert got[("vgpu_state_controller_kubevirt_writes_total", (("result", "ok"),))] == 1
    assert got[("vgpu_state_controller_kubevirt_in_step", ())] == 1
    assert got[("vgpu_state_controller_last_pass_timestamp_seconds", ())] > 0
    assert got[("vgpu_state_controller_layouts_loaded", ())] == 1
    # Another replica, while this one's Lease is live: it follows and says so.
    other = Controller(api, ControllerSettings(identity="c-1"))
    assert other.run_once() is None
    assert samples(other.metrics.exposition().decode())[("vgpu_state_controller_leader", ())] == 0
