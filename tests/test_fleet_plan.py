"""``vgpu-state fleet plan``: every node planned from its reported status, on a real API server.

The cluster is upstream's kube-apiserver and etcd with ``deploy/`` installed
(the ``cluster`` fixture, ``tests/realcluster.py``), so every object here is
checked by the server's own validation (the VGPUNodeState CRD's schema, RBAC).
Every ``VGPUNodeState`` status is written by the real status writer
(:class:`~vgpu_state.kube.cluster.KubeCluster`) from a scan of a simulated node,
as that node's agent (its ServiceAccount token, bound to a Pod on the node,
under the shipped RBAC), and one by a real reconcile of the agent's cluster
port, so what ``fleet plan`` reads is what nodes report; statuses no current
agent writes (none, an old agent's, a damaged or copied scan) are stored by the
test's admin, through the status subresource. ``fleet plan`` runs as a person
would, with their own credentials (a second ``system:masters`` user), and once
with the read-only role of ``examples/gitops/fleet-reader.yaml``; that it never
writes is read from the server's audit log of that user's requests.

Two tests need no API server: an unreachable cluster is a closed port on
127.0.0.1 (nothing listens, which no running server can be made to be), and
the decoding of a damaged reported scan is checked on the scan alone.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.apiserver import NODES, NODESTATES, put_kubevirt
from tests.realcluster import AGENT_USER, FLEET_READER_USER, USER, ControlPlane, free_port
from vgpu_state.agent.cluster import AgentCluster, ClusterSink
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.cluster import KubeCluster
from vgpu_state.kube.nodestate import (
    SnapshotDecodeError,
    decode_snapshot,
    encode_snapshot,
    status_of,
)
from vgpu_state.model.inuse import InUse
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.reconcile import Mode, Ports, Settings, node_status, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.spec import parse_spec

REPO = Path(__file__).resolve().parent.parent
CATALOG = default_catalog()
HELD_A2 = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"
HELD_T4 = "7c2a4d2f-3e5c-4d2b-8e1f-2a3b4c5d6e7f"
FREE_T4 = "6b1f3c1e-2d4b-4c1a-9d0e-1f2a3b4c5d6e"

CONFIG = """\
version: v1
policy:
  in-use: protect
  prune: true
  sriov: auto
node-selectors:
  - match-labels:
      pool: t4
    config: t4-quarters
vgpu-configs:
  mixed:
    - devices: all
      device-filter: "0x25B610DE:0x157E10DE"
      vgpu-devices:
        A2-4Q: 4
    - devices: all
      device-filter: "0x1EB810DE"
      vgpu-devices:
        T4-8C: 1
    - devices: all
      device-filter: "0x26B910DE"
      vgpu-devices:
        L40S-12Q: 1
  t4-quarters:
    - devices: all
      vgpu-devices:
        T4-4Q: 4
  t4-as-is:
    - devices: [0]
      vgpu-devices:
        T4-4Q: 2
