"""The simulated state of one GPU: its VFs and vGPUs, and the rules for what it can create."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from vgpu_state.catalog import GpuModel, VgpuType
from vgpu_state.catalog.capacity import remaining as room
from vgpu_state.catalog.mig import (
    GiProfile,
    geometry_fits,
    gi_profile_for,
    mig_profiles,
    mig_slices,
)
from vgpu_state.catalog.placement import grid
from vgpu_state.model.pci import vf_address

SRIOV_OFFSET = 4


SRIOV_STRIDE = 1

_SERIES = {"graphics": frozenset("QBA"), "compute": frozenset("C"), "all": frozenset("QBAC")}


# Subsystem device ids of PFs whose model the catalog tells apart by device id alone.
_DEFAULT_SUBSYSTEM = {0x1EB8: 0x12A2, 0x26B9: 0x1851}


@lru_cache(maxsize=256)
def _vf_addresses(pf: str, numvfs: int) -> tuple[str, ...]:
    """The addresses of a PF's first ``numvfs`` VFs (computed once per PF and count)."""
    return tuple(vf_address(pf, SRIOV_OFFSET, SRIOV_STRIDE, i) for i in range(numvfs))


def fail(code: int, message: str = "") -> OSError:
    return OSError(code, message or errno.errorcode.get(code, str(code)))


@lru_cache(maxsize=64)
def _with_extras(model: GpuModel, extras: tuple[VgpuType, ...]) -> GpuModel:
    return replace(model, types=(*model.types, *extras)) if extras else model


@dataclass
class SimVgpu:
    type: VgpuType
    uuid: str | None
    vf: int | None
    iommu_group: int
    in_use: str | None = None
    gpu_instance: int | None = None
    """MIG-backed: the id of the GPU instance it lives in."""
    placement: int | None = None
    """Mixed-size mode: the first slot it occupies."""


@dataclass(frozen=True)
class SimGpuInstance:
    """A MIG GPU instance: its id, profile and the compute slices it occupies."""

    id: int
    profile: GiProfile
    start: int


def free_run(taken: Iterable[tuple[int, int]], size: int, total: int) -> int | None:
    """The first start of ``size`` free, size-aligned slots among ``total``, or ``None``.

    ``taken``: ``(start, size)`` of the occupied runs. The slot model of mixed-size
    mode and of GPU instance placement (both inferred, see docs/simulator.md).
    """
    if size < 1 or size > total:
        return None
    used = [False] * total
    for start, n in taken:
        for k in range(max(start, 0), min(start + n, total)):
            used[k] = True
    for start in range(0, total - size + 1, size):
        if not any(used[start : start + size]):
            return start
    return None


