"""A GPU's mode in a plan: the mode a layout wants, its MIG geometry, and the rules
(inferred, not verified on hardware) that say whether a MIG geometry or a mixed-size
layout fits one GPU.

The rules are the catalog's (:mod:`vgpu_state.catalog`); each is called through one
function here, so the plan says once that it relies on them
(:attr:`vgpu_state.model.plan.Plan.experimental`), and a driver's own answers (its
lists, read again after each change) win over them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vgpu_state.catalog import GpuModel
from vgpu_state.catalog.mig import geometry_fits, geometry_for
from vgpu_state.catalog.placement import place
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

def desired_mode(dg: DesiredGpu) -> GpuMode:
    """The mode ``dg`` wants: its ``mode``, else ``mig`` when its types are MIG-backed."""
    if dg.mode is not GpuMode.TIME_SLICED:
        return dg.mode
    if any(c > 0 and is_mig_backed(n) for n, c in dg.types):
        return GpuMode.MIG
    return GpuMode.TIME_SLICED


def mig_geometry(model: GpuModel | None, dg: DesiredGpu) -> tuple[tuple[str, int], ...]:
    """The GPU instances (profile, count) ``dg``'s MIG-backed vGPUs need, sorted by profile.

    The layout's own (``mig-geometry``, or what config resolution worked out from its
    types), else the fewest GPU instances that hold its types
    (:func:`vgpu_state.catalog.mig.geometry_for`).
    """
    if dg.mig_geometry:
        return dg.mig_geometry
    if model is None:
        return ()
    return geometry_for(model, dict(dg.types))


def geometry_problem(model: GpuModel | None, geometry: tuple[tuple[str, int], ...]) -> str | None:
    """Why ``geometry`` does not fit one GPU of ``model`` (inferred), or ``None``
    (:func:`vgpu_state.catalog.mig.geometry_fits`: slices and memory per GPU)."""
    if model is None:
        return None
    return geometry_fits(model, geometry)


def mixed_size_problem(
    model: GpuModel | None,
    types: Mapping[str, int],
    existing: Sequence[tuple[str, int]] = (),
) -> str | None:
    """Why vGPUs of ``types`` (name → count) cannot share one GPU of ``model`` in
    mixed-size mode (inferred), or ``None``: the placement slot model of
    :func:`vgpu_state.catalog.placement.place`, beside the ``existing`` vGPUs ((type
    name, placement id) as the driver reports them)."""
    if model is None:
        return None
    placed = place(model, types, existing)
    return placed if isinstance(placed, str) else None