"""


def _spec(name: str, node: str) -> str:
    text = (REPO / "configs" / "sim" / name).read_text()
    lines = [f"node: {node}" if line.startswith("node:") else line for line in text.splitlines()]
    return "\n".join(lines) + "\n"


def _scan(spec_name: str, node: str) -> NodeSnapshot:
    with SimHost(parse_spec(_spec(spec_name, node), catalog=CATALOG), in_memory=True) as host:
        return host.scan()


class Fleet:
    """The test cluster, and nodes that report through the real status writer."""

    def __init__(self, cluster: ControlPlane, tmp_path: Path) -> None:
        self.server = cluster
        self.tmp_path = tmp_path
        # The person running fleet plan (and apply on a node): their own credentials.
        self.kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig", identity="user")
        self.config = tmp_path / "fleet.yaml"
        self.config.write_text(CONFIG)
        self.api = KubeApi.connect(str(self.kubeconfig))
        self._agents: dict[str, KubeApi] = {}

    def agent_api(self, node: str) -> KubeApi:
        """The API as the agent on ``node`` sees it: its ServiceAccount, bound to a Pod there."""
        if node not in self._agents:
            token = self.server.agent_token(node)
            path = self.server.write_kubeconfig(self.tmp_path / f"agent-{node}", token=token)
            self._agents[node] = KubeApi.connect(str(path))
        return self._agents[node]

    def node(self, name: str, labels: Mapping[str, str]) -> None:
        self.server.put(NODES, name, {"metadata": {"labels": dict(labels)}})

    def report(
        self,
        name: str,
        snapshot: NodeSnapshot,
        held: Mapping[str, str] | None = None,
        *,
        scanned: datetime.datetime | None = None,
        in_use_known: bool = True,
    ) -> None:
        """Write the node's status as its agent does after a scan."""
        moment = scanned or datetime.datetime.now(tz=datetime.UTC)
        kube = KubeCluster(self.agent_api(name), name, pod_resources=None, clock=lambda: moment)
        kube.observe(snapshot, held, in_use_known=in_use_known)
        kube.write_status(state=None)

    def raw_state(self, name: str, status: dict[str, Any] | None) -> None:
        body: dict[str, Any] = {
            "apiVersion": "vgpu-state.io/v1alpha1",
            "kind": "VGPUNodeState",
            "metadata": {},
            "spec": {"nodeName": name},
        }
        if status is not None:
            body["status"] = status
        self.server.put(NODESTATES, name, body)

    def run(self, *args: str | Path, config: Path | None = None) -> Result:
        argv = ["fleet", "plan", "-f", str(config or self.config), "--kubeconfig"]
        return CliRunner().invoke(cli, [*argv, str(self.kubeconfig), *map(str, args)])

    def requests(self, since: int = 0) -> list[dict[str, Any]]:
        """What the person's credentials asked of the server (its audit log)."""
        return self.server.audit(since, user=USER)


@pytest.fixture
def fleet(cluster: ControlPlane, tmp_path: Path) -> Fleet:
    f = Fleet(cluster, tmp_path)
    # node-a: A2 + T4 + L40S; the A2-4C is held by a VM and the new layout does not want it.
    f.node("node-a", {"nvidia.com/vgpu.config": "mixed"})
    f.report("node-a", _scan("mixed.yaml", "node-a"), {HELD_A2: "vm default/win-1"})
    # node-b: two T4, picked by a node-selector; grows from 2 to 4 vGPUs per GPU.
    f.node("node-b", {"pool": "t4", "zone": "b"})
    f.report("node-b", _scan("t4-pair.yaml", "node-b"), {HELD_T4: "vm default/cad-1"})
    # node-c: two T4 that already match their config.
    f.node("node-c", {"nvidia.com/vgpu.config": "t4-as-is"})
    f.report("node-c", _scan("t4-pair.yaml", "node-c"))
    return f


