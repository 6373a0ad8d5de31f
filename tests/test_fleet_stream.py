"""``fleet plan`` over a fleet read page by page: the same output, whatever the paging.

The fleet is the benchmark's (``bench/fleet.py``: six pools, every shape of
node, every fourth node with a held vGPU), cut to a few dozen nodes, plus the
nodes a real cluster also has: one that has not reported, one whose Node is
gone, one that no config selects, one whose holders were unknown, one that ran
another config, one whose status does not match the CRD's schema. It is served
by the harness's real kube-apiserver + etcd (``real_cluster``, see
``tests/realcluster.py``), written there before each test (the harness deletes
every Node and VGPUNodeState after each): Nodes with their labels,
VGPUNodeStates with their status through ``/status``; the status the schema
refuses is rewritten in etcd under the server (:func:`store_fleet`).
``fleet plan`` runs as a person (the harness's ``user`` identity), and the
server's audit log tells how many list requests it made.

The golden files ``tests/golden/fleet-plan.txt`` and ``fleet-plan.json`` were
written by the command as it was before it streamed (it read both lists whole,
decoded and kept every node, then rendered), so these tests prove the output
is unchanged, table and JSON, byte for byte (``generated_at`` aside). After an
intended change of the output, regenerate them with ``UPDATE_GOLDEN=1`` and
review the diff.

One test uses the API server emulator (``tests/apiserver.py``) instead: a server
that lists out of name order, which a real one cannot be made to do. The decoder,
fingerprint, continue-token and per-node plan tests need no server.
"""

from __future__ import annotations

import base64
import concurrent.futures
import copy
import datetime
import functools
import gzip
import importlib.util
import json
import os
import random
import re
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.apiserver import RunningApiServer
from tests.realcluster import USER, ControlPlane
from vgpu_state.cli.fleet import plan_page
from vgpu_state.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
SCANNED = datetime.datetime(2026, 11, 23, 9, 0, tzinfo=datetime.UTC)
COUNT = 24
NODES = "v1/nodes"
NODESTATES = "vgpu-state.io/v1alpha1/vgpunodestates"
BROKEN = "gpu-bbb-broken"  # its status does not match the schema


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_fleet", REPO / "bench" / "fleet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_fleet", module)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()


def _scan_of(node: str, reported: dict[str, Any]) -> dict[str, Any]:
    """``reported`` (a status's scan) as the scan of ``node``."""
    from vgpu_state.kube.nodestate import (
        ReportedSnapshot,
        decode_snapshot,
        encode_snapshot,
        parse_time,
    )

    value = ReportedSnapshot.model_validate(reported)
    scanned = parse_time(value.scanned_at)
    assert scanned is not None
    own = decode_snapshot(value).model_copy(update={"node": node})
    return encode_snapshot(own, scanned).to_json()


def fleet_objects() -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """(name, Node or None, VGPUNodeState or None) for every node of the test fleet."""
    return copy.deepcopy(_fleet_objects())


@functools.cache
def _fleet_objects() -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    out: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    for node, state in BENCH.fleet_items(COUNT, SCANNED):
        out.append((node["metadata"]["name"], node, state))
    # Holders unknown at the last report: planned, with a warning.
    out[1][2]["status"]["inUseKnown"] = False  # type: ignore[index]
    # Ran another config before: the fleet table says what it was.
    out[2][2]["status"]["selectedConfig"] = {  # type: ignore[index]
        "name": "legacy",
        "source": "label",
        "reason": "label nvidia.com/vgpu.config=legacy",
    }
    template_node, template_state = out[3][1], out[3][2]
    assert template_node is not None and template_state is not None

    def renamed(name: str, obj: dict[str, Any], **labels: str) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj["metadata"]["name"] = name
        if "labels" in obj["metadata"] and labels:
            obj["metadata"]["labels"].update(labels)
        reported = (obj.get("status") or {}).get("snapshot")
        if reported is not None:
            # A node reports a scan of its own (one naming another node is refused).
            obj["status"]["snapshot"] = _scan_of(name, reported)
        return obj

    # A node that has not reported (a VGPUNodeState without status).
    quiet = renamed("gpu-aaa-quiet", template_state)
    del quiet["status"]
    out.append(("gpu-aaa-quiet", renamed("gpu-aaa-quiet", template_node), quiet))
    # A Node with a status no config selects (its pool has no rule): an error.
    out.append(
        (
            "gpu-mmm-unselected",
            renamed("gpu-mmm-unselected", template_node, pool="unknown-pool"),
            renamed("gpu-mmm-unselected", template_state),
        )
    )
    # A status whose Node is gone.
    out.append(("gpu-zzz-gone", None, renamed("gpu-zzz-gone", template_state)))
    # A status that does not match the schema.
    broken = renamed(BROKEN, template_state)
    broken["status"]["vgpuCount"] = "many"
    out.append((BROKEN, renamed(BROKEN, template_node), broken))
    return out