@dataclass
class SimGpu:
    index: int
    address: str
    model: GpuModel
    model_text: str
    layout: str
    driver: str
    numvfs: int
    numa_node: int
    iommu_group: int
    vf_iommu_group_base: int
    flavour: str
    spec_iommu_group: int | None = None
    spec_vf_iommu_group_base: int | None = None
    extra_types: tuple[VgpuType, ...] = ()
    """Types this driver offers beyond the catalog (``driver.extra-types`` of the spec)."""
    vgpus: list[SimVgpu] = field(default_factory=list)
    mig_mode: bool = False
    gpu_instances: list[SimGpuInstance] = field(default_factory=list)
    heterogeneous: bool = False

    @property
    def mig_capable(self) -> bool:
        return any(t.is_mig for t in self.model.types)

    @property
    def mixed_size_capable(self) -> bool:
        """The driver's heterogeneous mode exists here (inferred: the vendor-VFIO layout)."""
        return self.layout == "vendor-vfio" and self.sriov_capable

    @property
    def sriov_capable(self) -> bool:
        return self.model.sriov_capable

    @property
    def totalvfs(self) -> int:
        return self.model.sriov_totalvfs

    @property
    def device_id(self) -> int:
        return self.model.device_ids[0]

    @property
    def subsystem_device_id(self) -> int:
        ids = self.model.subsystem_device_ids
        return ids[0] if ids else _DEFAULT_SUBSYSTEM.get(self.device_id, 0)

    def vf_addresses(self) -> list[str]:
        return list(_vf_addresses(self.address, self.numvfs))

    def vf_index(self, address: str) -> int | None:
        for i, a in enumerate(self.vf_addresses()):
            if a == address:
                return i
        return None

    def offered_types(self) -> tuple[VgpuType, ...]:
        """The types the driver flavour exposes: MIG-backed ones in MIG mode, else time-sliced."""
        series = _SERIES[self.flavour]
        return tuple(
            t
            for t in (*self.model.types, *self.extra_types)
            if t.is_mig == self.mig_mode and t.series in series
        )

    # MIG -----------------------------------------------------------------------
    @property
    def driver_model(self) -> GpuModel:
        """The model with the spec's extra types: what the driver's profiles derive from."""
        return _with_extras(self.model, self.extra_types)

    def gi_profiles(self) -> tuple[GiProfile, ...]:
        return mig_profiles(self.driver_model)

    def mig_slices(self) -> int:
        """The GPU's compute slices (the catalog's rule, over the driver's types)."""
        return mig_slices(self.driver_model)

    def gi_profile_of(self, t: VgpuType) -> tuple[GiProfile, int] | None:
        return gi_profile_for(self.driver_model, t.name)

    def gpu_instance(self, gi_id: int) -> SimGpuInstance | None:
        for gi in self.gpu_instances:
            if gi.id == gi_id:
                return gi
        return None

    def gi_room(self, profile: GiProfile, start: int | None = None) -> int | None:
        """Where a new GPU instance of ``profile`` would start (at ``start`` when given),
        or ``None`` when it does not fit (compute slices, memory, its own count)."""
        counts: dict[str, int] = {profile.name: 1}
        for gi in self.gpu_instances:
            counts[gi.profile.name] = counts.get(gi.profile.name, 0) + 1
        if geometry_fits(self.driver_model, sorted(counts.items())) is not None:
            return None
        taken = [(gi.start, gi.profile.slices) for gi in self.gpu_instances]
        if start is None:
            return free_run(taken, profile.slices, self.mig_slices())
        if start % profile.slices or start + profile.slices > self.mig_slices():
            return None
        overlaps = any(s < start + profile.slices and start < s + n for s, n in taken)
        return None if overlaps else start

    def next_gi_id(self) -> int:
        ids = {gi.id for gi in self.gpu_instances}
        return next(i for i in range(1, len(ids) + 2) if i not in ids)

    def gi_slots(self, t: VgpuType) -> list[tuple[SimGpuInstance, int]]:
        """Each GPU instance ``t`` may land in, with how many more of ``t`` it holds."""
        found = self.gi_profile_of(t)
        if found is None:
            return []
        profile, per_gi = found
        out = []
        for gi in self.gpu_instances:
            if gi.profile.name != profile.name:
                continue
            inside = [v.type for v in self.vgpus if v.gpu_instance == gi.id]
            if any(x.framebuffer_mib != t.framebuffer_mib for x in inside):
                continue  # one framebuffer size per GPU instance
            if len(inside) < per_gi:
                out.append((gi, per_gi - len(inside)))
        return out

    # mixed-size ------------------------------------------------------------------
    def slot_model(self) -> tuple[int, int]:
        """``(slots, MiB per slot)`` of mixed-size mode: the catalog's slot grid of the
        driver's time-sliced types (the greatest common divisor of their framebuffers)."""
        found = grid(self.driver_model)
        return found if found is not None else (0, 1)

    def slot_size(self, t: VgpuType) -> int:
        return -(-t.framebuffer_mib // self.slot_model()[1])

    def free_placement(self, t: VgpuType) -> int | None:
        """Mixed-size mode: the first slot a new ``t`` would occupy, or ``None``."""
        slots, _ = self.slot_model()
        used = sum(v.type.framebuffer_mib for v in self.vgpus)
        if used + t.framebuffer_mib > self.model.framebuffer_mib:
            return None
        taken = [(v.placement or 0, self.slot_size(v.type)) for v in self.vgpus]
        return free_run(taken, self.slot_size(t), slots)

    def type_named(self, name: str) -> VgpuType | None:
        """A type of this GPU's driver by name: the catalog's or a spec's extra type."""
        found = self.model.type(name)
        if found is not None:
            return found
        for t in self.extra_types:
            if t.name == name.strip().split()[-1]:
                return t
        return None

    def vgpu_on_vf(self, index: int) -> SimVgpu | None:
        for v in self.vgpus:
            if v.vf == index:
                return v
        return None

    def free_vfs(self) -> int:
        return self.numvfs - sum(1 for v in self.vgpus if v.vf is not None)

    def remaining(self, t: VgpuType) -> int:
        """How many more vGPUs of ``t`` fit: the equal-size rule (§5.2), the slot model
        of mixed-size mode (§5.3), or the room in GPU instances in MIG mode (§5.4)."""
        return self.remaining_of((t,))[0][1]

    def _room(self, t: VgpuType, existing: list[VgpuType]) -> int:
        if t.is_mig != self.mig_mode:
            return 0
        if self.mig_mode:
            return sum(n for _, n in self.gi_slots(t))
        if self.heterogeneous:
            return self._mixed_room(t)
        return room(t, existing)

    def _mixed_room(self, t: VgpuType) -> int:
        """How many more of ``t`` the slot model places beside the GPU's vGPUs."""
        slots, _ = self.slot_model()
        size = self.slot_size(t)
        taken = [(v.placement or 0, self.slot_size(v.type)) for v in self.vgpus]
        used = sum(v.type.framebuffer_mib for v in self.vgpus)
        count = 0
        while used + t.framebuffer_mib <= self.model.framebuffer_mib:
            start = free_run(taken, size, slots)
            if start is None:
                break
            taken.append((start, size))
            used += t.framebuffer_mib
            count += 1
        return count

    def remaining_of(self, types: Iterable[VgpuType]) -> list[tuple[VgpuType, int]]:
        """Each of ``types`` with its :meth:`remaining`, the GPU's vGPUs counted once."""
        existing = [v.type for v in self.vgpus]
        free = self.free_vfs() if self.sriov_capable else None
        out = []
        for t in types:
            n = self._room(t, existing)
            out.append((t, n if free is None else min(n, free)))
        return out

    def available(self, vf: int | None, t: VgpuType) -> int:
        """``available_instances`` of ``t`` on a parent (a VF index, or ``None`` for the PF)."""
        if vf is not None and self.vgpu_on_vf(vf) is not None:
            return 0
        left = self.remaining(t)
        return min(left, 1) if vf is not None else left

    def creatable_on_vf(self, vf: int) -> tuple[VgpuType, ...]:
        if self.vgpu_on_vf(vf) is not None:
            return ()
        return tuple(t for t in self.offered_types() if self.remaining(t) > 0)

    def type_by_id(self, type_id: int) -> VgpuType | None:
        for t in self.offered_types():
            if t.type_id == type_id:
                return t
        return None

    def is_mdev_parent_pf(self) -> bool:
        return self.layout == "mdev" and not self.sriov_capable and self.driver == "nvidia"
