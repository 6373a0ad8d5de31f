"""The writer's term and its fencing token, on values: which term a Lease shows, how a token
reads back, whose the token in the KubeVirt CR is for a given term (own, older: claim it,
newer: stop), and the ``test``/``replace`` ops a fenced patch carries. The Lease's side
(every take-over is a new term) runs on the real API server in ``tests/test_kube_lease.py``;
two controller processes racing over the CR in ``tests/test_fencing_real.py``."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest

from vgpu_state.controller.run import ControllerSettings, timing_problem
from vgpu_state.kube.fencing import (
    MAX_NUMBER,
    MAX_TOKEN,
    WRITER_TERM_ANNOTATION,
    Standing,
    Term,
    next_number,
    parse_token,
    standing,
    term_of,
)
from vgpu_state.kube.permitted import OWNERSHIP_ANNOTATION, PermittedEntry, plan_write

AT = "2026-11-28T18:00:00.123456Z"
LATER = "2026-11-28T18:00:31.000001Z"
A2 = PermittedEntry("mediatedDevices", "nvidia.com/NVIDIA_A2-4Q", "NVIDIA A2-4Q")


def _lease(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "vgpu-state-controller"}, "spec": spec}


def test_a_lease_shows_its_term_and_a_released_one_none() -> None:
    lease = _lease(holderIdentity="c-0", acquireTime=AT, leaseTransitions=7, renewTime=LATER)
    assert term_of(lease) == Term(7, "c-0", AT)
    assert term_of(_lease(holderIdentity="c-0", acquireTime=AT)) == Term(0, "c-0", AT)
    assert term_of(_lease(leaseTransitions=7)) is None, "released: nobody's term"
    assert term_of(_lease(holderIdentity="c-0", leaseTransitions=-1)) is None
    assert term_of(_lease(holderIdentity="c-0", leaseTransitions=True)) is None
    assert term_of({}) is None


def test_every_change_of_term_changes_the_token() -> None:
    term = Term(7, "c-0", AT)
    assert term.token == f"7/c-0/{AT}"
    others = {
        "another holder": Term(7, "c-1", AT),
        "the same pod name, taken again after its hold ended": Term(8, "c-0", LATER),
        "the same number in a Lease created anew": Term(7, "c-0", LATER),
    }
    for why, other in others.items():
        assert other.token != term.token, why


@pytest.mark.parametrize(
    "term",
    [
        Term(0, "c-0", AT),
        Term(42, "ns/odd/name", AT),
        Term(MAX_NUMBER - 1, "c", ""),
        Term(3, "c", ""),
    ],
)
def test_a_token_reads_back_as_its_term(term: Term) -> None:
    assert parse_token(term.token) == term


@pytest.mark.parametrize(
    "text",
    [
        None,
        7,
        "",
        "7",
        "7/c-0",
        f"/c-0/{AT}",
        f"07/c-0/{AT}",
        f"-1/c-0/{AT}",
        f"x/c-0/{AT}",
        f"7//{AT}",
        f"{MAX_NUMBER}/c-0/{AT}",  # no term can follow it
        f"99999999999/c-0/{AT}",
        "7/" + "c" * MAX_TOKEN + "/" + AT,
    ],
)
def test_anything_else_is_no_token(text: object) -> None:
    assert parse_token(text) is None


def test_whose_token_the_cr_holds() -> None:
    own = Term(7, "c-0", AT)
    assert standing(own.token, own) is Standing.OWN
    # Older: claimed by this term's first write.
    assert standing(None, own) is Standing.OLDER, "never claimed"
    assert standing(Term(6, "c-1", AT).token, own) is Standing.OLDER
    assert standing(Term(0, "c-0", LATER).token, own) is Standing.OLDER
    assert standing("written by hand", own) is Standing.OLDER, "no writer's term"
    # Newer, or a term of the same number that is not this one: this replica must stop.
    assert standing(Term(8, "c-1", LATER).token, own) is Standing.NEWER
    assert standing(Term(8, "c-0", LATER).token, own) is Standing.NEWER, "its own pod, again"
    assert standing(Term(7, "c-1", AT).token, own) is Standing.NEWER
    assert standing(Term(7, "c-0", LATER).token, own) is Standing.NEWER


def test_a_term_started_past_a_newer_token() -> None:
    assert next_number(Term(9, "c-1", AT).token, 3) == 10
    assert next_number(Term(2, "c-1", AT).token, 3) == 4
    assert next_number("garbage", 3) == 4
    assert next_number(None, MAX_NUMBER) == MAX_NUMBER


# the fenced patch -----------------------------------------------------------------------
def _cr(annotations: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "9"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"configuration": {"permittedHostDevices": {}}}}


def _owned(*resources: str) -> dict[str, str]:
    return {OWNERSHIP_ANNOTATION: json.dumps(sorted(resources))}


TERM_PATH = "/metadata/annotations/vgpu-state.io~1writer-term"
OWN = Term(7, "c-0", AT).token
OLD = Term(6, "c-1", AT).token


def test_a_claimed_cr_with_nothing_to_change_costs_no_write() -> None:
    cr = _cr({**_owned(), WRITER_TERM_ANNOTATION: OWN})
    assert plan_write(cr, [], set(), fence=OWN).patch == ()


def test_the_first_write_of_a_term_claims_the_cr_even_with_nothing_else_to_change() -> None:
    cr = _cr({**_owned(), WRITER_TERM_ANNOTATION: OLD})
    plan = plan_write(cr, [], set(), fence=OWN)
    assert plan.changes == ()
    assert list(plan.patch) == [
        {"op": "test", "path": "/metadata/annotations/vgpu-state.io~1managed-resources",
         "value": "[]"},
        {"op": "test", "path": TERM_PATH, "value": OLD},
        {"op": "replace", "path": TERM_PATH, "value": OWN},
    ]  # fmt: skip


def test_every_write_tests_the_writers_term() -> None:
    cr = _cr({**_owned(), WRITER_TERM_ANNOTATION: OWN})
    plan = plan_write(cr, [A2], set(), fence=OWN)
    assert [c.op for c in plan.changes] == ["add"]
    assert {"op": "test", "path": TERM_PATH, "value": OWN} in plan.patch
    assert not [op for op in plan.patch if op["path"] == TERM_PATH and op["op"] != "test"]


@pytest.mark.parametrize("annotations", [None, {}, _owned()])
def test_a_cr_never_claimed_gets_the_token_guarded_by_its_version(
    annotations: dict[str, str] | None,
) -> None:
    cr = _cr(annotations)
    plan = plan_write(cr, [A2], set(), fence=OWN)
    assert plan.patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "9"}
    after = jsonpatch.apply_patch(copy.deepcopy(cr), list(plan.patch))
    assert after["metadata"]["annotations"][WRITER_TERM_ANNOTATION] == OWN
    if annotations is not None:
        assert {"op": "add", "path": TERM_PATH, "value": OWN} in plan.patch
    else:  # the annotations are added with the token in them
        assert [op["op"] for op in plan.patch if op["path"] == "/metadata/annotations"] == ["add"]


def test_without_a_fence_the_patch_is_as_before() -> None:
    cr = _cr({**_owned(), WRITER_TERM_ANNOTATION: OLD})
    assert plan_write(cr, [], set()).patch == ()
    assert TERM_PATH not in [op["path"] for op in plan_write(cr, [A2], set()).patch]


# timing -----------------------------------------------------------------------------------
def test_the_default_timings_keep_every_request_inside_the_lease() -> None:
    assert ControllerSettings(identity="c-0").timing_problem() is None
    assert timing_problem(3, 2.0, 0.5, 0.25) is None


@pytest.mark.parametrize(
    ("timings", "says"),
    [
        ((30, 30.0, 10.0, 10.0), "renew deadline (30 s) must be shorter than the Lease (30 s)"),
        ((30, 20.0, 20.0, 10.0), "request timeout (20 s) must be shorter than the renew"),
        ((30, 20.0, 10.0, 25.0), "interval (25 s) must be shorter than the renew deadline"),
    ],
)
def test_timings_that_could_outlive_the_lease_are_refused(
    timings: tuple[int, float, float, float], says: str
) -> None:
    problem = timing_problem(*timings)
    assert problem is not None and says in problem
