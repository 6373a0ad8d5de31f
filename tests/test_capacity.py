"""The capacity and equal-framebuffer rule: one implementation, and every layer agrees with it."""

from __future__ import annotations

import pytest

from tests.builders import V, build_gpu, build_snapshot, desired
from vgpu_state.catalog import VgpuType, default_catalog
from vgpu_state.catalog.capacity import check_fit, remaining
from vgpu_state.config import load_text
from vgpu_state.model import ConfigError, PlanningError
from vgpu_state.planner import plan

CATALOG = default_catalog()


def t4(name: str) -> VgpuType:
    t = CATALOG.type(name)
    assert t is not None and t.model.endswith("T4"), name
    return t


def test_one_size_fits() -> None:
    fit = check_fit([(t4("T4-4Q"), 2), (t4("T4-4C"), 2)])
    assert fit.ok


def test_mixed_sizes_are_reported() -> None:
    fit = check_fit([(t4("T4-2Q"), 1), (t4("T4-4Q"), 1)])
    assert fit.mixed_sizes and not fit.ok and fit.over_total is None


def test_a_count_over_its_type_limit_is_reported_per_type() -> None:
    fit = check_fit([(t4("T4-8Q"), 3), (t4("T4-8C"), 1)])
    assert fit.over_type == ((t4("T4-8Q"), 3),) and fit.over_total is None


def test_the_total_must_fit_the_smallest_limit() -> None:
    fit = check_fit([(t4("T4-4Q"), 3), (t4("T4-4C"), 2)])
    assert fit.over_total == (5, 4, 4096)


def test_an_undescribed_type_counts_toward_the_total() -> None:
    assert check_fit([(t4("T4-4Q"), 3), (None, 2)]).over_total == (5, 4, 4096)
    assert check_fit([(None, 99)]).ok


def test_remaining_follows_what_the_gpu_holds() -> None:
    assert remaining(t4("T4-4Q"), []) == 4
    assert remaining(t4("T4-4C"), [t4("T4-4Q")]) == 3
    assert remaining(t4("T4-8Q"), [t4("T4-4Q")]) == 0
    assert remaining(t4("T4-4Q"), [t4("T4-4Q")] * 5) == 0
    assert remaining(t4("T4-4Q"), [None]) == 3


LAYOUTS = [
    ({"T4-2Q": 8}, True),
    ({"T4-2Q": 9}, False),
    ({"T4-4Q": 2, "T4-4C": 2}, True),
    ({"T4-4Q": 3, "T4-4C": 2}, False),
    ({"T4-2Q": 1, "T4-4Q": 1}, False),
    ({"T4-16Q": 1}, True),
    ({"T4-16Q": 2}, False),
]


def _id(case: object) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items()) if isinstance(case, dict) else str(case)


@pytest.mark.parametrize(("layout", "fits"), LAYOUTS, ids=_id)
def test_config_check_and_planner_apply_the_rule(layout: dict[str, int], fits: bool) -> None:
    assert check_fit([(t4(n), c) for n, c in layout.items()]).ok is fits
    devices = ", ".join(f"{n}: {c}" for n, c in layout.items())
    text = (
        "version: v1\nvgpu-configs:\n  c:\n"
        f"    - devices: all\n      vgpu-devices: {{{devices}}}\n"
    )
    try:
        load_text(text, "c.yaml", catalog=CATALOG)
        config_ok = True
    except ConfigError:
        config_ok = False
    snapshot = build_snapshot(build_gpu("0000:3b:00.0", "T4"))
    try:
        plan(desired({"0000:3b:00.0": layout}, snapshot), snapshot, catalog=CATALOG)
        planner_ok = True
    except PlanningError:
        planner_ok = False
    assert (config_ok, planner_ok) == (fits, fits)


def test_the_builders_offer_only_what_fits_beside_existing_vgpus() -> None:
    gpu = build_gpu("0000:3b:00.0", "T4", vgpus=[V("T4-4Q"), V("T4-4Q")])
    available = {c.name: c.available for c in gpu.pf_creatable}
    assert available["T4-4C"] == 2 and available["T4-2Q"] == 0