def store_fleet(plane: ControlPlane) -> None:
    """The test fleet, written to the real API server as the admin: each Node's labels,
    each VGPUNodeState's spec and (through ``/status``) status, a few nodes at a time.

    The one status the CRD's schema refuses (``gpu-bbb-broken``'s, a string for a
    count) is stored valid, then rewritten in etcd under the server, as an object
    stored before its schema checked it is kept: the server serves what its storage
    holds, and ``fleet plan`` must say it cannot read it."""

    def store(name: str, node: dict[str, Any] | None, state: dict[str, Any] | None) -> None:
        if node is not None:
            plane.write(NODES, name, {"metadata": {"labels": node["metadata"]["labels"]}})
        if state is None:
            return
        body = {"metadata": {"labels": state["metadata"].get("labels", {})}, "spec": state["spec"]}
        if "status" in state:
            broken = name == BROKEN
            body["status"] = {**state["status"], "vgpuCount": 0} if broken else state["status"]
        plane.write(NODESTATES, name, body)

    objects = fleet_objects()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(store, *obj) for obj in objects]:
            done.result()
    (broken,) = [state for name, _, state in objects if name == BROKEN]
    assert broken is not None and broken["status"]["vgpuCount"] == "many"
    _rewrite_in_etcd(plane, NODESTATES, BROKEN, {"status": broken["status"]})
    served = plane.get(NODESTATES, BROKEN)
    assert served is not None and served["status"]["vgpuCount"] == "many"


def _rewrite_in_etcd(plane: ControlPlane, kind: str, name: str, fields: dict[str, Any]) -> None:
    """Replace ``fields`` of a cluster-scoped custom object where the API server keeps it
    (etcd's key ``/registry/GROUP/RESOURCE/NAME``, the object as JSON), past the server
    and its validation."""
    group, _, resource = kind.split("/")
    key = base64.b64encode(f"/registry/{group}/{resource}/{name}".encode()).decode()

    def etcd(call: str, body: dict[str, Any]) -> Any:
        url = f"{plane.etcd_url}/v3/kv/{call}"
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as answer:
            return json.loads(answer.read())

    (stored,) = etcd("range", {"key": key})["kvs"]
    obj = {**json.loads(base64.b64decode(stored["value"])), **fields}
    etcd("put", {"key": key, "value": base64.b64encode(json.dumps(obj).encode()).decode()})


@pytest.fixture
def cluster(real_cluster: ControlPlane, tmp_path: Path) -> tuple[ControlPlane, Path]:
    """The test fleet on the real API server; its ``fleet.yaml``."""
    store_fleet(real_cluster)
    config = tmp_path / "fleet.yaml"
    config.write_text(BENCH.CONFIG)
    return real_cluster, config


def run(server: ControlPlane, config: Path, tmp_path: Path, *args: str) -> tuple[Result, str]:
    """``fleet plan`` as the person (:data:`USER`): the result, and its output."""
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", identity="user")
    argv = ["fleet", "plan", "-f", str(config), "--kubeconfig", str(kubeconfig), "--max-age", "0"]
    done = CliRunner().invoke(cli, [*argv, *args])
    assert done.exit_code == 1, done.output  # the unselected node is an error
    return done, done.stdout.replace(str(config), "fleet.yaml")


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.is_file(), f"golden file {path} missing: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden file"


def _json_text(text: str) -> str:
    """The JSON as printed, ``generated_at`` (the time of the run) masked."""
    assert json.loads(text)["generated_at"]
    masked, n = re.subn(r'"generated_at": "[^"]*"', '"generated_at": "(now)"', text, count=1)
    assert n == 1
    return masked


PAGING = [
    pytest.param((), id="default-chunks"),
    pytest.param(("--chunk-size", "4", "--jobs", "1"), id="pages-of-4"),
    pytest.param(("--chunk-size", "3", "--jobs", "2"), id="pages-of-3-in-2-processes"),
    pytest.param(("--chunk-size", "0"), id="one-list"),
]


