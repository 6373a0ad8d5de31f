"""Planner properties over random feasible layouts and snapshots."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import V, build_gpu, build_snapshot, desired
from vgpu_state.catalog import default_catalog
from vgpu_state.model.plan import ActionKind
from vgpu_state.model.policy import Policy
from vgpu_state.planner import expected_snapshot, plan
from vgpu_state.render import render_json

CATALOG = default_catalog()

MODELS = {
    "A2": ("0000:08:00.0", "mdev"),
    "T4": ("0000:3b:00.0", "mdev"),
    "L40S": ("0000:26:00.0", "vendor-vfio"),
    "A16": ("0000:88:00.0", "mdev"),
}


@st.composite
def layout(draw: st.DrawFn, model: str) -> dict[str, int]:
    """A feasible multiset of types of one framebuffer size."""
    m = default_catalog().find_model(model)
    assert m is not None
    by_size: dict[int, list[str]] = {}
    for t in m.types:
        if not t.is_mig:
            by_size.setdefault(t.framebuffer_mib, []).append(t.name)
    size = draw(st.sampled_from(sorted(by_size)))
    names = by_size[size]
    cap = min(m.type(n).max_instances for n in names)  # type: ignore[union-attr]
    total = draw(st.integers(0, min(cap, 8)))
    counts: dict[str, int] = {}
    for _ in range(total):
        n = draw(st.sampled_from(names))
        counts[n] = counts.get(n, 0) + 1
    return counts


@st.composite
def scenario(draw: st.DrawFn) -> tuple[Any, Any, dict[str, str]]:
    chosen = draw(st.lists(st.sampled_from(sorted(MODELS)), min_size=1, max_size=3, unique=True))
    gpus = []
    layouts = {}
    in_use: dict[str, str] = {}
    for model in chosen:
        address, lay = MODELS[model]
        existing = draw(layout(model))
        vgpus = []
        vf_index = 0
        for name, count in sorted(existing.items()):
            for _ in range(count):
                sriov = model != "T4"
                vgpus.append(V(name, vf_index if sriov else None))
                vf_index += 1
        g = build_gpu(address=address, model=model, layout=lay, vgpus=vgpus)
        gpus.append(g)
        if draw(st.booleans()):
            layouts[address] = draw(layout(model))
        for v in g.vgpus:
            if draw(st.integers(0, 3)) == 0:
                in_use[v.key] = f"vm default/{v.key[:8]}"
    snapshot = build_snapshot(*gpus)
    return snapshot, layouts, in_use


@settings(max_examples=150, deadline=None)
@given(scenario())
def test_applying_the_plan_reaches_the_layout(data: tuple[Any, Any, dict[str, str]]) -> None:
    snapshot, layouts, _ = data
    d = desired(layouts, snapshot, Policy(prune=True))
    first = plan(d, snapshot, catalog=CATALOG)
    after = expected_snapshot(first, snapshot)
    again = plan(d, after, catalog=CATALOG)
    assert not again.has_changes, again.actions
    for address, counts in layouts.items():
        g = after.gpu(address)
        assert g is not None
        live: dict[str, int] = {}
        for v in g.vgpus:
            live[v.type_name or "?"] = live.get(v.type_name or "?", 0) + 1
        assert live == {k: c for k, c in counts.items() if c}


@settings(max_examples=150, deadline=None)
@given(scenario())
def test_never_destroys_an_in_use_vgpu_under_protect(
    data: tuple[Any, Any, dict[str, str]],
) -> None:
    snapshot, layouts, in_use = data
    p = plan(desired(layouts, snapshot, Policy(prune=True)), snapshot, in_use, catalog=CATALOG)
    destroyed = {a.uuid or a.vf for a in p.actions if a.kind is ActionKind.DESTROY}
    assert not destroyed & set(in_use)
    held_unwanted = {b.address for b in p.blocked if b.holder}
    assert all(b.holder in in_use.values() for b in p.blocked if b.holder)
    assert len(held_unwanted) == len([b for b in p.blocked if b.holder])


@settings(max_examples=60, deadline=None)
@given(scenario())
def test_plan_is_deterministic(data: tuple[Any, Any, dict[str, str]]) -> None:
    snapshot, layouts, in_use = data
    d = desired(layouts, snapshot, Policy(prune=True))
    assert render_json(plan(d, snapshot, in_use, catalog=CATALOG)) == render_json(
        plan(d, snapshot, dict(in_use), catalog=CATALOG)
    )
    copy = snapshot.model_validate_json(snapshot.model_dump_json())
    assert render_json(plan(d, copy, in_use, catalog=CATALOG)) == render_json(
        plan(d, snapshot, in_use, catalog=CATALOG)
    )
