"""``fleet snapshot`` and ``fleet plan --from``: a fleet planned offline, on a real API server.

The snapshot is taken with the token of the ServiceAccount that
``examples/gitops/fleet-reader.yaml`` ships for a CI job (get and list on
Nodes and VGPUNodeStates, nothing else), against upstream's kube-apiserver
with ``deploy/`` installed and nodes that report through the real status
writer (the fleet of ``tests/test_fleet_plan.py``). ``fleet plan --from``
then runs with no cluster at all, and must print what planning against the
cluster printed.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.realcluster import FLEET_READER_USER, NAMESPACE, ApiError, ControlPlane
from tests.test_fleet_plan import HELD_A2, HELD_T4, Fleet, _scan
from vgpu_state.cli.main import cli

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def fleet(cluster: ControlPlane, tmp_path: Path) -> Fleet:
    """Three nodes that report as their agents do: two with changes (a held vGPU in the
    way on node-a), one unchanged (the fleet of ``tests/test_fleet_plan.py``)."""
    f = Fleet(cluster, tmp_path)
    f.node("node-a", {"nvidia.com/vgpu.config": "mixed"})
    f.report("node-a", _scan("mixed.yaml", "node-a"), {HELD_A2: "vm default/win-1"})
    f.node("node-b", {"pool": "t4", "zone": "b"})
    f.report("node-b", _scan("t4-pair.yaml", "node-b"), {HELD_T4: "vm default/cad-1"})
    f.node("node-c", {"nvidia.com/vgpu.config": "t4-as-is"})
    f.report("node-c", _scan("t4-pair.yaml", "node-c"))
    return f


def _offline(fleet: Fleet, snapshot: Path, *args: str) -> Result:
    """``fleet plan --from``: no kubeconfig at all."""
    argv = ["fleet", "plan", "-f", str(fleet.config), "--from", str(snapshot), *args]
    return CliRunner(env={"KUBECONFIG": "/nonexistent"}).invoke(cli, argv)


def _snapshot(kubeconfig: Path, out: Path) -> Result:
    done = _run("fleet", "snapshot", "--kubeconfig", kubeconfig, "--out", out)
    assert done.exit_code == 0, done.output
    return done


def _without_time(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "generated_at"}


def test_plan_from_a_snapshot_prints_what_planning_against_the_cluster_printed(
    fleet: Fleet, fleet_reader_kubeconfig: Path, tmp_path: Path
) -> None:
    snapshot = tmp_path / "fleet.jsonl"
    mark = fleet.server.audit_mark()
    done = _snapshot(fleet_reader_kubeconfig, snapshot)
    assert "3 Node(s), 3 VGPUNodeState(s)" in done.stderr
    # The reader's token made list requests only, and nothing was refused.
    seen = fleet.server.audit(mark, user=FLEET_READER_USER)
    assert {e["verb"] for e in seen} == {"list"}
    assert all(e["responseStatus"]["code"] == 200 for e in seen)

    for output in ("text", "json", "markdown"):
        live = fleet.run("-o", output)
        offline = _offline(fleet, snapshot, "-o", output, "--jobs", "1")
        assert live.exit_code == offline.exit_code == 0, offline.output
        if output == "json":
            live_doc, offline_doc = json.loads(live.stdout), json.loads(offline.stdout)
            assert _without_time(offline_doc) == _without_time(live_doc)
            assert offline_doc["totals"]["changed"] == 2
        elif output == "markdown":
            # The same comment; only its line on where the fleet was read differs.
            source = re.compile(r"^The fleet as of \S+ \((snapshot of )?https://\S+\);", re.M)
            assert len(source.findall(live.stdout)) == 1
            assert source.sub("", offline.stdout) == source.sub("", live.stdout)
            assert f"(snapshot of {fleet.server.url});" in offline.stdout
            blocked = offline.stdout.split("#### Blocked and deferred")[1].split("####")[0]
            assert "| <code>node-a</code> |" in blocked and "| vm default/win-1 |" in blocked
        else:
            assert offline.stdout == live.stdout
            assert "vm default/win-1" in offline.stdout
    # With the cluster gone (no kubeconfig reaches it), the plan is the same.
    fleet.server.kubectl("delete", "vgpunodestates", "--all")
    again = _offline(fleet, snapshot)
    assert again.stdout == _offline(fleet, snapshot, "--jobs", "2", "--chunk-size", "1").stdout
    assert 'node-a: config "mixed" (by node label)' in again.stdout
    assert "Fleet: 3 node(s): 2 with changes, 1 unchanged" in again.stdout


def test_plan_from_makes_no_request(
    fleet: Fleet, fleet_reader_kubeconfig: Path, tmp_path: Path
) -> None:
    snapshot = tmp_path / "fleet.jsonl.gz"
    _snapshot(fleet_reader_kubeconfig, snapshot)
    assert snapshot.read_bytes()[:2] == b"\x1f\x8b"  # gzip, by its name
    mark = fleet.server.audit_mark()
    done = _offline(fleet, snapshot)
    assert done.exit_code == 0, done.output
    assert fleet.server.audit(mark) == []
    assert "Fleet: 3 node(s)" in done.stdout


def test_the_snapshot_is_versioned_json_lines(
    fleet: Fleet, fleet_reader_kubeconfig: Path, tmp_path: Path
) -> None:
    snapshot = tmp_path / "fleet.jsonl"
    fleet.node("node-idle", {"pool": "cpu"})  # a Node without a VGPUNodeState
    _snapshot(fleet_reader_kubeconfig, snapshot)
    records = [json.loads(line) for line in snapshot.read_text().splitlines()]
    header = records[0]
    assert header["kind"] == "vgpu-state-fleet-snapshot"
    assert header["format_version"] == "1"
    assert header["taken_at"].endswith("Z")
    assert header["source"]["server"] == fleet.server.url
    kinds = [r["kind"] for r in records[1:]]
    assert kinds == ["Node"] * 4 + ["VGPUNodeState"] * 3 + ["end"]
    assert records[1:5][3] == {"kind": "Node", "name": "node-idle", "labels": {"pool": "cpu"}}
    node_a = records[5]
    assert node_a["name"] == "node-a" and node_a["status"]["snapshot"]
    held = [v for g in node_a["status"]["gpus"] for v in g["vgpus"] if v.get("holder")]
    assert [(v["id"], v["holder"]) for v in held] == [(HELD_A2, "vm default/win-1")]
    assert records[-1] == {"kind": "end", "nodes": 4, "states": 3}


def test_the_reader_role_reads_and_writes_nothing(
    fleet: Fleet, fleet_reader_kubeconfig: Path, tmp_path: Path
) -> None:
    fleet.server.refusals_expected = True
    token = json.loads(fleet_reader_kubeconfig.read_text())["users"][0]["user"]["token"]
    for method, path, body in (
        ("PATCH", "/api/v1/nodes/node-a", {"metadata": {"labels": {"x": "y"}}}),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets", None),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps", None),
        ("DELETE", "/apis/vgpu-state.io/v1alpha1/vgpunodestates/node-a", None),
    ):
        with pytest.raises(ApiError) as refused:
            fleet.server.request(method, path, body, "application/merge-patch+json", token=token)
        assert refused.value.status == 403, (method, path)


def test_a_snapshot_needs_list_on_the_states(fleet: Fleet, tmp_path: Path) -> None:
    """Without the role, the snapshot fails with the server's refusal and leaves no file."""
    fleet.server.refusals_expected = True
    # An identity no role names (the agent lists its own node's VGPUNodeState to watch it).
    with contextlib.suppress(ApiError):  # made by an earlier test
        fleet.server.request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}},
        )
    token = fleet.server.agent_token("node-a", service_account="nobody")
    kubeconfig = fleet.server.write_kubeconfig(tmp_path / "agent", token=token)
    out = tmp_path / "fleet.jsonl"
    done = _run("fleet", "snapshot", "--kubeconfig", kubeconfig, "--out", out)
    assert done.exit_code == 1
    assert "forbidden" in done.stderr.lower() or "403" in done.stderr
    assert not out.exists() and list(tmp_path.glob(".fleet-snapshot-*")) == []


