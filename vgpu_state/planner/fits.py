"""How many more vGPUs of each type fit one GPU as it is now: what ``scan`` shows.

The driver's lists say which types a parent can take now, not how many: on an
SR-IOV GPU every free VF lists the same types while the GPU's framebuffer has
room for far fewer vGPUs than it has VFs. The count here is the driver's own
``available_instances`` where it gives one (mdev on the GPU itself), else the
free VFs that list the type, capped by the capacity rule of
:mod:`vgpu_state.catalog.capacity` (one framebuffer size per GPU; a type's most
instances less the vGPUs that exist).
"""

from __future__ import annotations

from typing import Literal

from vgpu_state.catalog import Catalog, GpuModel, type_sort_key
from vgpu_state.catalog.capacity import remaining
from vgpu_state.catalog.mig import gi_profile_for
from vgpu_state.catalog.placement import place
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.snapshot import Gpu
from vgpu_state.planner.plan import UNCHECKED_INSTANCES, type_info


class TypeFit(Frozen):
    """How many more vGPUs of one type fit the GPU now, each count alone."""

    type: str
    count: int
    on: Literal["gpu", "vfs"]
    """``gpu``: mdev types on the GPU itself (the driver's count); ``vfs``: its free VFs."""
    free_vfs: int | None = None
    """With ``on: vfs``: the free VFs whose list has the type."""


def still_fits(gpu: Gpu, catalog: Catalog) -> tuple[TypeFit, ...]:
    """Per type the driver lists as creatable now: how many more fit (each count alone:
    types of one size share it, and sizes do not mix on one GPU)."""
    sizes = {t.name: t.framebuffer_mib for t in gpu.offered}

    def order(name: str) -> tuple[int, str]:
        return type_sort_key(name, sizes.get(name))

    out: list[TypeFit] = []
    for t in sorted(gpu.pf_creatable, key=lambda t: order(t.name)):
        if t.available > 0:
            out.append(TypeFit(type=t.name, count=t.available, on="gpu"))
    busy = {v.parent for v in gpu.vgpus}
    offering: dict[str, int] = {}
    for vf in gpu.vfs:
        if vf.address in busy:
            continue
        for t in vf.creatable:
            offering[t.name] = offering.get(t.name, 0) + 1
    existing = [type_info(catalog, gpu, v.type_name) for v in gpu.vgpus]
    for name in sorted(offering, key=order):
        vfs = offering[name]
        info = type_info(catalog, gpu, name)
        room = (
            remaining(info, existing)
            if info is not None and info.max_instances != UNCHECKED_INSTANCES
            else vfs
        )
        model = catalog.model(gpu.model) if gpu.model else None
        in_mode = _mode_room(gpu, model, name, vfs) if model is not None else None
        if in_mode is not None:
            room = in_mode
        out.append(TypeFit(type=name, count=min(vfs, room), on="vfs", free_vfs=vfs))
    return tuple(out)


def _mode_room(gpu: Gpu, model: GpuModel, name: str, most: int) -> int | None:
    """How many more of ``name`` fit in the GPU's mode as ``nvidia-smi`` read it: in MIG
    mode the room left in its GPU instances of the type's profile (one framebuffer size
    per instance), in mixed-size mode the slots left beside its vGPUs (both inferred);
    ``None`` in equal-size mode or when the modes were not read."""
    modes = gpu.modes
    if modes is None:
        return None
    if modes.mig:
        found = gi_profile_for(model, name)
        wanted = model.type(name)
        if found is None or wanted is None:
            return 0
        profile, per_gi = found
        room = 0
        for gi in modes.gpu_instances:
            if gi.profile != profile.name:
                continue
            inside = [v for v in gpu.vgpus if v.gpu_instance_id == gi.id]
            sizes = {t.framebuffer_mib for v in inside if (t := model.type(v.type_name or ""))}
            if sizes <= {wanted.framebuffer_mib}:
                room += max(0, per_gi - len(inside))
        return min(room, most)
    if modes.heterogeneous:
        existing = [
            (v.type_name, v.placement_id)
            for v in gpu.vgpus
            if v.type_name is not None and v.placement_id is not None
        ]
        if len(existing) != len(gpu.vgpus):
            return None
        n = 0
        while n < most and not isinstance(place(model, {name: n + 1}, existing), str):
            n += 1
        return n
    return None
