"""A node's ``VGPUNodeState`` status is bounded: the real API server refuses a status
beyond the CRD's bounds when it is written (HTTP 422, naming the field), admits one at
every bound, and the CRD's CEL rule passed the server's cost estimate (it is installed
with ``deploy/``). The agent never writes beyond them: a longer message is shortened, a
host larger than a status may describe is an error naming the bound. The controller
reads the statuses page by page and keeps a bounded summary of each node.

The writes are the agent's own (its ServiceAccount's token bound to a Pod on the node,
under the shipped RBAC and admission policies): what a compromised node could send.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_reports import bounding
from tests.hostile_status import big_scan, encode_snapshot_unbounded, maximal_status, wide_status
from tests.realcluster import CONTROLLER_USER, ApiError, ControlPlane, api_path
from vgpu_state.controller.bounds import Summary
from vgpu_state.controller.reports import NodeReport
from vgpu_state.controller.run import Controller, ControllerSettings, summary
from vgpu_state.kube import crd, liststream, nodestate
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.cluster import KubeCluster
from vgpu_state.kube.nodestate import StatusBoundError
from vgpu_state.kube.permitted import PermittedEntry
from vgpu_state.model.status import ConfigState

NODE = "gpu-bounds-1"
KIND = "vgpu-state.io/v1alpha1/vgpunodestates"
NODESTATES = api_path(KIND)


@pytest.fixture
def agent_token(cluster: ControlPlane) -> str:
    """The agent's token on ``NODE``, whose (empty) VGPUNodeState exists."""
    token = cluster.agent_token(NODE)
    body = {
        "apiVersion": nodestate.API_VERSION,
        "kind": nodestate.KIND,
        "metadata": {"name": NODE},
        "spec": {"nodeName": NODE},
    }
    cluster.request("POST", NODESTATES, body, token=token)
    return token


def _write(cluster: ControlPlane, token: str, status: dict[str, Any], node: str = NODE) -> Any:
    """PUT the status as the agent (the object as it is, with ``status``)."""
    current = cluster.request("GET", f"{NODESTATES}/{node}")
    current["status"] = status
    return cluster.request("PUT", f"{NODESTATES}/{node}/status", current, token=token)


def test_a_status_at_every_bound_is_accepted(cluster: ControlPlane, agent_token: str) -> None:
    status = maximal_status(NODE)
    size = len(json.dumps(status, separators=(",", ":")))
    assert 1_500_000 < size < 1_572_864, "the largest status admitted is about 1.53 MB"
    written = _write(cluster, agent_token, status)
    stored = written["status"]
    assert len(stored["gpus"]) == nodestate.MAX_GPUS
    assert sum(len(g.get("vgpus") or []) for g in stored["gpus"]) == nodestate.MAX_VGPUS
    assert len(stored["snapshot"]["data"]) == len(status["snapshot"]["data"])
    assert len(stored["snapshot"]["data"]) >= nodestate.MAX_SNAPSHOT_DATA - 2048
    # ... and it reads back as this version's model (the same bounds).
    assert nodestate.status_of(written) is not None


def _gpus(count: int, vgpus_each: int) -> list[dict[str, Any]]:
    return [
        {
            "address": f"0000:{g // 256:02x}:{g % 256:02x}.0",
            "layout": "mdev",
            "vgpus": [
                {"id": f"{g:04d}-{v:04d}", "type": "NVIDIA A2-1Q"} for v in range(vgpus_each)
            ],
        }
        for g in range(count)
    ]


def _condition(message: str) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": "True",
        "reason": "Converged",
        "message": message,
        "lastTransitionTime": "2026-11-28T12:00:00Z",
    }


def _snapshot(data: str) -> dict[str, Any]:
    return {"fingerprint": "f", "scannedAt": "2026-11-28T12:00:00Z", "data": data}