@pytest.mark.parametrize("paging", PAGING)
def test_table_is_the_golden_table(
    cluster: tuple[ControlPlane, Path], tmp_path: Path, paging: tuple[str, ...]
) -> None:
    server, config = cluster
    _, text = run(server, config, tmp_path, *paging)
    check_golden("fleet-plan.txt", text)


@pytest.mark.parametrize("paging", PAGING)
def test_json_is_the_golden_json(
    cluster: tuple[ControlPlane, Path], tmp_path: Path, paging: tuple[str, ...]
) -> None:
    server, config = cluster
    _, text = run(server, config, tmp_path, "-o", "json", *paging)
    check_golden("fleet-plan.json", _json_text(text))


def test_the_lists_are_read_in_pages(cluster: tuple[ControlPlane, Path], tmp_path: Path) -> None:
    """28 VGPUNodeStates and 27 Nodes, 4 per request: 7 pages each, and nothing more
    (the person's requests, from the server's audit log)."""
    server, config = cluster
    mark = server.audit_mark()
    run(server, config, tmp_path, "--chunk-size", "4")
    lists = Counter(
        e["objectRef"]["resource"]
        for e in server.audit(mark, USER)
        if e["verb"] == "list" and e["responseStatus"]["code"] == 200
    )
    assert lists == {"vgpunodestates": 7, "nodes": 7}
    assert len(server.audit(mark, USER)) == 7 + 7


def test_a_server_listing_out_of_name_order_gets_the_golden_output(
    apiserver: RunningApiServer, tmp_path: Path
) -> None:
    """A real API server lists by name; ``fleet plan`` does not rely on it: served out of
    name order, in one list, by the emulator (``tests/apiserver.py``, which a real server
    cannot be made to do), the table and the JSON are still the golden ones."""
    objects = fleet_objects()
    random.Random(25).shuffle(objects)
    for name, node, state in objects:
        if node is not None:
            apiserver.put(NODES, name, node)
        if state is not None:
            apiserver.put(NODESTATES, name, state)
    listed = [o["metadata"]["name"] for o in apiserver.all(NODESTATES)]
    assert listed != sorted(listed)
    config = tmp_path / "fleet.yaml"
    config.write_text(BENCH.CONFIG)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    argv = ["fleet", "plan", "-f", str(config), "--kubeconfig", str(kubeconfig), "--max-age", "0"]
    for extra, golden in (((), "fleet-plan.txt"), (("-o", "json"), "fleet-plan.json")):
        done = CliRunner().invoke(cli, [*argv, "--chunk-size", "0", *extra])
        assert done.exit_code == 1, done.output  # the unselected node is an error
        text = done.stdout.replace(str(config), "fleet.yaml")
        check_golden(golden, _json_text(text) if extra else text)


def _reported(state: dict[str, Any]) -> Any:
    from vgpu_state.kube.nodestate import ReportedSnapshot

    return ReportedSnapshot.model_validate(state["status"]["snapshot"])


def test_the_decoder_shares_gpus_across_nodes_and_decodes_what_a_whole_decode_does() -> None:
    from vgpu_state.kube.nodestate import SnapshotDecoder, inflate_snapshot
    from vgpu_state.model.snapshot import NodeSnapshot

    reported = [_reported(state) for _, state in BENCH.fleet_items(COUNT, SCANNED)]
    decoder = SnapshotDecoder()
    for r in reported:
        whole = NodeSnapshot.model_validate_json(inflate_snapshot(r))
        assert decoder.decode(r) == whole
    # 24 nodes of 17 shapes: every GPU of a repeated shape is shared, mdev UUIDs and all.
    assert decoder.shared >= sum(
        len(NodeSnapshot.model_validate_json(inflate_snapshot(r)).gpus) for r in reported[17:]
    )


