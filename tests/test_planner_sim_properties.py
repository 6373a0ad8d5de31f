"""Planner properties over snapshots scanned from the simulator (real driver rules)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import desired
from vgpu_state.catalog import default_catalog
from vgpu_state.executor import apply
from vgpu_state.model.plan import ActionKind
from vgpu_state.model.policy import InUsePolicy, Policy
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.planner import expected_snapshot, plan
from vgpu_state.reconcile import deferred_replanner
from vgpu_state.render import render_json
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.node import held_vgpus
from vgpu_state.sim.spec import GpuSpec, NodeSpec, VgpuSpec

CATALOG = default_catalog()

# Models the simulator offers, with the layouts valid for them (no SR-IOV: mdev on the PF).
MODELS = {
    "A2": ("mdev",),
    "A16": ("mdev",),
    "T4": ("mdev",),
    "A40": ("mdev", "vendor-vfio"),
    "L40S": ("mdev", "vendor-vfio"),
    "A10": ("vendor-vfio",),
}
ADDRESSES = ("0000:08:00.0", "0000:3b:00.0", "0000:81:00.0")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Scenario:
    spec: NodeSpec
    layouts: dict[str, dict[str, int]]


def _types_by_size(model: str) -> dict[int, list[str]]:
    m = default_catalog().find_model(model)
    assert m is not None
    by_size: dict[int, list[str]] = {}
    for t in m.types:
        if not t.is_mig and t.type_id_known:
            by_size.setdefault(t.framebuffer_mib, []).append(t.name)
    return by_size


@st.composite
def counts(draw: st.DrawFn, model: str, limit: int) -> dict[str, int]:
    """A feasible multiset of types of one framebuffer size."""
    m = default_catalog().find_model(model)
    assert m is not None
    by_size = _types_by_size(model)
    size = draw(st.sampled_from(sorted(by_size)))
    names = by_size[size]
    cap = min(t.max_instances for t in m.types if t.name in names)
    if m.sriov_capable:
        cap = min(cap, m.sriov_totalvfs)
    total = draw(st.integers(0, min(cap, limit)))
    out: dict[str, int] = {}
    for _ in range(total):
        n = draw(st.sampled_from(names))
        out[n] = out.get(n, 0) + 1
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(1, len(ADDRESSES)))
    gpus = []
    layouts: dict[str, dict[str, int]] = {}
    for address in ADDRESSES[:n]:
        model = draw(st.sampled_from(sorted(MODELS)))
        layout = draw(st.sampled_from(MODELS[model]))
        existing = draw(counts(model, 6))
        m = default_catalog().find_model(model)
        assert m is not None
        names = [name for name, c in sorted(existing.items()) for _ in range(c)]
        slots: list[int | None] = [None] * len(names)
        if m.sriov_capable:
            slots = list(draw(st.permutations(range(m.sriov_totalvfs)))[: len(names)])
        vgpus = tuple(
            VgpuSpec(
                type=name,
                vf=slot,
                **{"in-use": f"vm default/vm-{address[5:7]}-{i}"}
                if draw(st.integers(0, 3)) == 0
                else {},
            )
            for i, (name, slot) in enumerate(zip(names, slots, strict=True))
        )
        gpus.append(GpuSpec(address=address, model=model, layout=layout, vgpus=vgpus))
        if draw(st.booleans()):
            layouts[address] = draw(counts(model, 8))
    return Scenario(NodeSpec(node="node1", gpus=tuple(gpus)), layouts)


def _scan(s: Scenario) -> tuple[NodeSnapshot, dict[str, str]]:
    with SimHost(s.spec) as host:
        return host.scan(), dict(held_vgpus(host))


@SETTINGS
@given(scenarios())
def test_expected_snapshot_needs_no_further_changes(s: Scenario) -> None:
    snapshot, _ = _scan(s)
    d = desired(s.layouts, snapshot, Policy(prune=True, in_use=InUsePolicy.IGNORE))
    after = expected_snapshot(plan(d, snapshot, catalog=CATALOG), snapshot)
    again = plan(d, after, catalog=CATALOG)
    assert not again.has_changes, (again.actions, again.blocked)


@SETTINGS
@given(scenarios())
def test_never_destroys_an_in_use_vgpu_under_protect(s: Scenario) -> None:
    snapshot, in_use = _scan(s)
    p = plan(desired(s.layouts, snapshot, Policy(prune=True)), snapshot, in_use, catalog=CATALOG)
    destroyed = {a.uuid or a.vf for a in p.actions if a.kind is ActionKind.DESTROY}
    assert not destroyed & set(in_use)
    assert all(b.holder in in_use.values() for b in p.blocked if b.holder)


@SETTINGS
@given(scenarios())
def test_plan_is_deterministic(s: Scenario) -> None:
    snapshot, in_use = _scan(s)
    d = desired(s.layouts, snapshot, Policy(prune=True))
    assert render_json(plan(d, snapshot, in_use, catalog=CATALOG)) == render_json(
        plan(d, snapshot, dict(in_use), catalog=CATALOG)
    )
    again, _ = _scan(s)
    assert render_json(plan(d, again, in_use, catalog=CATALOG)) == render_json(
        plan(d, snapshot, in_use, catalog=CATALOG)
    )


@SETTINGS
@given(scenarios())
def test_applying_to_the_simulator_converges_except_blocked(s: Scenario) -> None:
    with SimHost(s.spec) as host:
        snapshot, in_use = host.scan(), dict(held_vgpus(host))
        d = desired(s.layouts, snapshot, Policy(prune=True))
        first = plan(d, snapshot, in_use, catalog=CATALOG)
        result = apply(
            first,
            host,
            in_use=in_use,
            skip_blocked=True,
            snapshot=snapshot,
            replan=deferred_replanner(CATALOG),
        )
        again = plan(d, result.snapshot, in_use, catalog=CATALOG)
    assert again.summary.create == again.summary.destroy == again.summary.sriov == 0, again.actions
    assert {b.address for b in again.blocked} <= {b.address for b in first.blocked} | {
        b.address for b in again.blocked if b.kind is ActionKind.CREATE
    }
    assert len(again.blocked) <= len(first.blocked)
    # The capacity the plan announced (blocked steps as not taken) is what the node has after.
    predicted = {(c.resource or c.type_name, c.publish): c.after for c in first.capacity if c.after}
    found = {(c.resource or c.type_name, c.publish): c.before for c in again.capacity if c.before}
    assert predicted == found
    assert sum(c.held for c in first.capacity) == len(in_use)
    assert first.disruption.destroyed == first.summary.destroy
