"""Where vGPUs of different framebuffer sizes go on one GPU in mixed-size mode.

The driver's placement grid for mixed-size (heterogeneous) mode is in no
source found (reference: nvidia-sysfs.md §5.3); this is the suggested model
there, an INFERENCE that validate and plan say is one, and that a driver's own
``creatable_vgpu_types`` re-read overrules:

* the GPU has ``S`` slots of the smallest time-sliced type's framebuffer
  ``F_min``: as many as its framebuffer holds (``framebuffer // F_min``; the
  smallest type's ``max_instances``, which §5.3 suggests for ``S``, is often
  lower, capped by the VF count, and would leave no room for the whole-GPU
  type). Where ``F_min`` does not divide every type's framebuffer (the RTX PRO
  6000's ``DC-3Q`` and ``DC-4Q``) the slot is their greatest common divisor;
* a type of framebuffer ``F`` takes ``F / F_min`` contiguous slots starting at
  a multiple of that size (size-aligned);
* so the framebuffers add up to at most the GPU's; at most ``sriov_totalvfs``
  vGPUs (one per VF), and at most each type's own ``max_instances``.

:func:`place` puts the largest first, each at the lowest free aligned start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vgpu_state.catalog.catalog import GpuModel, VgpuType


@dataclass(frozen=True)
class PlacedVgpu:
    """One vGPU's slots: ``start`` … ``start + size - 1``."""

    type_name: str
    start: int
    size: int
    existing: bool = False
    """Placed before (given to :func:`place`), not new."""


@dataclass(frozen=True)
class Placement:
    """A feasible mixed-size layout of one GPU."""

    slots: int
    """``S``: the GPU's slots (of :func:`grid`'s size each)."""
    vgpus: tuple[PlacedVgpu, ...]
    """Every vGPU, existing and new, by start slot."""

    @property
    def new(self) -> tuple[PlacedVgpu, ...]:
        """The vGPUs to create, in the order to create them (largest first)."""
        return tuple(
            sorted((v for v in self.vgpus if not v.existing), key=lambda v: (-v.size, v.start))
        )

    @property
    def used(self) -> int:
        return sum(v.size for v in self.vgpus)


def grid(model: GpuModel) -> tuple[int, int] | None:
    """``(S, F_min)`` of the model's time-sliced types; ``None`` when it has none."""
    sizes = {t.framebuffer_mib for t in model.types if not t.is_mig and t.framebuffer_mib > 0}
    if not sizes:
        return None
    unit = math.gcd(*sizes)
    return model.framebuffer_mib // unit, unit


def place(
    model: GpuModel, types: Mapping[str, int], existing: Sequence[tuple[str, int]] = ()
) -> Placement | str:
    """Place ``types`` (type name → count) beside the ``existing`` vGPUs ((type name,
    start slot)) on one GPU of ``model`` in mixed-size mode: a :class:`Placement`, or
    why it does not fit (naming the types and their sizes)."""
    layout = grid(model)
    if layout is None:
        return f"the {model.name} has no time-sliced vGPU types"
    slots, unit = layout
    wanted: list[tuple[VgpuType, int]] = []
    for name, count in types.items():
        t = model.type(name)
        if t is None:
            return f"{name} is not a vGPU type of the {model.name}"
        if t.is_mig:
            return f"{t.name} is MIG-backed; mixed-size mode places time-sliced types"
        if count < 0:
            return f"{t.name}: {count} vGPUs"
        if count:
            wanted.append((t, count))
    taken = [False] * slots
    placed: list[PlacedVgpu] = []
    per_type: dict[str, int] = {}
    for name, start in existing:
        t = model.type(name)
        if t is None or t.is_mig:
            return (
                f"the existing vGPU {name} at slot {start} is not a time-sliced type of "
                f"the {model.name}"
            )
        size = _size(t, unit)
        if start < 0 or start % size or start + size > slots:
            return (
                f"the existing {t.name} at slot {start} is not on a {size}-slot boundary of "
                f"the {model.name}'s {slots} slots"
            )
        if any(taken[start : start + size]):
            return f"the existing {t.name} at slot {start} overlaps another vGPU"
        taken[start : start + size] = [True] * size
        placed.append(PlacedVgpu(t.name, start, size, existing=True))
        per_type[t.name] = per_type.get(t.name, 0) + 1
    for t, count in wanted:
        total = per_type.get(t.name, 0) + count
        if total > t.max_instances:
            return f"{t.name}: {total} exceeds {t.max_instances}, the most one {model.name} holds"
    vgpus = len(placed) + sum(n for _, n in wanted)
    if model.sriov_totalvfs and vgpus > model.sriov_totalvfs:
        return (
            f"{vgpus} vGPUs need {vgpus} virtual functions; one {model.name} has "
            f"{model.sriov_totalvfs}"
        )
    need = sum(v.size for v in placed) + sum(_size(t, unit) * n for t, n in wanted)
    if need > slots:
        return (
            f"{_describe(wanted, unit)} need {need} slots of {unit} MiB"
            f"{' beside the existing vGPUs' if placed else ''}; one {model.name} has {slots} "
            f"({model.framebuffer_mib} MiB)"
        )
    order = sorted(wanted, key=lambda tn: (-tn[0].framebuffer_mib, tn[0].name))
    for t, count in order:
        size = _size(t, unit)
        for _ in range(count):
            free = free_run(taken, size)
            if free is None:
                return (
                    f"{_describe(wanted, unit)}: no free {size}-slot run on a {size}-slot "
                    f"boundary left for {t.name} (the {model.name} has {slots} slots of "
                    f"{unit} MiB; placed largest first)"
                )
            taken[free : free + size] = [True] * size
            placed.append(PlacedVgpu(t.name, free, size))
    return Placement(slots=slots, vgpus=tuple(sorted(placed, key=lambda v: v.start)))


def _size(t: VgpuType, unit: int) -> int:
    return max(1, -(-t.framebuffer_mib // unit))


def free_run(taken: list[bool], size: int) -> int | None:
    """The lowest start of ``size`` free slots aligned to ``size`` in ``taken``, or ``None``
    (the placement rule of mixed-size slots and of MIG GPU instances; inferred)."""
    for start in range(0, len(taken) - size + 1, size):
        if not any(taken[start : start + size]):
            return start
    return None


def _describe(wanted: Sequence[tuple[VgpuType, int]], unit: int) -> str:
    return ", ".join(
        f"{t.name} × {n} ({t.framebuffer_mib} MiB, {_size(t, unit)} "
        f"slot{'s' if _size(t, unit) != 1 else ''} each)"
        for t, n in sorted(wanted, key=lambda tn: (-tn[0].framebuffer_mib, tn[0].name))
    )
