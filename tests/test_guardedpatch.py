"""Guarded JSON Patches: the library's difference, the guards in front of it, and the local
check that refuses a patch which does not give the object wanted (pure; the real API
server's part is in tests/test_kube_kubevirt.py)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from vgpu_state.kube.guardedpatch import PatchCheckError, check, guarded_patch
from vgpu_state.kube.permitted import OWNERSHIP_ANNOTATION, PermittedEntry, plan_write

LIST = "/spec/items"
A2 = PermittedEntry("mediatedDevices", "nvidia.com/NVIDIA_A2-4Q", "NVIDIA A2-4Q")
T4 = PermittedEntry("mediatedDevices", "nvidia.com/GRID_T4-8C", "GRID T4-8C")
L40S = PermittedEntry("pciHostDevices", "nvidia.com/NVIDIA_L40S-12Q", "10DE:26B9")
FOREIGN = {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q"}


def _obj(items: list[Any], **annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "x", "resourceVersion": "7"}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"items": items, "other": {"keep": 1}}}


def _applied(read: dict[str, Any], ops: list[dict[str, Any]]) -> Any:
    return jsonpatch.apply_patch(copy.deepcopy(read), ops)


def test_an_atomic_list_is_tested_as_read_and_replaced_whole() -> None:
    read, wanted = _obj([1, 2, 3]), _obj([2, 3, 4])
    ops = guarded_patch(read, wanted, atomic=[LIST])
    assert ops == [
        {"op": "test", "path": LIST, "value": [1, 2, 3]},
        {"op": "replace", "path": LIST, "value": [2, 3, 4]},
    ]
    # Without ``atomic`` the library's per-index ops, after a test of the whole list (and,
    # as they add, of the version).
    ops = guarded_patch(read, wanted, guards=[LIST])
    assert ops[:2] == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "test", "path": LIST, "value": [1, 2, 3]},
    ]
    assert {op["path"] for op in ops[2:]} <= {f"{LIST}/{i}" for i in range(4)}
    assert _applied(read, ops) == wanted


def test_what_the_read_lacked_is_added_under_a_test_of_its_version() -> None:
    read, wanted = _obj([]), _obj([], **{"a/b": "1"})
    ops = guarded_patch(read, wanted)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[1:] == [{"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1"}}]
    assert guarded_patch(read, wanted, guard_adds=False) == ops[1:]


def test_a_replaced_value_and_every_guard_are_tested_as_read() -> None:
    read, wanted = _obj([], own="[]", term="1"), _obj([], own="[]", term="2")
    ops = guarded_patch(read, wanted, guards=["/metadata/annotations/own", "/missing"])
    assert ops == [
        {"op": "test", "path": "/metadata/annotations/own", "value": "[]"},
        {"op": "test", "path": "/metadata/annotations/term", "value": "1"},
        {"op": "replace", "path": "/metadata/annotations/term", "value": "2"},
    ]
    assert guarded_patch(read, read, guards=["/metadata/annotations/own"]) == []


def test_a_patch_that_misses_a_change_is_refused_naming_the_object_and_what_is_left() -> None:
    read, wanted = _obj([1]), _obj([1, 2], own='["r"]')
    ops = guarded_patch(read, wanted, atomic=[LIST])
    check(read, ops, wanted, "Thing ns/x")
    with pytest.raises(PatchCheckError) as refused:
        check(read, ops[:-1], wanted, "Thing ns/x")
    assert "Thing ns/x" in str(refused.value) and "nothing was sent" in str(refused.value)
    assert '"path": "/metadata/annotations"' in str(refused.value)


@pytest.mark.parametrize(
    "broken",
    [
        [{"op": "replace", "path": "/spec/itemz", "value": [1, 2]}],
        [{"op": "test", "path": "/metadata/resourceVersion", "value": "6"}],
        [{"op": "remove", "path": "/spec/items/5"}],
    ],
    ids=["wrong path", "test that fails on the read", "index past the end"],
)
def test_a_patch_that_does_not_apply_to_the_read_is_refused(broken: list[dict[str, Any]]) -> None:
    with pytest.raises(PatchCheckError, match="does not apply to it"):
        check(_obj([1]), broken, _obj([1, 2]), "Thing ns/x")


def _cr(devices: Any = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "3"}
    if annotations is not None:
        meta["annotations"] = annotations
    cr: dict[str, Any] = {"metadata": meta, "spec": {"workloadUpdateStrategy": {}}}
    if devices is not None:
        cr["spec"]["configuration"] = {"permittedHostDevices": devices}
    return cr


@pytest.mark.parametrize(
    ("cr", "desired", "keep"),
    [
        (_cr(), [A2], None),
        (_cr({}), [A2, L40S], None),
        (_cr({"mediatedDevices": [FOREIGN]}, {}), [T4, A2], None),
        (_cr({"mediatedDevices": None}), [A2], None),
        (
            _cr(
                {"mediatedDevices": [FOREIGN, A2.to_json()], "pciHostDevices": [L40S.to_json()]},
                {OWNERSHIP_ANNOTATION: f'["{A2.resource}", "{L40S.resource}"]'},
            ),
            [T4],
            set(),
        ),
    ],
    ids=["no configuration", "empty container", "foreign entry", "null list", "removals"],
)
@pytest.mark.parametrize("fence", [None, "4/c-0/2026-01-01T00:00:00.000000Z"])
def test_the_kubevirt_patch_gives_the_cr_wanted(
    cr: dict[str, Any], desired: list[PermittedEntry], keep: set[str] | None, fence: str | None
) -> None:
    plan = plan_write(cr, desired, keep, fence=fence)
    assert plan.patch and plan.wanted is not None
    check(cr, plan.patch, plan.wanted, "KubeVirt CR kubevirt/kubevirt")
    # Every list it changes is tested as read, or the write is guarded by the version.
    paths = [op["path"] for op in plan.patch if op["op"] == "test"]
    assert "/metadata/resourceVersion" in paths or all(
        op["path"] in paths for op in plan.patch if op["op"] == "replace"
    )
    assert plan_write(plan.wanted, desired, keep, fence=fence).patch == ()
