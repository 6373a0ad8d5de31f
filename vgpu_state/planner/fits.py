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

from vgpu_state.catalog import Catalog, type_sort_key
from vgpu_state.catalog.capacity import remaining
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
        out.append(TypeFit(type=name, count=min(vfs, room), on="vfs", free_vfs=vfs))
    return tuple(out)