OVER = {
    "33 GPUs": ({"gpus": _gpus(33, 0)}, "status.gpus", "33"),
    "65 vGPUs on a GPU": ({"gpus": _gpus(1, 65)}, "status.gpus[0].vgpus", "65"),
    "1,088 vGPUs on a node": ({"gpus": _gpus(17, 64)}, "status.gpus", "1024 vGPUs"),
    "65 capacity rows": (
        {"capacity": [{"resourceName": f"r{i}", "total": 1, "free": 1} for i in range(65)]},
        "status.capacity",
        "65",
    ),
    "a 254-character holder": (
        {"gpus": [{**_gpus(1, 1)[0], "vgpus": [{"id": "x", "type": "t", "holder": "h" * 254}]}]},
        "status.gpus[0].vgpus[0].holder",
        "253",
    ),
    "a 65-character vGPU id": (
        {"gpus": [{**_gpus(1, 0)[0], "vgpus": [{"id": "i" * 65, "type": "t"}]}]},
        "status.gpus[0].vgpus[0].id",
        "64",
    ),
    "a 4,097-character message": (
        {"conditions": [_condition("m" * 4097)]},
        "status.conditions[0].message",
        "4096",
    ),
    "a scan's data one character too long": (
        {"snapshot": _snapshot("A" * (nodestate.MAX_SNAPSHOT_DATA + 1))},
        "status.snapshot.data",
        str(nodestate.MAX_SNAPSHOT_DATA),
    ),
}


@pytest.mark.parametrize("case", list(OVER))
def test_a_status_beyond_a_bound_is_refused_when_written(
    cluster: ControlPlane, agent_token: str, case: str
) -> None:
    status, field, number = OVER[case]
    with pytest.raises(ApiError) as refused:
        _write(cluster, agent_token, status)
    assert refused.value.status == 422, refused.value
    message = json.loads(str(refused.value).split(": 422 ", 1)[1])["message"]
    assert field in message and number in message, message
    stored = cluster.request("GET", f"{NODESTATES}/{NODE}")
    assert "status" not in stored, "nothing of a refused status is stored"


def test_a_status_of_2350_gpus_is_refused(cluster: ControlPlane, agent_token: str) -> None:
    status = wide_status(NODE)
    assert len(json.dumps(status)) > 300_000
    with pytest.raises(ApiError) as refused:
        _write(cluster, agent_token, status)
    assert refused.value.status == 422
    assert "status.gpus: Too many: 2350" in str(refused.value)


def test_the_crd_carries_its_cel_rule_past_the_servers_cost_estimate(
    cluster: ControlPlane,
) -> None:
    """The CRD as installed (the server estimates a rule's cost when the CRD is written and
    refuses one over its budget; ``deploy/`` installed it) holds the rule, and enforces it."""
    installed = cluster.request(
        "GET",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + crd.crd()["metadata"]["name"],
    )
    status = installed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert (
        status["x-kubernetes-validations"]
        == crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"][
            "x-kubernetes-validations"
        ]
    )
    conditions = {c["type"]: c["status"] for c in installed["status"]["conditions"]}
    assert conditions["Established"] == "True"


# the agent -----------------------------------------------------------------------------------
@pytest.fixture
def kube(cluster: ControlPlane, agent_token: str, tmp_path: Path) -> KubeCluster:
    config = cluster.write_kubeconfig(tmp_path / "kubeconfig", token=agent_token)
    return KubeCluster(KubeApi.connect(str(config)), NODE, pod_resources=None)


def test_the_agents_long_messages_are_shortened_and_accepted(
    cluster: ControlPlane, kube: KubeCluster
) -> None:
    kube.observe(big_scan(NODE, gpus=1, vfs=2, types=2))
    kube.write_status(
        state=ConfigState.FAILED, conditions=[("Ready", False, "ApplyFailed", "x" * 10_000)]
    )
    stored = cluster.request("GET", f"{NODESTATES}/{NODE}")["status"]
    ready = next(c for c in stored["conditions"] if c["type"] == "Ready")
    assert len(ready["message"]) == nodestate.MESSAGE_LENGTH
    assert ready["message"].endswith("\u2026")


