"""Golden files for the plan renderings, and the JSON Schema of the JSON form.

Regenerate the golden files after an intended change with
``UPDATE_GOLDEN=1 make test`` and review the diff.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.builders import V, build_gpu, build_snapshot, desired
from vgpu_state.catalog import default_catalog
from vgpu_state.model.policy import Policy
from vgpu_state.planner import plan
from vgpu_state.render import render_json, render_text

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(REPO / "scripts"))

A2 = "0000:08:00.0"
T4 = "0000:3b:00.0"
L40S = "0000:26:00.0"


def scenarios() -> dict[str, tuple[object, object, dict[str, str]]]:
    mixed = build_snapshot(
        build_gpu(A2, "A2", vgpus=[V("A2-4Q", 0), V("A2-4C", 1), V("A2-4A", 2)]),
        build_gpu(T4, "T4", vgpus=[V("T4-8Q"), V("T4-8Q")]),
        build_gpu(L40S, "L40S", "vendor-vfio"),
        build_gpu("0000:41:00.0", "A16", sriov_on=False),
    )
    layouts = {
        A2: {"A2-4Q": 2, "A2-4C": 1},
        T4: {"T4-4Q": 4},
        L40S: {"L40S-12Q": 2},
        "0000:41:00.0": {"A16-4Q": 2},
    }
    t4_gpu = mixed.gpu(T4)
    assert t4_gpu is not None
    held = {t4_gpu.vgpus[0].key: "vm default/cad-1"}
    clean = build_snapshot(build_gpu(A2, "A2", vgpus=[V("A2-4Q", 0)]))
    return {
        "mixed": (desired(layouts, mixed, config="mixed"), mixed, held),
        "nochange": (desired({A2: {"A2-4Q": 1}}, clean, config="a2-4q"), clean, {}),
        "noprune": (
            desired({A2: {"A2-8Q": 1}}, clean, Policy(prune=False), config="a2-8q"),
            clean,
            {},
        ),
    }


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.is_file(), f"golden file {path} missing: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden file"


@pytest.mark.parametrize("name", ["mixed", "nochange", "noprune"])
def test_text_rendering_matches_golden(name: str) -> None:
    d, s, held = scenarios()[name]
    check_golden(f"plan-{name}.txt", render_text(plan(d, s, held, catalog=CATALOG)))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["mixed", "nochange", "noprune"])
def test_json_rendering_matches_golden_and_schema(name: str) -> None:
    d, s, held = scenarios()[name]
    text = render_json(plan(d, s, held, catalog=CATALOG))  # type: ignore[arg-type]
    check_golden(f"plan-{name}.json", text)
    schema = json.loads((REPO / "schemas" / "plan.schema.json").read_text())
    jsonschema.validate(json.loads(text), schema)


def test_plan_schema_file_is_current() -> None:
    from gen_plan_schema import plan_schema_text

    assert (REPO / "schemas" / "plan.schema.json").read_text() == plan_schema_text(), (
        "schemas/plan.schema.json is stale: run python scripts/gen_plan_schema.py"
    )


def test_json_round_trips_to_the_same_plan() -> None:
    from vgpu_state.model.plan import Plan

    d, s, held = scenarios()["mixed"]
    p = plan(d, s, held, catalog=CATALOG)  # type: ignore[arg-type]
    assert Plan.model_validate_json(render_json(p)) == p