def test_a_scan_s_fingerprint_is_the_sha256_of_its_stable_view_when_gpus_are_shared() -> None:
    """The fingerprint is written a GPU at a time, the part before each GPU's vGPUs
    remembered: on decoded scans that share their GPUs' VFs it is still the hash of
    the whole stable view, and tells scans apart that differ in their vGPUs alone."""
    import hashlib

    from vgpu_state.kube.nodestate import SnapshotDecoder
    from vgpu_state.model.snapshot import SharedParts

    def whole(scan: Any) -> str:
        text = json.dumps(scan.stable_view(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    decoder = SnapshotDecoder()
    with SharedParts.remembering():
        scans = [decoder.decode(_reported(s)) for _, s in BENCH.fleet_items(COUNT, SCANNED)]
        assert all(s.fingerprint() == whole(s) for s in scans)
        first = scans[0]
        fewer = first.model_copy(
            update={"gpus": (first.gpus[0].model_copy(update={"vgpus": ()}), *first.gpus[1:])}
        )
        assert fewer.gpus[0].vfs is first.gpus[0].vfs and first.gpus[0].vgpus
        assert fewer.fingerprint() == whole(fewer) != first.fingerprint()


def test_the_decoder_decodes_scans_it_cannot_split_whole_with_the_same_errors() -> None:
    from vgpu_state.kube.nodestate import (
        SnapshotDecodeError,
        SnapshotDecoder,
        decode_snapshot,
        encode_snapshot,
    )
    from vgpu_state.model.snapshot import NodeSnapshot

    _, state = next(iter(BENCH.fleet_items(1, SCANNED)))
    scan = SnapshotDecoder().decode(_reported(state))
    # Problems after the GPUs (and in a GPU, after its vGPUs): decoded whole, equal.
    odd = scan.model_copy(
        update={
            "problems": ('a "quoted" {"index":1,"address":"x","vendor_id":1} ]}',),
            "gpus": (scan.gpus[0].model_copy(update={"problems": ("vgpus ]}",)}),),
        }
    )
    encoded = encode_snapshot(odd, SCANNED)
    decoder = SnapshotDecoder()
    assert decoder.decode(encoded) == odd == decode_snapshot(encoded)
    # An invalid GPU: the whole scan's error, as before.
    bad = encoded.model_copy(
        update={
            "data": encode_snapshot(NodeSnapshot(node="n"), SCANNED).data,
        }
    )
    with pytest.raises(SnapshotDecodeError, match="does not match its fingerprint"):
        decoder.decode(bad)
    broken = odd.model_dump_json().replace('"vendor_id":4318', '"vendor_id":"many"', 1)
    assert broken != odd.model_dump_json()
    damaged = encoded.model_copy(
        update={"data": base64.b64encode(gzip.compress(broken.encode())).decode()}
    )
    with pytest.raises(SnapshotDecodeError, match="not a valid scan: 1 validation error"):
        decoder.decode(damaged)


_TEST_PROCESS = os.getpid()


def _dying_worker(page: list[dict[str, Any]]) -> Any:
    if os.getpid() == _TEST_PROCESS:  # the pages the command plans itself
        return plan_page(page)
    os._exit(9)  # a worker, as if killed by the kernel


def test_a_worker_process_that_dies_fails_the_command_and_prints_no_plan(
    cluster: tuple[ControlPlane, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vgpu_state.cli import fleet as fleet_cli

    server, config = cluster
    monkeypatch.setattr(fleet_cli, "plan_page", _dying_worker)
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", identity="user")
    argv = ["fleet", "plan", "-f", str(config), "--kubeconfig", str(kubeconfig)]
    done = CliRunner().invoke(cli, [*argv, "--chunk-size", "5", "--jobs", "2"])
    assert done.exit_code == 1
    assert "a process planning the fleet stopped unexpectedly" in done.stderr
    assert done.stdout == ""


def test_a_real_api_server_pages_the_fleet_and_the_plan_is_the_same_in_any_page_size(
    cluster: tuple[ControlPlane, Path], tmp_path: Path
) -> None:
    """``fleet plan`` with pages of 4, of 500 and in one request prints the same plan of
    every node, by name; the Nodes are read as their metadata alone."""
    real_cluster, config = cluster
    kubeconfig = real_cluster.write_kubeconfig(tmp_path / "kubeconfig", identity="user")
    argv = ["fleet", "plan", "-f", str(config), "--kubeconfig", str(kubeconfig), "--max-age", "0"]
    outputs = {}
    for chunk in ("4", "500", "0"):
        done = CliRunner().invoke(cli, [*argv, "-o", "json", "--chunk-size", chunk])
        assert done.exit_code == 1, done.output  # the unselected node is an error
        outputs[chunk] = _json_text(done.stdout)
    assert outputs["4"] == outputs["500"] == outputs["0"]
    stored = [name for name, _, _ in fleet_objects()]
    with_node = [name for name, node, _ in fleet_objects() if node is not None]
    doc = json.loads(outputs["4"])
    assert [n["node"] for n in doc["nodes"]] == sorted(stored)
    assert doc["totals"]["nodes"] == len(stored) == COUNT + 4
    assert doc["totals"]["errors"] == 1 and doc["totals"]["unknown"] == 3
    # The labels come from the Nodes' metadata alone: the server leaves out the rest.
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.fleet import METADATA_ONLY, list_pages

    api = KubeApi.connect(str(kubeconfig))
    try:
        listed = [n for page in list_pages(api, "/api/v1/nodes", 4, METADATA_ONLY) for n in page]
    finally:
        api.close()
    assert {n["kind"] for n in listed} == {"PartialObjectMetadata"}
    assert not [n for n in listed if set(n) != {"kind", "apiVersion", "metadata"}]
    assert {n["metadata"]["name"] for n in listed} >= set(with_node)


def test_a_list_page_s_continue_token_is_read_without_decoding_its_items() -> None:
    """Workers decode a page's items; the command reads only the list's ``metadata``
    before them (the API server writes it first) to ask for the next page."""
    from vgpu_state.kube.fleet import continue_token

    head = b'{"kind":"VGPUNodeStateList","apiVersion":"vgpu-state.io/v1alpha1",'
    meta = b'"metadata":{"resourceVersion":"7","continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"},'
    # Items that do not decode: only the fields before them are read.
    assert continue_token(head + meta + b'"items":[{"broken": ') == (
        "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"
    )
    assert continue_token(b'{ "metadata" : {"continue": "a\\"b"} , "items": [}') == 'a"b'
    assert continue_token(head + b'"metadata":{"resourceVersion":"7"},"items":[]}') == ""
    assert continue_token(b'{"kind":"List","items":[]}') == ""
    # Items first (another writer's order): the whole text is decoded.
    items_first = b'{"items":[{"metadata":{"continue":"no"}}],"metadata":{"continue":"yes"}}'
    assert continue_token(items_first) == "yes"
    # Metadata beyond what is searched: the whole text is decoded too.
    padded = b'{"kind":"' + b"x" * 70_000 + b'","metadata":{"continue":"far"},"items":[]}'
    assert continue_token(padded) == "far"


def test_a_list_that_is_not_json_is_a_cluster_error() -> None:
    from vgpu_state.kube.errors import ClusterError
    from vgpu_state.kube.fleet import continue_token, page_items

    with pytest.raises(ClusterError, match="not JSON"):
        continue_token(b'{"metadata": nonsense')
    with pytest.raises(ClusterError, match="not JSON"):
        page_items(b"<html>")
    assert page_items(b'{"items":[{"a":1},2]}') == [{"a": 1}]


def test_each_node_s_plan_in_a_fleet_is_the_plan_it_gets_alone() -> None:
    """Within a page, what depends only on a GPU's model, lists and layout is worked out
    once per pool, and a VF-layout GPU's plan once per pool, vGPUs and holders: every
    node still gets exactly the plan it gets planned on its own (here 60 nodes of every
    pool, every fourth with a held vGPU, some holders moved to other GPUs)."""
    from vgpu_state.catalog import default_catalog
    from vgpu_state.config.loader import load_text
    from vgpu_state.kube.fleet import reported_node
    from vgpu_state.kube.node import labels_of
    from vgpu_state.kube.nodestate import SnapshotDecoder
    from vgpu_state.model.snapshot import SharedParts
    from vgpu_state.reconcile.fleet import NodeOutcome, plan_node
    from vgpu_state.reconcile.settings import Settings

    settings = Settings(catalog=default_catalog())
    document = load_text(BENCH.CONFIG, "layouts.yaml", catalog=settings.catalog)
    nodes = []
    decoder = SnapshotDecoder()  # shares the GPU lists of a pool's nodes, as fleet plan's
    for i, (node, state) in enumerate(BENCH.fleet_items(60, SCANNED)):
        if i % 3 == 1:
            # A holder on a GPU's last vGPU (the first a new layout destroys): the same
            # GPU as other nodes', another plan.
            vgpus = next(g["vgpus"] for g in state["status"]["gpus"] if g.get("vgpus"))
            vgpus[-1]["holder"] = f"pod vms/virt-launcher-test-{i}"
        name = node["metadata"]["name"]
        nodes.append(reported_node(name, state, labels_of(node), decoder))
    alone = [plan_node(document, n, settings, SCANNED) for n in nodes]
    with SharedParts.remembering():
        together = [plan_node(document, n, settings, SCANNED) for n in nodes]
    assert [p.outcome for p in alone].count(NodeOutcome.CHANGES) > 10
    assert sum(1 for n in nodes if n.in_use) >= 30
    assert sum(1 for p in alone if p.plan is not None and p.plan.protected) >= 10
    for a, b in zip(alone, together, strict=True):
        assert b == a
        assert b.plan is not None and a.plan is not None
        assert b.plan.model_dump_json() == a.plan.model_dump_json()
