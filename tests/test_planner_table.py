"""Table-driven planner cases: a snapshot, a desired layout, the exact expected steps.

Notation of the expected steps (order matters: it is the execution order):
``-TYPE@PARENT`` destroy, ``~sriov@GPU`` enable SR-IOV, ``+TYPE@PARENT`` create
(``@deferred`` when the parent is chosen after SR-IOV is enabled),
``!destroy TYPE [held by X]`` / ``!create TYPE [held by X]`` blocked items.
Addresses drop the ``0000:`` domain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.builders import NODE, V, build_gpu, build_snapshot, desired
from vgpu_state.catalog import default_catalog
from vgpu_state.model.errors import PlanningError
from vgpu_state.model.plan import ActionKind, Plan
from vgpu_state.model.policy import InUsePolicy, Policy, SriovPolicy
from vgpu_state.planner import derived_uuid, plan

CATALOG = default_catalog()

A2 = "0000:08:00.0"
T4 = "0000:3b:00.0"
L40S = "0000:26:00.0"


def vf(gpu: str, i: int) -> str:
    from vgpu_state.model.pci import vf_address

    return vf_address(gpu, 4, 1, i)


def compact(p: Plan) -> list[str]:
    out = []
    for a in p.actions:
        if a.kind is ActionKind.DESTROY:
            out.append(f"-{a.type_name}@{(a.parent or '?')[5:]}")
        elif a.kind is ActionKind.ENABLE_SRIOV:
            out.append(f"~sriov@{a.gpu[5:]}")
        else:
            out.append(f"+{a.type_name}@{a.parent[5:] if a.parent else 'deferred'}")
    for b in p.blocked:
        held = f" held by {b.holder}" if b.holder else ""
        out.append(f"!{b.kind.value} {b.type_name}{held}")
    return out


PRUNE = Policy(prune=True)


@dataclass(frozen=True)
class Case:
    id: str
    gpus: list[dict[str, Any]]
    layouts: dict[str, dict[str, int]]
    expected: list[str]
    policy: Policy = PRUNE
    in_use: dict[str, str] = field(default_factory=dict)


def a2(*vgpus: V, **kw: Any) -> dict[str, Any]:
    return {"address": A2, "model": "A2", "vgpus": list(vgpus), **kw}


def t4(*vgpus: V, **kw: Any) -> dict[str, Any]:
    return {"address": T4, "model": "T4", "vgpus": list(vgpus), **kw}


def l40s(*vgpus: V, **kw: Any) -> dict[str, Any]:
    return {"address": L40S, "model": "L40S", "layout": "vendor-vfio", "vgpus": list(vgpus), **kw}


def held_uuid(n: int, address: str = A2) -> str:
    bus = address[5:7]
    return f"00000000-0000-4000-8000-{int(bus, 16):04x}{n:08x}"


NO_PRUNE = Policy(prune=False)

CASES = [
    Case("no-op empty", [a2()], {A2: {}}, []),
    Case("no-op same layout", [a2(V("A2-4Q", 0), V("A2-4Q", 1))], {A2: {"A2-4Q": 2}}, []),
    Case(
        "grow from empty",
        [a2()],
        {A2: {"A2-4Q": 2}},
        ["+A2-4Q@08:00.4", "+A2-4Q@08:00.5"],
    ),
    Case(
        "grow keeps existing",
        [a2(V("A2-4Q", 0))],
        {A2: {"A2-4Q": 3}},
        ["+A2-4Q@08:00.5", "+A2-4Q@08:00.6"],
    ),
    Case(
        "grow fills the lowest free VF",
        [a2(V("A2-4Q", 1))],
        {A2: {"A2-4Q": 2}},
        ["+A2-4Q@08:00.4"],
    ),
    Case(
        "shrink",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1), V("A2-4Q", 2))],
        {A2: {"A2-4Q": 1}},
        ["-A2-4Q@08:00.5", "-A2-4Q@08:00.6"],
    ),
    Case(
        "shrink to nothing",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1))],
        {A2: {}},
        ["-A2-4Q@08:00.4", "-A2-4Q@08:00.5"],
    ),
    Case(
        "type change, same size",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1))],
        {A2: {"A2-4C": 2}},
        ["-A2-4Q@08:00.4", "-A2-4Q@08:00.5", "+A2-4C@08:00.4", "+A2-4C@08:00.5"],
    ),
    Case(
        "partial type change, same size",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1))],
        {A2: {"A2-4Q": 1, "A2-4C": 1}},
        ["-A2-4Q@08:00.5", "+A2-4C@08:00.5"],
    ),
    Case(
        "mixed series of one size",
        [a2()],
        {A2: {"A2-4Q": 2, "A2-4A": 1, "A2-4C": 1}},
        ["+A2-4A@08:00.4", "+A2-4C@08:00.5", "+A2-4Q@08:00.6", "+A2-4Q@08:00.7"],
    ),
    Case(
        "mixed series grow next to an existing one",
        [a2(V("A2-4A", 0))],
        {A2: {"A2-4A": 1, "A2-4Q": 2}},
        ["+A2-4Q@08:00.5", "+A2-4Q@08:00.6"],
    ),
    Case(
        "type change, other size",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1))],
        {A2: {"A2-8Q": 2}},
        ["-A2-4Q@08:00.4", "-A2-4Q@08:00.5", "+A2-8Q@08:00.4", "+A2-8Q@08:00.5"],
    ),
    Case(
        "type change, other size, one in use: switch deferred, the free one kept",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1))],
        {A2: {"A2-8Q": 2}},
        [
            "!destroy A2-4Q held by vm default/win-1",
            "!destroy A2-4Q",
            "!create A2-8Q held by vm default/win-1",
            "!create A2-8Q held by vm default/win-1",
        ],
        in_use={held_uuid(0): "vm default/win-1"},
    ),
    Case(
        "type change, same size, one in use: the free one makes room and goes",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1))],
        {A2: {"A2-4C": 2}},
        [
            "-A2-4Q@08:00.5",
            "+A2-4C@08:00.5",
            "+A2-4C@08:00.6",
            "!destroy A2-4Q held by vm default/win-1",
        ],
        in_use={held_uuid(0): "vm default/win-1"},
    ),
    Case(
        "in use ignored by policy",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1))],
        {A2: {"A2-8Q": 1}},
        ["-A2-4Q@08:00.4", "-A2-4Q@08:00.5", "+A2-8Q@08:00.4"],
        policy=Policy(prune=True, in_use=InUsePolicy.IGNORE),
        in_use={held_uuid(0): "vm default/win-1"},
    ),
    Case(
        "in use is the one kept on shrink",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1))],
        {A2: {"A2-4Q": 1}},
        ["-A2-4Q@08:00.4"],
        in_use={held_uuid(1): "pod ns/p"},
    ),
    Case(
        "in use, same size: creates fit beside it",
        [a2(V("A2-4Q", 0))],
        {A2: {"A2-4C": 2}},
        ["+A2-4C@08:00.5", "+A2-4C@08:00.6", "!destroy A2-4Q held by pod ns/p"],
        in_use={held_uuid(0): "pod ns/p"},
    ),
    Case(
        "in use, same size: the create that needs its room is blocked",
        [a2(V("A2-4Q", 0))],
        {A2: {"A2-4C": 4}},
        [
            "+A2-4C@08:00.5",
            "+A2-4C@08:00.6",
            "+A2-4C@08:00.7",
            "!destroy A2-4Q held by pod ns/p",
            "!create A2-4C held by pod ns/p",
        ],
        in_use={held_uuid(0): "pod ns/p"},
    ),
    Case(
        "prune off: unwanted kept and reported",
        [a2(V("A2-4Q", 0), V("A2-4Q", 1))],
        {A2: {"A2-4Q": 1}},
        ["!destroy A2-4Q"],
        policy=NO_PRUNE,
    ),
    Case(
        "prune off: other size blocks the creates",
        [a2(V("A2-4Q", 0))],
        {A2: {"A2-8Q": 1}},
        ["!destroy A2-4Q", "!create A2-8Q"],
        policy=NO_PRUNE,
    ),
    Case(
        "prune off: growth still happens",
        [a2(V("A2-4Q", 0))],
        {A2: {"A2-4Q": 2}},
        ["+A2-4Q@08:00.5"],
        policy=NO_PRUNE,
    ),
    Case(
        "SR-IOV off -> on",
        [a2(sriov_on=False)],
        {A2: {"A2-4Q": 2}},
        ["~sriov@08:00.0", "+A2-4Q@deferred", "+A2-4Q@deferred"],
    ),
    Case(
        "SR-IOV off and policy sriov off",
        [a2(sriov_on=False)],
        {A2: {"A2-4Q": 1}},
        ["!create A2-4Q"],
        policy=Policy(prune=True, sriov=SriovPolicy.OFF),
    ),
    Case("SR-IOV off, nothing wanted", [a2(sriov_on=False)], {A2: {}}, []),
    Case("mdev on the PF: grow", [t4()], {T4: {"T4-4Q": 3}}, ["+T4-4Q@3b:00.0"] * 3),
    Case(
        "mdev on the PF: shrink",
        [t4(V("T4-4Q"), V("T4-4Q"), V("T4-4Q"), V("T4-4Q"))],
        {T4: {"T4-4Q": 2}},
        ["-T4-4Q@3b:00.0", "-T4-4Q@3b:00.0"],
    ),
    Case(
        "mdev on the PF: other size",
        [t4(V("T4-8Q"), V("T4-8Q"))],
        {T4: {"T4-16Q": 1}},
        ["-T4-8Q@3b:00.0", "-T4-8Q@3b:00.0", "+T4-16Q@3b:00.0"],
    ),
    Case(
        "vendor-vfio: grow",
        [l40s()],
        {L40S: {"L40S-4Q": 3}},
        ["+L40S-4Q@26:00.4", "+L40S-4Q@26:00.5", "+L40S-4Q@26:00.6"],
    ),
    Case(
        "vendor-vfio: series swap on one VF",
        [l40s(V("L40S-4Q", 0), V("L40S-4Q", 1))],
        {L40S: {"L40S-4Q": 1, "L40S-4A": 1}},
        ["-L40S-4Q@26:00.5", "+L40S-4A@26:00.5"],
    ),
    Case(
        "vendor-vfio: other size",
        [l40s(V("L40S-4Q", 0))],
        {L40S: {"L40S-8Q": 2}},
        ["-L40S-4Q@26:00.4", "+L40S-8Q@26:00.4", "+L40S-8Q@26:00.5"],
    ),
    Case(
        "vendor-vfio: in use by VF address",
        [l40s(V("L40S-4Q", 0))],
        {L40S: {"L40S-8Q": 1}},
        ["!destroy L40S-4Q held by vm a/b", "!create L40S-8Q held by vm a/b"],
        in_use={vf(L40S, 0): "vm a/b"},
    ),
    Case(
        "unmanaged GPU is never touched",
        [a2(), t4(V("T4-4Q"), V("T4-4Q"))],
        {A2: {"A2-4Q": 1}},
        ["+A2-4Q@08:00.4"],
    ),
    Case(
        "in-use vGPU on an unmanaged GPU is not reported",
        [a2(), t4(V("T4-4Q"))],
        {A2: {}},
        [],
        in_use={held_uuid(0, T4): "vm x/y"},
    ),
    Case(
        "GPUs in address order",
        [t4(), a2()],
        {A2: {"A2-8Q": 1}, T4: {"T4-8Q": 1}},
        ["+A2-8Q@08:00.4", "+T4-8Q@3b:00.0"],
    ),
    Case(
        "per-GPU order: destroy, then create, per GPU",
        [a2(V("A2-4Q", 0)), t4(V("T4-4Q"))],
        {A2: {"A2-8Q": 1}, T4: {"T4-8Q": 1}},
        ["-A2-4Q@08:00.4", "+A2-8Q@08:00.4", "-T4-4Q@3b:00.0", "+T4-8Q@3b:00.0"],
    ),
    Case(
        "blocked GPU does not stop another GPU",
        [a2(V("A2-4Q", 0)), t4()],
        {A2: {"A2-8Q": 1}, T4: {"T4-4Q": 1}},
        ["+T4-4Q@3b:00.0", "!destroy A2-4Q held by vm v/1", "!create A2-8Q held by vm v/1"],
        in_use={held_uuid(0): "vm v/1"},
    ),
    Case(
        "two GPUs of one model, different layouts",
        [a2(), {"address": "0000:09:00.0", "model": "A2", "vgpus": []}],
        {A2: {"A2-16Q": 1}, "0000:09:00.0": {"A2-2Q": 2}},
        ["+A2-16Q@08:00.4", "+A2-2Q@09:00.4", "+A2-2Q@09:00.5"],
    ),
    Case(
        "full GPU of 1 GiB vGPUs",
        [a2()],
        {A2: {"A2-1Q": 16}},
        [f"+A2-1Q@{vf(A2, i)[5:]}" for i in range(16)],
    ),
    Case(
        "shrink across series keeps wanted ones",
        [a2(V("A2-4Q", 0), V("A2-4C", 1), V("A2-4A", 2))],
        {A2: {"A2-4C": 1}},
        ["-A2-4Q@08:00.4", "-A2-4A@08:00.6"],
    ),
    Case(
        "A16 GPU (shared device id)",
        [{"address": "0000:88:00.0", "model": "A16", "vgpus": []}],
        {"0000:88:00.0": {"A16-8Q": 2}},
        ["+A16-8Q@88:00.4", "+A16-8Q@88:00.5"],
    ),
    Case(
        "prune off with in-use and growth",
        [a2(V("A2-4Q", 0), V("A2-4C", 1))],
        {A2: {"A2-4C": 2}},
        ["+A2-4C@08:00.6", "!destroy A2-4Q held by vm q/1"],
        policy=NO_PRUNE,
        in_use={held_uuid(0): "vm q/1"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_case(case: Case) -> None:
    snapshot = build_snapshot(*(build_gpu(**g) for g in case.gpus))
    p = plan(desired(case.layouts, snapshot, case.policy), snapshot, case.in_use, catalog=CATALOG)
    assert compact(p) == case.expected
    # Summary agrees with the steps.
    s = p.summary
    assert s.create == sum(1 for a in p.actions if a.kind is ActionKind.CREATE)
    assert s.destroy == sum(1 for a in p.actions if a.kind is ActionKind.DESTROY)
    assert s.blocked == len(p.blocked)
    assert p.is_converged == (not case.expected)
    # Blocked items are not changes: a node whose only difference is held is done.
    assert p.has_changes == bool(p.actions)


@pytest.mark.parametrize(
    ("gpus", "layouts", "message"),
    [
        ([a2()], {A2: {"A2-4Q": 5}}, "5 × A2-4Q requested but one GPU holds at most 4"),
        (
            [a2()],
            {A2: {"A2-4Q": 3, "A2-4C": 2}},
            "5 vGPUs of 4096 MiB requested but one GPU holds at most 4",
        ),
        ([a2()], {A2: {"A2-4Q": 1, "A2-8Q": 1}}, "mixes framebuffer sizes (A2-4Q = 4096 MiB"),
        ([t4()], {T4: {"T4-1Q": 17}}, "17 × T4-1Q requested but one GPU holds at most 16"),
        ([a2()], {"0000:99:00.0": {"A2-4Q": 1}}, "gpu[0000:99:00.0] is in the desired layout"),
    ],
)
def test_infeasible_layout_is_a_planning_error(
    gpus: list[dict[str, Any]], layouts: dict[str, dict[str, int]], message: str
) -> None:
    snapshot = build_snapshot(*(build_gpu(**g) for g in gpus))
    with pytest.raises(PlanningError) as err:
        plan(desired(layouts, snapshot), snapshot, catalog=CATALOG)
    assert message in str(err.value)


def test_new_uuids_are_derived_from_node_gpu_and_slot() -> None:
    snapshot = build_snapshot(build_gpu(**a2()))
    p = plan(desired({A2: {"A2-4Q": 2}}, snapshot), snapshot, catalog=CATALOG)
    assert [a.uuid for a in p.actions] == [derived_uuid(NODE, A2, 0), derived_uuid(NODE, A2, 1)]
    assert p.actions[0].address == f"gpu[{A2}].vgpu[{derived_uuid(NODE, A2, 0)}]"


def test_derived_uuid_in_use_on_host_is_skipped() -> None:
    slot0 = derived_uuid(NODE, A2, 0)
    snapshot = build_snapshot(build_gpu(**a2(V("A2-4Q", 0, uuid=slot0))))
    p = plan(desired({A2: {"A2-4C": 1}}, snapshot), snapshot, catalog=CATALOG)
    assert [(a.kind.value, a.uuid) for a in p.actions] == [
        ("destroy", slot0),
        ("create", derived_uuid(NODE, A2, 1)),
    ]


def test_vendor_vfio_addresses_name_the_vf() -> None:
    snapshot = build_snapshot(build_gpu(**l40s(V("L40S-4Q", 0))))
    p = plan(desired({L40S: {"L40S-8Q": 1}}, snapshot), snapshot, catalog=CATALOG)
    assert [a.address for a in p.actions] == [
        f"gpu[{L40S}].vf[{vf(L40S, 0)}]",
        f"gpu[{L40S}].vf[{vf(L40S, 0)}]",
    ]
    assert p.actions[1].type_id == 1152


def test_blocked_item_names_holder_and_reason() -> None:
    snapshot = build_snapshot(build_gpu(**a2(V("A2-4Q", 0))))
    held = {held_uuid(0): "vm default/win-1"}
    p = plan(desired({A2: {"A2-8Q": 1}}, snapshot), snapshot, held, catalog=CATALOG)
    first = p.blocked[0]
    assert first.holder == "vm default/win-1"
    assert "in use by vm default/win-1" in first.reason
    assert "another framebuffer size" in p.blocked[1].reason


def test_plan_carries_snapshot_fingerprint() -> None:
    snapshot = build_snapshot(build_gpu(**a2()))
    p = plan(desired({A2: {"A2-4Q": 1}}, snapshot), snapshot, catalog=CATALOG)
    assert p.snapshot_fingerprint == snapshot.fingerprint()


def test_gpu_without_vgpu_manager_blocks_creates_with_the_reason() -> None:
    from vgpu_state.model.snapshot import SysfsInterface

    g = build_gpu(**t4()).model_copy(
        update={
            "layout": SysfsInterface.UNAVAILABLE,
            "layout_reason": "bound to vfio-pci, not nvidia",
        }
    )
    snapshot = build_snapshot(g)
    p = plan(desired({T4: {"T4-4Q": 2}}, snapshot), snapshot, catalog=CATALOG)
    assert compact(p) == ["!create T4-4Q", "!create T4-4Q"]
    assert p.blocked[0].reason == "no vGPU manager on this GPU: bound to vfio-pci, not nvidia"