def test_from_and_a_cluster_are_exclusive(tmp_path: Path) -> None:
    config = tmp_path / "layouts.yaml"
    config.write_text((REPO / "configs" / "default.yaml").read_text())
    snapshot = tmp_path / "fleet.jsonl"
    snapshot.write_text("")
    done = _run("fleet", "plan", "-f", config, "--from", snapshot, "--context", "prod")
    assert done.exit_code == 1  # a usage error
    assert "--from plans from the snapshot file alone" in done.stderr


# bad snapshots -------------------------------------------------------------------------------
HEADER = (
    '{"kind":"vgpu-state-fleet-snapshot","format_version":"1",'
    '"taken_at":"2026-11-25T06:00:00Z","source":{"server":"https://k:6443","context":null}}'
)
NODE = '{"kind":"Node","name":"n1","labels":{"a":"b"}}'
STATE = '{"kind":"VGPUNodeState","name":"n1"}'
END = '{"kind":"end","nodes":1,"states":1}'


@pytest.mark.parametrize(
    ("lines", "where", "problem"),
    [
        ([], ":1:1: ", "the file is empty"),
        (['{"kind":"Node"}'], ":1:1: ", "not a fleet snapshot: the first line's kind is 'Node'"),
        ([HEADER.replace('"1"', '"7"')], ":1:1: ", "format_version '7' is not supported"),
        ([HEADER.replace("06:00:00Z", "06:00:00")], ":1:1: ", "is not a time with a zone"),
        ([HEADER, '{"kind":"Node","name":"n1",'], ":2:28: ", "not JSON: Expecting"),
        ([HEADER, "[1, 2]"], ":2:1: ", "expected a JSON object, found list"),
        ([HEADER, NODE, NODE], ":3:1: ", "Node 'n1' is listed twice"),
        ([HEADER, '{"kind":"Pod","name":"p"}'], ":2:1: ", "unknown record kind 'Pod'"),
        ([HEADER, '{"kind":"Node","name":""}'], ":2:1: ", "Node record without a name"),
        ([HEADER, '{"kind":"Node","name":"n","labels":{"a":1}}'], ":2:1: ", "labels must map"),
        ([HEADER, NODE, STATE, NODE, END], ":4:1: ", "Node record after the first"),
        ([HEADER, NODE, STATE, STATE, END], ":4:1: ", "VGPUNodeState 'n1' is listed twice"),
        ([HEADER, NODE, STATE], ":3:1: ", "without its end record: it was cut short"),
        ([HEADER, NODE, STATE, END, STATE], ":5:1: ", "a record after the end record"),
        ([HEADER, NODE, END], ":3:1: ", "the end record counts 1 Node(s) and 1"),
        ([HEADER, NODE, "", STATE, END], ":3:1: ", "empty line"),
    ],
)
def test_a_bad_snapshot_is_refused_naming_file_line_and_problem(
    tmp_path: Path, lines: list[str], where: str, problem: str
) -> None:
    config = tmp_path / "layouts.yaml"
    config.write_text((REPO / "configs" / "default.yaml").read_text())
    snapshot = tmp_path / "fleet.jsonl"
    snapshot.write_text("".join(f"{line}\n" for line in lines))
    done = _run("fleet", "plan", "-f", config, "--from", snapshot, "--jobs", "1")
    assert done.exit_code == 1, done.output
    assert done.stdout == ""
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"error: {snapshot}{where}"), first
    assert problem in first, first


def test_a_truncated_gzip_snapshot_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "layouts.yaml"
    config.write_text((REPO / "configs" / "default.yaml").read_text())
    snapshot = tmp_path / "fleet.jsonl.gz"
    whole = gzip.compress(f"{HEADER}\n{NODE}\n{STATE}\n{END}\n".encode())
    snapshot.write_bytes(whole[: len(whole) - 12])
    done = _run("fleet", "plan", "-f", config, "--from", snapshot)
    assert done.exit_code == 1
    assert f"error: {snapshot}:" in done.stderr
    assert "cannot read the file" in done.stderr or "cut short" in done.stderr


def test_a_snapshot_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "layouts.yaml"
    config.write_text((REPO / "configs" / "default.yaml").read_text())
    done = _run("fleet", "plan", "-f", config, "--from", tmp_path)
    assert done.exit_code == 1
    assert "is a directory" in done.stderr
    done = _run("fleet", "plan", "-f", config, "--from", tmp_path / "missing.jsonl")
    assert done.exit_code == 1
    assert f"error: {tmp_path / 'missing.jsonl'}: cannot read the file" in done.stderr
