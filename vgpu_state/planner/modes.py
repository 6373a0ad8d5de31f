"""A GPU's mode in a plan: the mode a layout wants, its MIG geometry, and the rules
(inferred, not verified on hardware) that say whether a MIG geometry or a mixed-size
layout fits one GPU.

The rules are the catalog's (:mod:`vgpu_state.catalog`); each is called through one
function here, so the plan says once that it relies on them
(:attr:`vgpu_state.model.plan.Plan.experimental`), and a driver's own answers (its
lists, read again after each change) win over them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from vgpu_state.catalog import GpuModel, parse_type_name
from vgpu_state.model.desired import DesiredGpu
from vgpu_state.model.gpumode import GpuMode
from vgpu_state.planner.support import is_mig_backed

MIG_RULE = "MIG GPU instance geometry (profiles, slices and memory per GPU)"
MIXED_RULE = "mixed-size placement (which framebuffer sizes fit one GPU together)"
NEEDS_NVIDIA_SMI = "reading MIG/mixed-size mode needs nvidia-smi: pass --nvidia-smi PATH"

MODE_TEXT = {
    GpuMode.TIME_SLICED: "time-sliced",
    GpuMode.MIXED_SIZE: "mixed-size",
    GpuMode.MIG: "MIG-backed",
}

_PROFILE = re.compile(r"([1-9][0-9]?)g\.([1-9][0-9]{0,3})gb(\+me)?")


def desired_mode(dg: DesiredGpu) -> GpuMode:
    """The mode ``dg`` wants: its ``mode``, else ``mig`` when its types are MIG-backed."""
    if dg.mode is not GpuMode.TIME_SLICED:
        return dg.mode
    if any(c > 0 and is_mig_backed(n) for n, c in dg.types):
        return GpuMode.MIG
    return GpuMode.TIME_SLICED


def mig_slices_of(model: GpuModel) -> int:
    """The model's compute slices: the largest slice count of its MIG-backed types."""
    slices = [t.mig_slices for t in model.types if t.mig_slices]
    return max(slices, default=0)


def mig_geometry(model: GpuModel | None, dg: DesiredGpu) -> tuple[tuple[str, int], ...]:
    """The GPU instances (profile, count) ``dg``'s MIG-backed vGPUs need, sorted by profile.

    The layout's own (``mig-geometry``, or what config resolution worked out from its
    types), else one GPU instance per vGPU, sized by its type (``DC-1-24Q`` →
    ``1g.24gb``).
    """
    if dg.mig_geometry:
        return dg.mig_geometry
    counts: dict[str, int] = {}
    for name, count in dg.types:
        parsed = parse_type_name(name)
        t = model.type(name) if model is not None else None
        if count <= 0 or parsed is None or not parsed.is_mig or t is None:
            continue
        profile = f"{parsed.mig_slices}g.{t.framebuffer_mib // 1024}gb"
        if name.endswith("ME"):
            profile += "+me"
        counts[profile] = counts.get(profile, 0) + count
    return tuple(sorted(counts.items()))


def geometry_problem(model: GpuModel | None, geometry: tuple[tuple[str, int], ...]) -> str | None:
    """Why ``geometry`` does not fit one GPU of ``model`` (inferred), or ``None``.

    The GPU instances' slices add up to at most the model's, their memory to at
    most its framebuffer.
    """
    if model is None:
        return None
    total = mig_slices_of(model)
    slices = memory = 0
    for profile, count in geometry:
        m = _PROFILE.fullmatch(profile)
        if m is None:
            return f"{profile} is not a GPU instance profile (like 1g.24gb)"
        slices += int(m.group(1)) * count
        memory += int(m.group(2)) * 1024 * count
    if slices > total:
        return f"the GPU instances take {slices} compute slices; {model.name} has {total}"
    if memory > model.framebuffer_mib:
        return (
            f"the GPU instances take {memory} MiB; {model.name} has "
            f"{model.framebuffer_mib} MiB of framebuffer"
        )
    return None


def mixed_size_problem(model: GpuModel | None, types: Mapping[str, int]) -> str | None:
    """Why vGPUs of ``types`` (name → count) cannot share one GPU of ``model`` in
    mixed-size mode (inferred), or ``None``: their framebuffers add up to more than
    the GPU's."""
    if model is None:
        return None
    used = 0
    for name, count in types.items():
        t = model.type(name)
        if t is not None:
            used += t.framebuffer_mib * count
    if used > model.framebuffer_mib:
        return (
            f"the vGPUs take {used} MiB together; {model.name} has "
            f"{model.framebuffer_mib} MiB of framebuffer"
        )
    return None
