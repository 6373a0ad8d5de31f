"""Plans and applies that change a GPU's mode: MIG-backed and mixed-size vGPU.

The host here is an in-memory fake (:class:`ModeHost`) that keeps a GPU's MIG mode,
heterogeneous mode, GPU instances and VF types and refuses what the driver and
``nvidia-smi`` refuse (MIG mode with VFs on, heterogeneous mode with a vGPU, a
GPU instance with a vGPU in it, a MIG type without a free GPU instance, two
framebuffer sizes in equal-size mode). It stands in for the simulator's
``nvidia-smi`` while that is built; the planner, the executor, the re-plan after a
re-scan, saved plans and the plan text are the product's own.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass, field

import pytest

from vgpu_state.catalog import GpuModel, default_catalog
from vgpu_state.executor import ApplyError, apply
from vgpu_state.model.desired import DesiredGpu, DesiredState
from vgpu_state.model.errors import BlockedReason, DriverError, PlanningError
from vgpu_state.model.gpumode import GpuInstance, GpuMode, GpuModes
from vgpu_state.model.plan import ActionKind, Disruption, Plan
from vgpu_state.model.policy import InUsePolicy, Policy
from vgpu_state.model.snapshot import (
    CreatableType,
    Gpu,
    NodeSnapshot,
    OfferedType,
    SysfsInterface,
    Vgpu,
    VirtualFunction,
)
from vgpu_state.planner import differences
from vgpu_state.planner import plan as make_plan
from vgpu_state.planner.saved import (
    SavedPlanError,
    check_saved_plan,
    parse_saved_plan,
    saved_plan_document,
)
from vgpu_state.reconcile import deferred_replanner
from vgpu_state.render.plan import render_json, render_text

CATALOG = default_catalog()


def _model(name: str) -> GpuModel:
    found = CATALOG.model(name)
    assert found is not None
    return found


PRO = _model("RTX PRO 6000 Blackwell Server Edition")
L40S = _model("L40S")
ADDRESS = "0000:3b:00.0"
NOTE = "experimental: inferred, not verified on hardware"
HOLDER = "pod vms/virt-launcher-win-7-x2k9p (VM vms/win-7)"


def type_ids(model: GpuModel) -> dict[str, int]:
    """The ids the fake driver lists: the catalog's where it knows them."""
    return {
        t.name: t.type_id if t.type_id_known else 3000 + i for i, t in enumerate(model.types)
    }


def gi_profile(model: GpuModel, name: str) -> str:
    t = model.type(name)
    assert t is not None and t.mig_slices
    return f"{t.mig_slices}g.{t.framebuffer_mib // 1024}gb"


def vf_address(i: int) -> str:
    return f"0000:3c:{i // 8:02x}.{i % 8}"


def fail(operation: str, path: str, value: object, code: int, detail: str) -> DriverError:
    return DriverError(operation, path, str(value), code, detail)


