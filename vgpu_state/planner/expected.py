"""``expected_snapshot(plan, snapshot)``: the host state a plan should produce.

Creatable counters are left as they were (they are derived by the driver and
excluded from the fingerprint). For a GPU whose creates wait for SR-IOV
(``GpuPlan.deferred``) the parents are unknown until the VFs exist, so the
expected vGPUs carry an empty parent; the executor re-plans such a GPU after
enabling SR-IOV and verifies against that plan.
"""

from __future__ import annotations

from vgpu_state.model.plan import Action, ActionKind, Plan
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SysfsInterface, Vgpu, VirtualFunction


def expected_gpu(g: Gpu, actions: tuple[Action, ...]) -> Gpu:
    """``g`` as ``actions`` (steps on that GPU) should leave it."""
    vgpus = {v.key: v for v in g.vgpus}
    vf_types = {vf.address: vf.current_type_id for vf in g.vfs}
    numvfs = g.sriov_numvfs
    for a in actions:
        if a.kind is ActionKind.DESTROY:
            key = a.uuid if a.uuid is not None else a.vf
            if key is not None:
                vgpus.pop(key, None)
            if a.vf is not None:
                vf_types[a.vf] = None
        elif a.kind is ActionKind.ENABLE_SRIOV:
            numvfs = g.sriov_totalvfs or 0
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
    return g.model_copy(
        update={
            "vgpus": tuple(sorted(vgpus.values(), key=lambda v: v.key)),
            "vfs": vfs,
            "sriov_numvfs": numvfs,
        }
    )


def expected_snapshot(plan: Plan, snapshot: NodeSnapshot) -> NodeSnapshot:
    by_gpu: dict[str, list[Action]] = {}
    for a in plan.actions:
        by_gpu.setdefault(a.gpu, []).append(a)
    gpus = tuple(
        expected_gpu(g, tuple(by_gpu[g.address])) if g.address in by_gpu else g
        for g in snapshot.gpus
    )
    return snapshot.model_copy(update={"gpus": gpus})
