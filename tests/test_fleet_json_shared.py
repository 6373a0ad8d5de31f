"""``fleet plan -o json`` writes each node's part with the text of the values plans
share remembered: the bytes are those of ``pydantic_core.to_json`` of the whole part,
whatever was written before, whatever is forgotten, and for the fields a model leaves
out while empty (``GpuPlan.withheld``, ``Capacity.withheld``, ``DeferredSwitch.moves``)."""

from __future__ import annotations

import functools

from pydantic_core import to_json

from tests.test_fleet_stream import BENCH, SCANNED
from vgpu_state.catalog import default_catalog
from vgpu_state.config.loader import load_text
from vgpu_state.kube.fleet import reported_node
from vgpu_state.kube.node import labels_of
from vgpu_state.kube.nodestate import SnapshotDecoder
from vgpu_state.model.plan import DeferredSwitch, Move, Plan
from vgpu_state.model.snapshot import SharedParts
from vgpu_state.reconcile.fleet import NodeOutcome, NodePlan, node_document, plan_node
from vgpu_state.reconcile.settings import Settings
from vgpu_state.render.sharedjson import SharedJson


@functools.cache
def _planned() -> tuple[NodePlan, ...]:
    """60 nodes of every pool of the benchmark fleet, planned as ``fleet plan`` plans a
    page (parts shared between nodes), every third with a holder of its own."""
    settings = Settings(catalog=default_catalog())
    document = load_text(BENCH.CONFIG, "layouts.yaml", catalog=settings.catalog)
    decoder = SnapshotDecoder()
    nodes = []
    for i, (node, state) in enumerate(BENCH.fleet_items(60, SCANNED)):
        if i % 3 == 1:
            vgpus = next(g["vgpus"] for g in state["status"]["gpus"] if g.get("vgpus"))
            vgpus[-1]["holder"] = f"pod vms/virt-launcher-test-{i}"
        nodes.append(reported_node(node["metadata"]["name"], state, labels_of(node), decoder))
    with SharedParts.remembering():
        return tuple(plan_node(document, n, settings, SCANNED) for n in nodes)


def _expected(n: NodePlan, level: int) -> bytes:
    return to_json(node_document(n, plan_as_model=True), indent=2).replace(
        b"\n", b"\n" + b"  " * level
    )


def test_each_node_s_json_is_to_json_s_whatever_was_written_before() -> None:
    planned = _planned()
    assert sum(1 for n in planned if n.plan is not None and n.plan.actions) > 10
    shared = SharedJson()
    for _ in range(2):  # the second time every shared part's text is remembered
        for n in planned:
            assert shared.document(node_document(n, plan_as_model=True), "plan", 2) == (
                _expected(n, 2)
            )


def test_the_same_bytes_when_the_text_kept_is_forgotten_often() -> None:
    shared = SharedJson()
    shared.BUDGET = 4096
    shared.LIMIT = 7
    for n in _planned():
        for level in (0, 3):
            assert shared.document(node_document(n, plan_as_model=True), "plan", level) == (
                _expected(n, level)
            )


def test_fields_left_out_while_empty_are_written_when_set() -> None:
    n = next(p for p in _planned() if p.plan is not None and p.plan.gpus and p.plan.capacity)
    assert n.plan is not None
    gpu = n.plan.gpus[0]
    switch = DeferredSwitch(
        waits_for=("pod vms/a",),
        kept=1,
        creates=2,
        moves=(Move(holder="pod vms/a", vm="vms/a", vgpu="k1", type_name="A2-4Q"),),
    )
    plan: Plan = n.plan.model_copy(
        update={
            "gpus": (
                gpu.model_copy(update={"withheld": ("k1", "k2"), "deferred_switch": switch}),
                gpu,
                *n.plan.gpus[1:],
            ),
            "capacity": (n.plan.capacity[0].model_copy(update={"withheld": 2}),),
        }
    )
    changed = NodePlan(n.node, n.outcome, plan=plan, scanned_at=n.scanned_at)
    shared = SharedJson()
    for one in (n, changed, n, changed):
        text = shared.document(node_document(one, plan_as_model=True), "plan", 2)
        assert text == _expected(one, 2)
    assert b'"withheld": [' in text and b'"moves": [' in text and b'"withheld": 2' in text


def test_a_node_without_a_plan_is_written_as_to_json_writes_it() -> None:
    n = NodePlan("gpu-x", NodeOutcome.UNKNOWN, reason="Stale", message="too old")
    text = SharedJson().document(node_document(n, plan_as_model=True), "plan", 2)
    assert text == _expected(n, 2)