@dataclass
class FakeGpu:
    model: GpuModel
    total_vfs: int = 8
    numvfs: int = 8
    mig: bool = False
    het: bool = False
    types: dict[int, str] = field(default_factory=dict)
    gi_of: dict[int, int] = field(default_factory=dict)
    gis: dict[int, str] = field(default_factory=dict)

    def free_gis(self) -> dict[int, str]:
        used = set(self.gi_of.values())
        return {k: p for k, p in self.gis.items() if k not in used}

    def creatable(self) -> tuple[CreatableType, ...]:
        if not self.numvfs:
            return ()
        ids = type_ids(self.model)
        if self.mig:
            free = set(self.free_gis().values())
            names = [
                t.name
                for t in self.model.types
                if t.mig_slices and gi_profile(self.model, t.name) in free
            ]
        else:
            sizes = {self.size(n) for n in self.types.values()}
            used = sum(sizes_n for sizes_n in (self.size(n) for n in self.types.values()))
            names = []
            for t in self.model.types:
                if t.mig_slices:
                    continue
                if self.het:
                    ok = t.framebuffer_mib <= self.model.framebuffer_mib - used
                else:
                    ok = not sizes or sizes == {t.framebuffer_mib}
                    ok = ok and len(self.types) < t.max_instances
                if ok:
                    names.append(t.name)
        return tuple(CreatableType(type_id=ids[n], name=n, available=1) for n in names)

    def size(self, name: str) -> int:
        t = self.model.type(name)
        assert t is not None
        return t.framebuffer_mib

    def snapshot(self, index: int) -> Gpu:
        ids = type_ids(self.model)
        creatable = self.creatable()
        vgpus = tuple(
            Vgpu(
                kind="vf",
                parent=vf_address(i),
                type_id=ids[n],
                type_name=n,
                gpu_instance_id=self.gi_of.get(i),
            )
            for i, n in sorted(self.types.items())
        )
        vfs = tuple(
            VirtualFunction(
                index=i,
                address=vf_address(i),
                creatable=() if i in self.types else creatable,
                current_type_id=ids[self.types[i]] if i in self.types else None,
            )
            for i in range(self.numvfs)
        )
        return Gpu(
            index=index,
            address=ADDRESS,
            vendor_id=0x10DE,
            device_id=self.model.device_ids[0],
            model=self.model.name,
            driver="nvidia",
            sriov_totalvfs=self.total_vfs,
            sriov_numvfs=self.numvfs,
            vfs=vfs,
            layout=SysfsInterface.VENDOR_VFIO if self.numvfs else SysfsInterface.SRIOV_DISABLED,
            offered=tuple(OfferedType(type_id=c.type_id, name=c.name) for c in creatable),
            offered_complete=not vgpus,
            vgpus=vgpus,
            modes=GpuModes(
                mig=self.mig,
                heterogeneous=None if self.mig else self.het,
                gpu_instances=tuple(
                    GpuInstance(id=k, profile=p) for k, p in sorted(self.gis.items())
                ),
            ),
        )


