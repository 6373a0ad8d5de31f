"""``expected_snapshot(plan, snapshot)``: the host state a plan should produce.

Creatable counters are left as they were (they are derived by the driver and
excluded from the fingerprint). For a GPU whose creates wait for SR-IOV
(``GpuPlan.deferred``) the parents are unknown until the VFs exist, so the
expected vGPUs carry an empty parent; the executor re-plans such a GPU after
enabling SR-IOV and verifies against that plan.

A GPU's modes (:attr:`Gpu.modes`) follow its mode steps: disabling or enabling
SR-IOV clears heterogeneous mode and destroys every GPU instance; a created GPU instance has no
id until the driver gives it one (``-1`` here: compare profiles, not ids).
"""

from __future__ import annotations

from vgpu_state.model.gpumode import GpuInstance, GpuModes
from vgpu_state.model.plan import MODE_KINDS, Action, ActionKind, Plan
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SysfsInterface, Vgpu, VirtualFunction


def expected_gpu(g: Gpu, actions: tuple[Action, ...]) -> Gpu:
    """``g`` as ``actions`` (steps on that GPU) should leave it."""
    vgpus = {v.key: v for v in g.vgpus}
    vf_types = {vf.address: vf.current_type_id for vf in g.vfs}
    numvfs = g.sriov_numvfs
    modes = g.modes
    for a in actions:
        if a.kind in MODE_KINDS:
            modes = expected_modes(modes, a)
            if a.kind is ActionKind.DISABLE_SRIOV:
                numvfs = 0
                vgpus = {k: v for k, v in vgpus.items() if v.kind != "vf" and v.parent == g.address}
                vf_types = dict.fromkeys(vf_types)
        elif a.kind is ActionKind.DESTROY:
            key = a.uuid if a.uuid is not None else a.vf
            if key is not None:
                vgpus.pop(key, None)
            if a.vf is not None:
                vf_types[a.vf] = None
        elif a.kind is ActionKind.ENABLE_SRIOV:
            numvfs = g.sriov_totalvfs or 0
            modes = expected_modes(modes, a)
        elif a.layout is SysfsInterface.VENDOR_VFIO and a.vf is not None:
            vgpus[a.vf] = Vgpu(kind="vf", parent=a.vf, type_id=a.type_id, type_name=a.type_name)
            vf_types[a.vf] = a.type_id
        else:
            # A create that waits for SR-IOV has no parent yet: it stands on the GPU
            # until the apply places it on a VF.
            v = Vgpu(
                kind="mdev",
                parent=a.parent or a.gpu,
                uuid=a.uuid,
                type_id=a.type_id,
                type_name=a.type_name,
            )
            vgpus[v.key] = v
    # A VF whose type stays is kept as it is (the models are frozen): most VFs of a
    # fleet's GPUs are untouched by a plan, and a copy per VF per node adds up.
    vfs: tuple[VirtualFunction, ...] = tuple(
        vf
        if vf_types.get(vf.address) == vf.current_type_id
        else vf.model_copy(update={"current_type_id": vf_types.get(vf.address)})
        for vf in g.vfs
    )
    update: dict[str, object] = {
        "vgpus": tuple(sorted(vgpus.values(), key=lambda v: v.key)),
        "vfs": vfs,
        "sriov_numvfs": numvfs,
    }
    if modes is not g.modes:
        update["modes"] = modes
    return g.model_copy(update=update)


def expected_modes(modes: GpuModes | None, a: Action) -> GpuModes | None:
    """``modes`` after the mode (or SR-IOV) step ``a`` (unchanged when they were not read)."""
    if modes is None:
        return None
    if a.kind in (ActionKind.DISABLE_SRIOV, ActionKind.ENABLE_SRIOV):
        # sriov-manage either way: no GPU instance survives, heterogeneous mode is off.
        het = None if modes.heterogeneous is None else False
        return modes.model_copy(update={"gpu_instances": (), "heterogeneous": het})
    if a.kind is ActionKind.SET_MIG_MODE:
        return modes.model_copy(update={"mig": bool(a.enabled), "mig_pending": None})
    if a.kind is ActionKind.SET_HETEROGENEOUS_MODE:
        return modes.model_copy(update={"heterogeneous": bool(a.enabled)})
    if a.kind is ActionKind.DESTROY_GPU_INSTANCE:
        kept = tuple(gi for gi in modes.gpu_instances if gi.id != a.gi_id)
        return modes.model_copy(update={"gpu_instances": kept})
    if a.kind is ActionKind.CREATE_GPU_INSTANCE and a.profile is not None:
        new = GpuInstance.model_construct(id=-1, profile=a.profile)
        return modes.model_copy(update={"gpu_instances": (*modes.gpu_instances, new)})
    return modes


def modes_view(g: Gpu | None) -> set[str]:
    """What verification compares of a GPU's modes: its mode and its GPU instances per
    profile (``mode mig``, ``gpu instance 1g.24gb × 4``); empty when they were not read."""
    if g is None or g.modes is None:
        return set()
    out = {f"mode {g.modes.mode.value}"}
    out.update(f"gpu instance {p} × {n}" for p, n in sorted(g.modes.gi_counts().items()))
    return out


def expected_snapshot(plan: Plan, snapshot: NodeSnapshot) -> NodeSnapshot:
    by_gpu: dict[str, list[Action]] = {}
    for a in plan.actions:
        by_gpu.setdefault(a.gpu, []).append(a)
    gpus = tuple(
        expected_gpu(g, tuple(by_gpu[g.address])) if g.address in by_gpu else g
        for g in snapshot.gpus
    )
    return snapshot.model_copy(update={"gpus": gpus})
