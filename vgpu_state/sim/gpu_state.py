"""The simulated state of one GPU: its VFs and vGPUs, and the rules for what it can create."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from vgpu_state.catalog import GpuModel, VgpuType
from vgpu_state.catalog.capacity import remaining as room
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


@dataclass
class SimVgpu:
    type: VgpuType
    uuid: str | None
    vf: int | None
    iommu_group: int
    in_use: str | None = None


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
        """The types the driver flavour exposes (time-sliced; MIG mode is not simulated)."""
        series = _SERIES[self.flavour]
        return tuple(
            t for t in (*self.model.types, *self.extra_types) if not t.is_mig and t.series in series
        )

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
        """How many more vGPUs of ``t`` fit under the equal-size rule (§5.2)."""
        left = room(t, [v.type for v in self.vgpus])
        if self.sriov_capable:
            left = min(left, self.free_vfs())
        return left

    def remaining_of(self, types: Iterable[VgpuType]) -> list[tuple[VgpuType, int]]:
        """Each of ``types`` with its :meth:`remaining`, the GPU's vGPUs counted once."""
        existing = [v.type for v in self.vgpus]
        free = self.free_vfs() if self.sriov_capable else None
        return [
            (t, room(t, existing) if free is None else min(room(t, existing), free)) for t in types
        ]

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