class ModeHost:
    """A :class:`~vgpu_state.ports.HostPort` of one GPU; :attr:`writes` logs each change."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.writes: list[str] = []

    def scan(self) -> NodeSnapshot:
        return NodeSnapshot(node="node1", gpus=(self.gpu.snapshot(0),))

    def scan_gpu(self, address: str) -> NodeSnapshot:
        return self.scan().only_gpu(address)

    def _vf(self, vf: str) -> int:
        return next(i for i in range(self.gpu.numvfs) if vf_address(i) == vf)

    def enable_sriov(self, pf: str) -> None:
        # sriov-manage rebinds the GPU: no GPU instance survives, heterogeneous mode is off.
        self.writes.append("enable_sriov")
        g = self.gpu
        g.numvfs, g.gis, g.het = g.total_vfs, {}, False

    def disable_sriov(self, pf: str) -> None:
        self.writes.append("disable_sriov")
        g = self.gpu
        g.numvfs, g.types, g.gi_of, g.gis, g.het = 0, {}, {}, {}, False

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None:
        raise AssertionError("no mdev on a vendor-VFIO GPU")

    def remove_mdev(self, uuid: str) -> None:
        raise AssertionError("no mdev on a vendor-VFIO GPU")

    def set_vf_type(self, vf: str, type_id: int) -> None:
        g = self.gpu
        name = next(n for n, i in type_ids(g.model).items() if i == type_id)
        self.writes.append(f"set_vf_type {name}")
        if name not in {c.name for c in g.creatable()}:
            raise fail("vf-type", vf, type_id, errno.EIO, f"{name} is not creatable now")
        i = self._vf(vf)
        if g.mig:
            profile = gi_profile(g.model, name)
            g.gi_of[i] = min(k for k, p in g.free_gis().items() if p == profile)
        g.types[i] = name

    def clear_vf_type(self, vf: str) -> None:
        self.writes.append("clear_vf_type")
        i = self._vf(vf)
        self.gpu.types.pop(i, None)
        self.gpu.gi_of.pop(i, None)

    def set_mig_mode(self, pf: str, enabled: bool) -> None:
        self.writes.append(f"set_mig_mode {int(enabled)}")
        if self.gpu.numvfs:
            raise fail("mig-mode", pf, int(enabled), errno.EBUSY, "In use by another client")
        self.gpu.mig = enabled

    def create_gpu_instance(self, pf: str, profile: str) -> int:
        self.writes.append(f"create_gpu_instance {profile}")
        g = self.gpu
        if not g.mig:
            raise fail("gpu-instance-create", pf, profile, errno.EOPNOTSUPP, "Not Supported")
        slices = sum(int(p.split("g.")[0]) for p in (*g.gis.values(), profile))
        if slices > 4:
            raise fail("gpu-instance-create", pf, profile, errno.ENOSPC, "Insufficient Resources")
        new = max(g.gis, default=0) + 1
        g.gis[new] = profile
        return new

    def destroy_gpu_instance(self, pf: str, gi_id: int) -> None:
        self.writes.append(f"destroy_gpu_instance {gi_id}")
        if gi_id in self.gpu.gi_of.values():
            raise fail("gpu-instance-destroy", pf, gi_id, errno.EBUSY, "In use by another client")
        del self.gpu.gis[gi_id]

    def set_heterogeneous_mode(self, pf: str, enabled: bool) -> None:
        self.writes.append(f"set_heterogeneous_mode {int(enabled)}")
        if self.gpu.types:
            busy = "In use by another client"
            raise fail("heterogeneous-mode", pf, int(enabled), errno.EBUSY, busy)
        self.gpu.het = enabled


def desired(
    types: dict[str, int],
    mode: GpuMode = GpuMode.TIME_SLICED,
    geometry: tuple[tuple[str, int], ...] = (),
    policy: Policy | None = None,
) -> DesiredState:
    return DesiredState(
        node="node1",
        config="c",
        selection_source="flag",
        policy=policy or Policy(),
        gpus=(
            DesiredGpu(
                address=ADDRESS,
                index=0,
                model=None,
                types=tuple(sorted(types.items())),
                entry="layouts.yaml:3:7 (vgpu-configs.c[0])",
                mode=mode,
                mig_geometry=geometry,
            ),
        ),
    )


def planned(host: ModeHost, want: DesiredState, in_use: dict[str, str] | None = None) -> Plan:
    return make_plan(want, host.scan(), in_use or {}, catalog=CATALOG)


def applied(host: ModeHost, p: Plan, want: DesiredState) -> None:
    result = apply(p, host, replan=deferred_replanner(CATALOG), desired=want)
    assert result.converged, (result.notes, result.differences)
    assert not differences(want, host.scan())
    again = planned(host, want)
    assert again.is_converged and not again.actions, render_text(again)


def kinds(p: Plan) -> list[str]:
    return [a.kind.value for a in p.actions]


MIG_LAYOUT = desired({"DC-1-24Q": 4}, GpuMode.MIG, (("1g.24gb", 4),))


def time_sliced_pro() -> FakeGpu:
    """VFs on, two free time-sliced DC-24Q vGPUs."""
    return FakeGpu(PRO, types={0: "DC-24Q", 1: "DC-24Q"})


def mig_pro() -> FakeGpu:
    """MIG on, four 1g.24gb GPU instances, a DC-1-24Q vGPU in each."""
    return FakeGpu(
        PRO,
        mig=True,
        types={i: "DC-1-24Q" for i in range(4)},
        gi_of={i: i + 1 for i in range(4)},
        gis={i + 1: "1g.24gb" for i in range(4)},
    )


def test_time_sliced_to_mig_runs_in_the_documented_order_and_a_second_plan_is_empty() -> None:
    host = ModeHost(time_sliced_pro())
    p = planned(host, MIG_LAYOUT)
    assert kinds(p) == [
        "destroy",
        "destroy",
        "disable-sriov",
        "set-mig-mode",
        "enable-sriov",
        *["create-gpu-instance"] * 4,
        *["create"] * 4,
    ]
    assert p.disruption.level is Disruption.GPU
    assert p.summary.modes == 1 and p.summary.gi_create == 4 and p.summary.sriov_disable == 1
    assert p.gpus[0].deferred, "the VFs are chosen after the GPU instances exist"
    applied(host, p, MIG_LAYOUT)
    assert host.writes == [
        "clear_vf_type",
        "clear_vf_type",
        "disable_sriov",
        "set_mig_mode 1",
        "enable_sriov",
        *["create_gpu_instance 1g.24gb"] * 4,
        *["set_vf_type DC-1-24Q"] * 4,
    ]
    assert sorted(host.gpu.gi_of.values()) == [1, 2, 3, 4], "one vGPU in each GPU instance"


def test_mig_to_time_sliced_disables_sriov_and_lets_it_destroy_the_gpu_instances() -> None:
    host = ModeHost(mig_pro())
    want = desired({"DC-24Q": 4})
    p = planned(host, want)
    assert kinds(p) == [
        *["destroy"] * 4,
        "disable-sriov",
        "set-mig-mode",
        "enable-sriov",
        *["create"] * 4,
    ]
    assert ActionKind.DESTROY_GPU_INSTANCE not in {a.kind for a in p.actions}
    applied(host, p, want)
    assert host.writes[4:7] == ["disable_sriov", "set_mig_mode 0", "enable_sriov"]
    assert not host.gpu.mig and not host.gpu.gis


@pytest.mark.parametrize("vfs_on", [True, False], ids=["vfs-on", "vfs-off"])
def test_equal_size_to_mixed_size_sets_heterogeneous_mode_before_the_first_type_largest_first(
    vfs_on: bool,
) -> None:
    gpu = FakeGpu(L40S, types={0: "L40S-4Q", 1: "L40S-4Q"}) if vfs_on else FakeGpu(L40S, numvfs=0)
    host = ModeHost(gpu)
    want = desired({"L40S-12Q": 2, "L40S-24Q": 1}, GpuMode.MIXED_SIZE)
    p = planned(host, want)
    first = ["destroy", "destroy"] if vfs_on else ["enable-sriov"]
    assert kinds(p) == [*first, "set-heterogeneous-mode", "create", "create", "create"]
    applied(host, p, want)
    types = [w for w in host.writes if w.startswith("set_vf_type")]
    assert types == ["set_vf_type L40S-24Q", "set_vf_type L40S-12Q", "set_vf_type L40S-12Q"]
    het = host.writes.index("set_heterogeneous_mode 1")
    assert het < host.writes.index(types[0])
    if not vfs_on:
        assert host.writes.index("enable_sriov") < het


def test_mixed_size_back_to_equal_size_turns_heterogeneous_mode_off_after_the_destroys() -> None:
    host = ModeHost(FakeGpu(L40S, het=True, types={0: "L40S-24Q", 1: "L40S-12Q"}))
    want = desired({"L40S-12Q": 4})
    p = planned(host, want)
    assert kinds(p) == [*["destroy"] * 2, "set-heterogeneous-mode", *["create"] * 4]
    applied(host, p, want)
    assert host.writes[2] == "set_heterogeneous_mode 0"


def test_an_infeasible_mix_is_refused_at_plan_time() -> None:
    host = ModeHost(FakeGpu(L40S, types={0: "L40S-4Q"}))
    want = desired({"L40S-48Q": 1, "L40S-24Q": 1}, GpuMode.MIXED_SIZE)
    with pytest.raises(PlanningError) as e:
        planned(host, want)
    message = str(e.value)
    assert message.startswith("gpu[0000:3b:00.0] (L40S): the mixed-size layout does not fit: ")
    assert message.endswith("(inferred) [layouts.yaml:3:7 (vgpu-configs.c[0])]"), message
    assert not host.writes


def test_a_holder_defers_the_mode_change_and_nothing_is_destroyed() -> None:
    host = ModeHost(time_sliced_pro())
    held = {vf_address(0): HOLDER}
    p = planned(host, MIG_LAYOUT, held)
    assert not p.actions, "not even the free vGPU is destroyed"
    switch = p.gpus[0].deferred_switch
    assert switch is not None and switch.waits_for == (HOLDER,)
    assert switch.in_the_way == (vf_address(0),) and switch.kept == 1 and switch.creates == 4
    assert {b.code for b in p.blocked} == {BlockedReason.SWITCH_DEFERRED, BlockedReason.IN_USE}
    text = render_text(p)
    assert "the switch from time-sliced to MIG-backed mode needs a GPU without vGPUs" in text
    assert "# switch deferred: waits for " + HOLDER in text
    result = apply(p, host, replan=deferred_replanner(CATALOG), skip_blocked=True)
    assert not host.writes and not result.steps


def test_evacuate_names_the_vm_to_move_for_the_mode_change() -> None:
    host = ModeHost(time_sliced_pro())
    policy = Policy(in_use=InUsePolicy.EVACUATE)
    want = desired({"DC-1-24Q": 4}, GpuMode.MIG, (("1g.24gb", 4),), policy)
    p = planned(host, want, {vf_address(0): HOLDER})
    switch = p.gpus[0].deferred_switch
    assert switch is not None
    assert [(m.vm, m.vgpu, m.type_name) for m in switch.moves] == [
        ("vms/win-7", vf_address(0), "DC-24Q")
    ]
    assert p.gpus[0].withheld == (vf_address(1),), "the free vGPU of the departing type"
    assert "vms/win-7 would move off GPU 0000:3b:00.0 (in-use: evacuate)" in render_text(p)


def test_without_nvidia_smi_a_mig_or_mixed_size_layout_is_a_planning_error() -> None:
    snapshot = ModeHost(time_sliced_pro()).scan()
    unread = snapshot.with_gpus(tuple(g.model_copy(update={"modes": None}) for g in snapshot.gpus))
    for want in (MIG_LAYOUT, desired({"DC-12Q": 1, "DC-24Q": 1}, GpuMode.MIXED_SIZE)):
        with pytest.raises(PlanningError) as e:
            make_plan(want, unread, catalog=CATALOG)
        assert "needs nvidia-smi: pass --nvidia-smi PATH" in str(e.value)
        assert "[layouts.yaml:3:7 (vgpu-configs.c[0])]" in str(e.value)
    # With nvidia-smi, a GPU it could not read: the scan's problem says why.
    problem = "nvidia-smi: cannot read the modes of 0000:3b:00.0: timed out after 10 s"
    failed = unread.with_gpus(
        tuple(g.model_copy(update={"problems": (problem,)}) for g in unread.gpus)
    )
    with pytest.raises(PlanningError) as e:
        make_plan(MIG_LAYOUT, failed, catalog=CATALOG)
    assert f"the layout is MIG-backed (DC-1-24Q); its modes could not be read: {problem}" in str(
        e.value
    )


def test_gpu_instances_that_match_and_hold_vgpus_are_kept() -> None:
    gpu = FakeGpu(
        PRO,
        mig=True,
        types={0: "DC-1-24Q", 1: "DC-1-24Q"},
        gi_of={0: 2, 1: 3},
        gis={1: "1g.24gb", 2: "1g.24gb", 3: "1g.24gb", 4: "1g.24gb"},
    )
    host = ModeHost(gpu)
    # Same geometry: the two vGPUs stay, two are added into the free GPU instances.
    p = planned(host, MIG_LAYOUT, {vf_address(0): HOLDER})
    assert kinds(p) == ["create", "create"] and p.gpus[0].kept == 2
    assert not p.gpus[0].deferred and p.experimental
    # A geometry with one 2g.48gb in place of two 1g.24gb: the empty ones go.
    want = desired({"DC-1-24Q": 2, "DC-2-48Q": 1}, GpuMode.MIG, (("1g.24gb", 2), ("2g.48gb", 1)))
    p = planned(host, want, {vf_address(0): HOLDER})
    assert kinds(p) == [
        "destroy-gpu-instance",
        "destroy-gpu-instance",
        "create-gpu-instance",
        "create",
    ]
    assert [a.gi_id for a in p.actions[:2]] == [1, 4]
    assert p.actions[2].profile == "2g.48gb"
    applied(host, p, want)
    assert host.gpu.types == {0: "DC-1-24Q", 1: "DC-1-24Q", 2: "DC-2-48Q"}
    assert host.gpu.gi_of[0] == 2 and host.gpu.gi_of[1] == 3, "the kept vGPUs did not move"


def test_the_largest_gpu_instances_are_created_first() -> None:
    host = ModeHost(time_sliced_pro())
    want = desired({"DC-1-24Q": 2, "DC-2-48Q": 1}, GpuMode.MIG, (("1g.24gb", 2), ("2g.48gb", 1)))
    p = planned(host, want)
    profiles = [a.profile for a in p.actions if a.kind is ActionKind.CREATE_GPU_INSTANCE]
    assert profiles == ["2g.48gb", "1g.24gb", "1g.24gb"]
    applied(host, p, want)


def test_gpu_instances_made_before_sriov_is_enabled_are_made_again_after_it() -> None:
    host = ModeHost(FakeGpu(PRO, numvfs=0, mig=True, gis={1: "1g.24gb", 2: "1g.24gb"}))
    p = planned(host, MIG_LAYOUT)
    assert kinds(p) == ["enable-sriov", *["create-gpu-instance"] * 4, *["create"] * 4]
    applied(host, p, MIG_LAYOUT)


def test_the_plan_text_and_json_name_the_mode_steps_and_the_inferred_rule_once() -> None:
    p = planned(ModeHost(time_sliced_pro()), MIG_LAYOUT)
    text = render_text(p)
    assert "  ~ gpu[0000:3b:00.0] disable SR-IOV: 8 → 0 virtual functions" in text
    assert "  ~ gpu[0000:3b:00.0] MIG mode: off → on (GPU reset; no vGPU on it)" in text
    assert text.count("  + gpu[0000:3b:00.0] create GPU instance 1g.24gb") == 4
    assert text.count(NOTE) == 1
    assert (
        "Disruption: gpu (2 free vGPUs destroyed on 1 GPU; then SR-IOV is disabled or MIG "
        "mode changed (a GPU reset), no vGPU left)"
    ) in text
    assert "parent: (chosen after the mode steps, from a fresh read)" in text
    assert "1 SR-IOV to disable, 1 mode change(s), GPU instances: 4 to create, 0 to destroy" in text
    doc = json.loads(render_json(p))
    assert doc["gpus"][0]["experimental"] == [
        "MIG GPU instance geometry (profiles, slices and memory per GPU)"
    ]
    mig_step = next(a for a in doc["actions"] if a["kind"] == "set-mig-mode")
    assert mig_step["enabled"] is True and mig_step["disruption"] == "gpu"
    assert mig_step["address"] == "gpu[0000:3b:00.0].mig-mode"
    want = desired({"L40S-24Q": 1, "L40S-12Q": 2}, GpuMode.MIXED_SIZE)
    mixed = planned(ModeHost(FakeGpu(L40S, numvfs=0)), want)
    assert "  ~ gpu[0000:3b:00.0] heterogeneous mode: off → on" in render_text(mixed)
    assert render_text(mixed).count(NOTE) == 1


def test_a_saved_mode_plan_is_checked_and_replanned_like_any_other() -> None:
    host = ModeHost(time_sliced_pro())
    live = host.scan()
    p = planned(host, MIG_LAYOUT)
    doc = saved_plan_document(p, MIG_LAYOUT, live, {}, None, None)
    saved = parse_saved_plan(json.dumps(doc).encode(), "plan.json")
    assert check_saved_plan(saved, live, {}, CATALOG) == p
    edited = json.loads(json.dumps(doc))
    step = next(a for a in edited["plan"]["actions"] if a["kind"] == "create-gpu-instance")
    step["profile"] = "../../x"
    with pytest.raises(SavedPlanError, match=r"profile '\.\./\.\./x' is not a GPU instance"):
        parse_saved_plan(json.dumps(edited).encode(), "plan.json")
    # A mode step slipped into a plan that changes no mode is not what the layout gives.
    plain = desired({"DC-24Q": 3})
    small = planned(host, plain)
    doc = json.loads(json.dumps(saved_plan_document(small, plain, live, {}, None, None)))
    mig = next(a for a in doc["plan"]["actions"] if a["kind"] == "create")
    doc["plan"]["actions"].insert(
        0,
        {
            **{k: v for k, v in mig.items() if k not in ("type", "type_id", "vf", "parent")},
            "kind": "set-mig-mode",
            "address": f"gpu[{ADDRESS}].mig-mode",
            "type_name": None,
            "type_id": None,
            "vf": None,
            "parent": None,
            "uuid": None,
            "enabled": True,
            "disruption": "gpu",
            "before": {"mig": False},
            "after": {"mig": True},
        },
    )
    slipped = parse_saved_plan(json.dumps(doc).encode(), "plan.json")
    with pytest.raises(SavedPlanError, match="not what its desired layout gives"):
        check_saved_plan(slipped, live, {}, CATALOG)


def test_an_interrupted_mode_change_skips_what_is_done_and_finishes() -> None:
    host = ModeHost(time_sliced_pro())
    p = planned(host, MIG_LAYOUT)
    # An earlier run got as far as MIG mode.
    host.clear_vf_type(vf_address(0))
    host.clear_vf_type(vf_address(1))
    host.disable_sriov(ADDRESS)
    host.set_mig_mode(ADDRESS, True)
    host.writes.clear()
    result = apply(p, host, replan=deferred_replanner(CATALOG), desired=MIG_LAYOUT)
    outcomes = {s.kind: s.outcome.value for s in result.steps}
    assert outcomes["set-mig-mode"] == "skipped" and outcomes["disable-sriov"] == "skipped"
    assert outcomes["enable-sriov"] == "ok"
    assert result.converged
    assert host.writes[0] == "enable_sriov"


def test_a_refused_mode_change_stops_the_apply_and_names_the_step() -> None:
    host = ModeHost(time_sliced_pro())
    p = planned(host, MIG_LAYOUT)
    real = host.disable_sriov
    host.disable_sriov = lambda pf: host.writes.append("disable_sriov (lost)")  # type: ignore[method-assign]
    with pytest.raises(ApplyError) as e:
        apply(p, host, replan=deferred_replanner(CATALOG))
    assert e.value.action.kind is ActionKind.SET_MIG_MODE
    assert "In use by another client" in str(e.value)
    host.disable_sriov = real  # type: ignore[method-assign]


def test_a_fleet_plan_lists_a_node_s_mode_steps() -> None:
    from vgpu_state.cli.fleet import node_rows
    from vgpu_state.cli.fleet_markdown import _change_rows

    p = planned(ModeHost(time_sliced_pro()), MIG_LAYOUT)
    details = [row[4][0] if isinstance(row[4], tuple) else row[4] for row in node_rows(p)]
    assert "MIG mode: off → on (GPU reset; no vGPU on it)" in details
    assert details.count("create GPU instance 1g.24gb") == 4
    changes = [row[1] for row in _change_rows(p)]
    assert "MIG mode: off → on (GPU reset; no vGPU on it)" in changes