@pytest.mark.parametrize(
    ("shape", "bound"),
    [
        ((33, 1, 1), "33 GPUs; a VGPUNodeState status describes at most 32"),
        ((17, 64, 1), "1088 vGPUs; a VGPUNodeState status describes at most 1024"),
        ((16, 64, 40), "JSON objects; at most 40000 are read"),
        ((16, 64, 64), "snapshot is larger than 4 MiB decompressed"),
    ],
    ids=["33 GPUs", "1,088 vGPUs", "a scan of 42,000 objects", "a scan over 4 MiB"],
)
def test_a_host_beyond_the_bounds_is_an_error_naming_the_bound(
    cluster: ControlPlane, kube: KubeCluster, shape: tuple[int, int, int], bound: str
) -> None:
    gpus, vfs, types = shape
    kube.observe(big_scan(NODE, gpus=gpus, vfs=vfs, types=types))
    with pytest.raises(StatusBoundError, match=bound):
        kube.write_status(state=ConfigState.SUCCESS)
    assert "status" not in cluster.request("GET", f"{NODESTATES}/{NODE}")


# the controller ------------------------------------------------------------------------------
def test_the_controller_lists_page_by_page_and_keeps_summaries(
    cluster: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three nodes of 96 vGPUs each, none of a type the layouts document names; one of them
    # of a type its driver does not list either.
    for node, held in (("gpu-p1", "DC-0-2Q"), ("gpu-p2", "DC-99-2Q"), ("gpu-p3", "DC-1-2Q")):
        scan = big_scan(node, gpus=2, vfs=48, types=2, held=held)
        cluster.put(
            KIND,
            node,
            {"spec": {"nodeName": node}, "status": {"snapshot": encode_snapshot_unbounded(scan)}},
        )
    api = KubeApi.connect(str(cluster.controller_kubeconfig(tmp_path / "controller")))
    ctl = Controller(api, ControllerSettings(identity="controller-0", **bounding()))
    bounds, _ = ctl._layout_bounds()
    monkeypatch.setattr(nodestate, "LIST_CHUNK", 2)
    mark = cluster.audit_mark()

    def listed(obj: dict[str, Any]) -> Any:
        return ctl._listed(obj, bounds)

    reports = {r.node: r for r in ctl._reports_of(nodestate.list_pages(api, listed), bounds)}
    assert set(reports) == {"gpu-p1", "gpu-p2", "gpu-p3"}
    lists = [
        urllib.parse.urlparse(e["requestURI"])
        for e in cluster.audit(mark, CONTROLLER_USER)
        if e["verb"] == "list" and e.get("objectRef", {}).get("resource") == "vgpunodestates"
    ]
    assert [urllib.parse.parse_qs(u.query)["limit"] for u in lists] == [["2"], ["2"]]
    for report in reports.values():
        # 96 refused vGPUs, kept as a count and the first few reasons.
        assert report.outside.count == 96 and len(report.outside.first) == Summary.LIMIT
        assert report.entries == ()
    assert "not one the GPU's driver lists" in str(reports["gpu-p2"].outside)
    # An unchanged status is the kept summary, not decoded again.
    again = {r.node: r for r in ctl._reports_of(nodestate.list_pages(api, listed), bounds)}
    assert all(again[n] is reports[n] for n in reports)


def test_a_summary_is_bounded_and_shares_entries() -> None:
    entry = PermittedEntry("mediatedDevices", "nvidia.com/NVIDIA_A2-1Q", "NVIDIA A2-1Q")
    shared: dict[PermittedEntry, PermittedEntry] = {}
    left_out = Summary(100, tuple(f"s{i}" for i in range(Summary.LIMIT)))
    first = summary(NodeReport("a", (entry,), skipped=left_out), shared)
    second = summary(NodeReport("b", (copy.copy(entry),)), shared)
    assert second.entries[0] is first.entries[0]
    assert first.skipped == left_out and str(first.skipped).endswith("; and 95 more")
    many = tuple(
        PermittedEntry("mediatedDevices", f"nvidia.com/T{i}", f"T{i}")
        for i in range(nodestate.MAX_RESOURCES + 1)
    )
    refused = summary(NodeReport("c", many), shared)
    assert (
        refused.entries == () and refused.refused is not None and "65 resources" in refused.refused
    )


# the list reader -----------------------------------------------------------------------------
def _pieces(text: bytes, size: int) -> Iterator[bytes]:
    for at in range(0, len(text), size):
        yield text[at : at + size]


@pytest.mark.parametrize("size", [1, 3, 7, 4096])
def test_a_list_is_decoded_object_by_object_in_any_pieces(size: int) -> None:
    items = [
        {"metadata": {"name": f"n{i}"}, "status": {"text": "é ü \u2026 " * i, "n": [1.5, -2, None]}}
        for i in range(5)
    ]
    body = {"kind": "L", "apiVersion": "v1", "metadata": {"continue": "tok"}, "items": items}
    reader = liststream._ListReader(_pieces(json.dumps(body, ensure_ascii=False).encode(), size))
    assert list(reader.objects()) == items
    assert reader.metadata == {"continue": "tok"}
    # Items first (not how the API server writes them): the metadata is read after them.
    late = {"items": items[:1], "metadata": {"continue": ""}, "kind": "L"}
    reader = liststream._ListReader(_pieces(json.dumps(late, indent=1).encode(), size))
    assert list(reader.objects()) == items[:1]
    assert reader.metadata == {"continue": ""}
    cut = liststream._ListReader(_pieces(json.dumps(body).encode()[:-9], size))
    with pytest.raises(Exception, match=r"not JSON|ends in the middle"):
        list(cut.objects())


def test_the_agent_on_a_host_beyond_the_bounds_says_which_bound(
    cluster: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent as the DaemonSet runs it (its pod-bound token, a simulated host of 33
    T4s): its reconcile fails naming the bound, readiness says so, no status is written,
    and it retries (with backoff) rather than going quiet."""
    from vgpu_state.agent.assemble import AgentFlags, build

    node = "gpu-bounds-33"
    cluster.ensure_node(node)
    gpus = "".join(
        f'  - {{address: "0000:{i + 1:02x}:00.0", model: T4, layout: mdev}}\n' for i in range(33)
    )
    spec = tmp_path / "node.yaml"
    spec.write_text(f"node: {node}\ngpus:\n{gpus}")
    config = tmp_path / "config"
    config.mkdir()
    (config / "config.yaml").write_text(
        "version: v1\nvgpu-configs:\n  t4-1q:\n    - devices: all\n      vgpu-devices: {T4-1Q: 1}\n"
    )
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig", token=cluster.agent_token(node))
    flags = AgentFlags(
        node=node,
        config_file=config / "config.yaml",
        mode="plan-only",
        resync=300.0,
        listen="",
        kubeconfig=str(kubeconfig),
        sim_spec=str(spec),
        state_dir=tmp_path / "state",
        device_plugin=False,
    )
    agent = build(flags)
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    caplog.set_level(logging.INFO)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        bound = "33 GPUs; a VGPUNodeState status describes at most 32"
        while bound not in agent.health.readiness().reason:
            assert time.monotonic() < deadline, agent.health.readiness()
            time.sleep(0.2)
        assert not agent.health.readiness().ok
    finally:
        agent.stop()
        thread.join(30)
    assert any(bound in r.getMessage() or bound in (r.exc_text or "") for r in caplog.records)
    stored = cluster.request("GET", f"{NODESTATES}/{node}")
    assert stored is None or "status" not in stored