def _by_node(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node"]: n for n in doc["nodes"]}


def test_json_plans_each_node_from_its_labels_and_reported_layout(fleet: Fleet) -> None:
    done = fleet.run("-o", "json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert (doc["kind"], doc["format_version"]) == ("vgpu-state-fleet-plan", "1.1")
    nodes = _by_node(doc)
    assert sorted(nodes) == ["node-a", "node-b", "node-c"]

    a = nodes["node-a"]
    assert (a["outcome"], a["config"], a["selected_by"]) == ("changes", "mixed", "label")
    held = [b for b in a["plan"]["blocked"] if b["kind"] == "destroy"]
    assert [(b["type_name"], b["holder"], b["code"]) for b in held] == [
        ("A2-4C", "vm default/win-1", "InUse")
    ]
    # The T4 (T4-8C) and the L40S (L40S-12Q) keep what they have.
    assert {x["gpu"] for x in a["plan"]["actions"]} == {"0000:08:00.0"}

    b = nodes["node-b"]
    assert (b["outcome"], b["config"], b["selected_by"]) == (
        "changes",
        "t4-quarters",
        "node-selector[0]",
    )
    creates = [x for x in b["plan"]["actions"] if x["kind"] == "create"]
    assert len(creates) == 6 and {x["type_name"] for x in creates} == {"T4-4Q"}
    assert b["plan"]["blocked"] == [] and b["plan"]["summary"]["destroy"] == 0

    c = nodes["node-c"]
    assert (c["outcome"], c["plan"]["summary"]["create"]) == ("no-changes", 0)

    totals = doc["totals"]
    assert totals == {
        "nodes": 3,
        "changed": 2,
        "unchanged": 1,
        "unknown": 0,
        "errors": 0,
        "create": totals["create"],
        "destroy": a["plan"]["summary"]["destroy"],
        "sriov": 0,
        "blocked": len(a["plan"]["blocked"]),
        "disruption": {"none": 3, "device": 0, "gpu": 0},
        "capacity": totals["capacity"],
    }
    assert totals["create"] == 6 + a["plan"]["summary"]["create"]
    assert {c["resource"]: (c["before"], c["after"], c["nodes"]) for c in totals["capacity"]}[
        "nvidia.com/GRID_T4-4Q"
    ] == (4, 10, 2)
    assert doc["complete"] is True


def test_totals_sum_capacity_per_resource_and_count_nodes_per_disruption_level(
    fleet: Fleet,
) -> None:
    # node-d: two T4 switching to one T4-8C each; nothing held, so its first T4's
    # two T4-4Q go (a held one would defer that switch and destroy nothing).
    fleet.node("node-d", {"nvidia.com/vgpu.config": "mixed"})
    fleet.report("node-d", _scan("t4-pair.yaml", "node-d"), {})
    done = fleet.run("-o", "json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    d = _by_node(doc)["node-d"]["plan"]
    assert d["disruption"] == {"level": "device", "destroyed": 2, "held": 0, "gpus": 1}
    totals = doc["totals"]
    assert totals["disruption"] == {"none": 3, "device": 1, "gpu": 0}
    capacity = {c["resource"]: c for c in totals["capacity"]}
    # node-b 2 → 8, node-c 2 → 2, node-d 2 → 0.
    assert capacity["nvidia.com/GRID_T4-4Q"] == {
        "resource": "nvidia.com/GRID_T4-4Q",
        "type_name": "GRID T4-4Q",
        "publish": "device-plugin",
        "before": 6,
        "after": 10,
        "held": 1,
        "nodes": 3,
    }
    # node-a keeps its T4-8C; each of node-d's T4 gets one.
    t4_8c = capacity["nvidia.com/GRID_T4-8C"]
    assert (t4_8c["before"], t4_8c["after"]) == (1, 3)

    out = fleet.run().stdout.splitlines()
    assert out[-1].startswith("Fleet: 4 node(s): 3 with changes, 1 unchanged")
    assert out[-2] == "Disruption: nodes per level: 3 none, 1 device, 0 gpu."
    assert "Capacity across the planned nodes (vGPUs per resource, now → after):" in out
    t4 = next(line for line in out if line.startswith("  nvidia.com/GRID_T4-4Q "))
    assert t4.split()[1:5] == ["6", "→", "10", "(+4)"]
    assert t4.endswith("[on 3 node(s); 1 held]")
    rows = {line.split("│")[0].strip(): line.split("│") for line in out if "│" in line}
    assert rows["node"][7].strip() == "disruption"
    assert (rows["node-d"][7].strip(), rows["node-c"][7].strip()) == ("device", "none")


def test_table_shows_each_changed_node_with_its_holders_and_the_totals(fleet: Fleet) -> None:
    done = fleet.run()
    assert done.exit_code == 0, done.output
    out = done.stdout
    assert 'node-a: config "mixed" (by node label)' in out
    assert 'node-b: config "t4-quarters" (by node-selector[0])' in out
    # A table only for nodes that change; node-c is in the fleet table.
    assert "node-c: config" not in out
    assert "cannot be destroyed" in out and "vm default/win-1" in out
    assert "T4-4Q" in out
    fleet_lines = {line.split("│")[0].strip(): line for line in out.splitlines() if "│" in line}
    assert "no-changes" in fleet_lines["node-c"]
    assert "changes" in fleet_lines["node-b"]
    assert "Fleet: 3 node(s): 2 with changes, 1 unchanged, 0 unknown, 0 error(s)." in out


def test_fleet_plan_never_writes_to_the_cluster(fleet: Fleet) -> None:
    before = fleet.server.audit_mark()
    for args in ((), ("-o", "json"), ("--detailed-exitcode",)):
        fleet.run(*args)
    seen = fleet.requests(before)
    assert [e["verb"] for e in seen if e["verb"] != "list"] == []
    # Two list requests per run, whatever the number of nodes.
    assert len(seen) == 6, [e["requestURI"] for e in seen]


def test_the_read_only_role_is_enough_and_plans_the_same(
    fleet: Fleet, fleet_reader_kubeconfig: Path
) -> None:
    """The role ``docs/gitops.md`` ships for CI (get and list on Nodes and VGPUNodeStates)
    plans the fleet as a cluster admin does: every request a list, none refused."""
    before = fleet.server.audit_mark()
    argv = ["fleet", "plan", "-f", str(fleet.config), "--kubeconfig"]
    for output in ("text", "json"):
        as_reader = CliRunner().invoke(cli, [*argv, str(fleet_reader_kubeconfig), "-o", output])
        as_admin = fleet.run("-o", output)
        assert as_reader.exit_code == as_admin.exit_code == 0, as_reader.output
        if output == "text":
            assert as_reader.stdout == as_admin.stdout
            assert "Fleet: 3 node(s): 2 with changes, 1 unchanged" in as_reader.stdout
        else:  # the same document, but for the second it was made in
            doc, admin_doc = json.loads(as_reader.stdout), json.loads(as_admin.stdout)
            assert doc.pop("generated_at") and admin_doc.pop("generated_at")
            assert doc == admin_doc and doc["totals"]["changed"] == 2
    seen = fleet.server.audit(before, user=FLEET_READER_USER)
    assert [(e["verb"], e["responseStatus"]["code"]) for e in seen] == [("list", 200)] * 4


def test_detailed_exitcode(fleet: Fleet, tmp_path: Path) -> None:
    assert fleet.run("--detailed-exitcode").exit_code == 2
    # Every node's layout as it is: nothing to change anywhere.
    converged = tmp_path / "converged.yaml"
    converged.write_text(
        CONFIG.replace("A2-4Q: 4", "A2-4Q: 1\n        A2-4C: 1").replace(
            "config: t4-quarters", "config: t4-as-is"
        )
    )
    done = fleet.run("--detailed-exitcode", "-o", "json", config=converged)
    doc = json.loads(done.stdout)
    assert [n["outcome"] for n in doc["nodes"]] == ["no-changes"] * 3, doc
    assert done.exit_code == 0
    assert fleet.run("-o", "json", config=converged).exit_code == 0


def test_nodes_without_a_usable_report_are_unknown_with_the_reason(fleet: Fleet) -> None:
    fleet.node("node-d", {"nvidia.com/vgpu.config": "mixed"})
    fleet.raw_state("node-d", None)
    # An agent from before reported scans: layout but no snapshot.
    fleet.node("node-e", {"nvidia.com/vgpu.config": "mixed"})
    fleet.raw_state("node-e", {"state": "success", "vgpuCount": 0})
    # A damaged snapshot.
    fleet.node("node-f", {"nvidia.com/vgpu.config": "mixed"})
    fleet.report("node-f", _scan("t4-pair.yaml", "node-f"))
    damaged = fleet.server.get(NODESTATES, "node-f")
    assert damaged is not None
    damaged["status"]["snapshot"]["data"] = damaged["status"]["snapshot"]["data"][:40]
    fleet.server.put(NODESTATES, "node-f", damaged)
    # A node whose agent last scanned two days ago.
    fleet.node("node-g", {"nvidia.com/vgpu.config": "t4-as-is"})
    long_ago = datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(days=2)
    fleet.report("node-g", _scan("t4-pair.yaml", "node-g"), scanned=long_ago)
    # A VGPUNodeState whose Node is gone.
    fleet.node("node-h", {"nvidia.com/vgpu.config": "t4-as-is"})
    fleet.report("node-h", _scan("t4-pair.yaml", "node-h"))
    fleet.api.delete("/api/v1/nodes/node-h")

    done = fleet.run("-o", "json")
    assert done.exit_code == 0, done.output
    nodes = _by_node(json.loads(done.stdout))
    unknown = {
        n: (v["reason"], v["message"]) for n, v in nodes.items() if v["outcome"] == "unknown"
    }
    assert {n: r for n, (r, _) in unknown.items()} == {
        "node-d": "NoStatus",
        "node-e": "NoSnapshot",
        "node-f": "SnapshotUnreadable",
        "node-g": "Stale",
        "node-h": "NodeMissing",
    }
    assert "truncated" in unknown["node-f"][1] or "gzip" in unknown["node-f"][1]
    assert "2d old" in unknown["node-g"][1]
    assert nodes["node-e"]["reported_state"] == "success"
    assert nodes["node-a"]["outcome"] == "changes"

    # --max-age 0 accepts the old scan.
    nodes = _by_node(json.loads(fleet.run("-o", "json", "--max-age", "0").stdout))
    assert nodes["node-g"]["outcome"] == "no-changes"

    # Unknown nodes make a detailed exit code 1: the fleet plan is not complete.
    assert fleet.run("--detailed-exitcode").exit_code == 1
    table = fleet.run().stdout
    assert "NoStatus" in table and "Stale" in table
    assert "3 unchanged" not in table and "5 unknown" in table


def test_a_node_nothing_selects_is_reported_as_an_error(fleet: Fleet) -> None:
    fleet.node("node-x", {"zone": "c"})
    fleet.report("node-x", _scan("t4-pair.yaml", "node-x"))
    done = fleet.run("-o", "json")
    assert done.exit_code == 1
    x = _by_node(json.loads(done.stdout))["node-x"]
    assert (x["outcome"], x["reason"]) == ("error", "NoConfigSelected")
    assert "no node-selector matches and the file has no default" in x["message"]
    # The other nodes are still planned.
    assert _by_node(json.loads(done.stdout))["node-b"]["outcome"] == "changes"
    table = fleet.run()
    assert table.exit_code == 1
    assert "NoConfigSelected" in table.stdout and "1 error(s)" in table.stdout


def test_holders_unknown_at_the_report_is_a_warning(fleet: Fleet) -> None:
    fleet.report("node-a", _scan("mixed.yaml", "node-a"), None, in_use_known=False)
    a = _by_node(json.loads(fleet.run("-o", "json").stdout))["node-a"]
    assert a["outcome"] == "changes"
    assert any("held" in w for w in a["warnings"]), a["warnings"]
    # Without holders the A2-4C is planned for destruction; its agent would check again.
    assert any(x["kind"] == "destroy" for x in a["plan"]["actions"])


def test_config_error_names_the_place_and_reads_nothing_from_the_cluster(
    fleet: Fleet, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.replace("T4-8C: 1", "T4-8C: many"))
    before = fleet.server.audit_mark()
    done = fleet.run(config=bad)
    assert done.exit_code == 1
    assert f"{bad}:19:16:" in done.stderr and "many" in done.stderr, done.stderr
    assert "Traceback" not in done.output
    # Not even a read: the config is checked before the cluster is asked.
    assert fleet.requests(before) == []


def test_an_unreachable_cluster_is_an_error(fleet: Fleet, tmp_path: Path) -> None:
    """A kubeconfig whose server is a closed port (nothing listens there: a fault of no
    running API server, so none is needed) fails with the reason, not a traceback."""
    closed = f"https://127.0.0.1:{free_port()}"
    kubeconfig = fleet.server.write_kubeconfig(tmp_path / "closed", server=closed)
    done = CliRunner().invoke(
        cli, ["fleet", "plan", "-f", str(fleet.config), "--kubeconfig", str(kubeconfig)]
    )
    assert done.exit_code == 1
    assert "unreachable" in done.stderr and "Traceback" not in done.output


def test_bad_max_age_is_a_usage_error(fleet: Fleet) -> None:
    done = fleet.run("--max-age", "soon")
    assert done.exit_code == 1 and "--max-age" in done.output


def test_the_reported_snapshot_round_trips(fleet: Fleet) -> None:
    snapshot = _scan("mixed.yaml", "node-a")
    status = status_of(fleet.server.get(NODESTATES, "node-a"))
    assert status is not None and status.snapshot is not None
    assert decode_snapshot(status.snapshot) == snapshot
    assert status.snapshot.fingerprint == snapshot.fingerprint()


def test_fleet_plan_agrees_with_the_agents_own_reconcile(fleet: Fleet) -> None:
    """A real reconcile (the agent's cluster port and sink) writes the status fleet plan reads."""
    fleet.node("node-r", {"nvidia.com/vgpu.config": "t4-quarters"})
    document = load_text(CONFIG, "fleet.yaml", catalog=CATALOG)
    held = InUse({HELD_T4: "vm default/cad-1"})
    with SimHost(
        parse_spec(_spec("t4-pair.yaml", "node-r"), catalog=CATALOG), in_memory=True
    ) as host:
        agent = AgentCluster(
            fleet.agent_api("node-r"), "node-r", pod_resources=None, in_use_source=lambda: held
        )
        ports = Ports(
            host,
            agent,
            StaticConfigSource(document),
            ClusterSink(agent),
        )
        settings = Settings(catalog=default_catalog())
        # The agent in plan-only mode: plan, hand the scan to its sink, report.
        report = reconcile_once(ports, settings, mode=Mode.PLAN)
        ports.device_plugin.refresh(report.advertised)
        agent.report_status(node_status(report))
        nodes = _by_node(json.loads(fleet.run("-o", "json").stdout))
        assert report.plan.actions and not report.plan.blocked
        assert nodes["node-r"]["plan"]["actions"] == [
            a.model_dump(mode="json") for a in report.plan.actions
        ]
        # The agent applies; its status now shows the converged layout.
        reconcile_once(ports, settings, mode=Mode.APPLY)
    nodes = _by_node(json.loads(fleet.run("-o", "json").stdout))
    assert nodes["node-r"]["outcome"] == "no-changes"
    assert nodes["node-r"]["reported_config"] == "t4-quarters"


def test_apply_with_kubeconfig_reports_what_fleet_plan_needs(fleet: Fleet, tmp_path: Path) -> None:
    """``apply --kubeconfig`` writes the scan and the holders it found; fleet plan reads both."""
    put_kubevirt(fleet.server)
    fleet.node("node-k", {"nvidia.com/vgpu.config": "t4-as-is"})
    spec = tmp_path / "node-k.yaml"
    spec.write_text(_spec("t4-pair.yaml", "node-k"))
    applied = CliRunner().invoke(
        cli,
        [
            "apply",
            "-f",
            str(fleet.config),
            "--sim",
            str(spec),
            "--node",
            "node-k",
            "--kubeconfig",
            str(fleet.kubeconfig),
            "--auto-approve",
        ],
    )
    assert applied.exit_code == 0, applied.output
    status = status_of(fleet.server.get(NODESTATES, "node-k"))
    assert status is not None and status.snapshot is not None
    holders = {v.id: v.holder for g in status.gpus for v in g.vgpus if v.holder}
    assert holders == {HELD_T4: "vm default/cad-1"}

    eighths = tmp_path / "eighths.yaml"
    eighths.write_text(CONFIG.replace("T4-4Q: 2", "T4-8Q: 2"))
    k = _by_node(json.loads(fleet.run("-o", "json", config=eighths).stdout))["node-k"]
    assert k["outcome"] == "changes"
    held = [b for b in k["plan"]["blocked"] if b["kind"] == "destroy"]
    # The held T4-4Q keeps every T4-8Q out, so the switch of that GPU is deferred:
    # its free T4-4Q stays too, and the plan names the holder it waits for.
    assert [(b["address"], b["holder"], b["code"]) for b in held] == [
        (f"gpu[0000:3b:00.0].vgpu[{HELD_T4}]", "vm default/cad-1", "InUse"),
        (f"gpu[0000:3b:00.0].vgpu[{FREE_T4}]", None, "SwitchDeferred"),
    ]
    [t4] = [g for g in k["plan"]["gpus"] if g["address"] == "0000:3b:00.0"]
    assert t4["deferred_switch"]["waits_for"] == ["vm default/cad-1"]
    assert k["plan"]["summary"]["destroy"] == 0


def test_a_reported_scan_that_is_damaged_is_refused_with_the_reason() -> None:
    snapshot = _scan("t4-pair.yaml", "node-z")
    good = encode_snapshot(snapshot, datetime.datetime(2026, 11, 23, tzinfo=datetime.UTC))
    assert good.scanned_at == "2026-11-23T00:00:00Z"
    # Equal scans give equal text: a status rewrite of an unchanged host changes nothing.
    assert encode_snapshot(snapshot, datetime.datetime(2026, 11, 23, tzinfo=datetime.UTC)) == good
    cases = {
        "not base64": good.model_copy(update={"data": "%%%"}),
        "not gzip": good.model_copy(update={"data": base64.b64encode(b"plain").decode()}),
        "larger than": good.model_copy(
            update={"data": base64.b64encode(gzip.compress(b" " * (17 << 20))).decode()}
        ),
        "not a valid scan": good.model_copy(
            update={"data": base64.b64encode(gzip.compress(b'{"gpus": 3}')).decode()}
        ),
        "fingerprint": good.model_copy(update={"fingerprint": "sha256:" + "0" * 64}),
    }
    for expected, reported in cases.items():
        with pytest.raises(SnapshotDecodeError, match=expected):
            decode_snapshot(reported)


def test_a_steady_node_rewrites_its_scan_only_every_ten_minutes(fleet: Fleet) -> None:
    """An unchanged scan changes nothing in the status until its time is 10 minutes old;
    a changed scan is written at once."""
    t0 = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
    now = [t0]
    fleet.node("node-s", {"nvidia.com/vgpu.config": "t4-as-is"})
    kube = KubeCluster(
        fleet.agent_api("node-s"), "node-s", pod_resources=None, clock=lambda: now[0]
    )

    def report(snapshot: NodeSnapshot, minutes: int) -> str | None:
        now[0] = t0 + datetime.timedelta(minutes=minutes)
        kube.observe(snapshot)
        kube.write_status(state=None)
        status = status_of(fleet.server.get(NODESTATES, "node-s"))
        assert status is not None and status.snapshot is not None
        return status.snapshot.scanned_at

    def puts() -> int:
        """Status writes of the agent on node-s, as the server's audit log shows them
        (requests that name no object, such as API discovery, have no ``objectRef``)."""
        return sum(
            e["verb"] in ("update", "patch") and e["objectRef"].get("subresource") == "status"
            for e in fleet.server.audit(user=AGENT_USER)
            if e.get("objectRef", {}).get("name") == "node-s"
        )

    assert report(_scan("t4-pair.yaml", "node-s"), 0) == "2026-11-23T12:00:00Z"
    written = puts()
    assert report(_scan("t4-pair.yaml", "node-s"), 1) == "2026-11-23T12:00:00Z"
    assert report(_scan("t4-pair.yaml", "node-s"), 9) == "2026-11-23T12:00:00Z"
    assert puts() == written
    assert report(_scan("t4-pair.yaml", "node-s"), 10) == "2026-11-23T12:10:00Z"
    assert puts() == written + 1
    assert report(_scan("mixed.yaml", "node-s"), 11) == "2026-11-23T12:11:00Z"
    assert puts() == written + 2


def test_a_status_carrying_another_nodes_scan_or_repeated_gpus_is_unknown(fleet: Fleet) -> None:
    """A status is a claim: one that copies node-a's scan, or lists the same GPUs 750 times,
    is not planned against (it is listed as unknown, with the reason); one from a newer
    agent with a field this version does not know still is."""
    copied = fleet.server.get(NODESTATES, "node-a")
    assert copied is not None
    fleet.node("node-x", {"nvidia.com/vgpu.config": "mixed"})
    fleet.raw_state("node-x", copied["status"])
    scan = _scan("t4-pair.yaml", "node-y")
    repeated = scan.model_copy(update={"gpus": scan.gpus * 750})
    fleet.node("node-y", {"nvidia.com/vgpu.config": "t4-as-is"})
    reported = encode_snapshot(repeated, datetime.datetime.now(datetime.UTC))
    fleet.raw_state("node-y", {"snapshot": reported.to_json()})
    newer = fleet.server.get(NODESTATES, "node-c")
    assert newer is not None
    newer["status"]["placementHints"] = {"numa": [0, 1]}
    fleet.server.put(NODESTATES, "node-c", newer)

    nodes = _by_node(json.loads(fleet.run("-o", "json").stdout))
    assert nodes["node-x"]["outcome"] == "unknown"
    assert nodes["node-x"]["reason"] == "ScanRefused"
    assert "its scan is of node 'node-a', not 'node-x'" in nodes["node-x"]["message"]
    assert nodes["node-y"]["reason"] == "ScanRefused"
    assert "repeats PCI addresses" in nodes["node-y"]["message"]
    assert nodes["node-c"]["outcome"] == "no-changes"
