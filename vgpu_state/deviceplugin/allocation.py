"""``Allocate`` and ``GetPreferredAllocation`` answers as plain values (pure).

``Allocate`` returns what KubeVirt's virt-launcher reads: the env var
``MDEV_PCI_RESOURCE_<R>`` (mdev UUIDs) or ``PCI_RESOURCE_<R>`` (VF addresses),
comma-joined, plus the VFIO device nodes. The preferred allocation packs vGPUs
onto the GPU that already holds the most of them, so whole GPUs stay free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from vgpu_state.deviceplugin.inventory import ResourceInventory
from vgpu_state.model.resources import env_var

VFIO_CONTAINER = "/dev/vfio/vfio"
IOMMUFD = "/dev/iommu"


class AllocationError(Exception):
    """An ``Allocate`` the plugin must refuse; the message names the devices."""


class UnknownDevicesError(AllocationError):
    def __init__(self, resource: str, ids: Sequence[str]) -> None:
        self.ids = tuple(ids)
        super().__init__(
            f"{resource} has no device(s) {', '.join(self.ids)}; "
            "the kubelet's list is out of date or the IDs belong to another resource"
        )


@dataclass(frozen=True)
class ContainerAllocation:
    envs: dict[str, str]
    device_nodes: tuple[str, ...]
    """Host paths, mapped to the same path in the container with ``mrw``."""


class WithheldDevicesError(AllocationError):
    def __init__(self, resource: str, ids: Sequence[str]) -> None:
        self.ids = tuple(ids)
        super().__init__(
            f"{resource}: device(s) {', '.join(self.ids)} are withheld: the layout of their "
            "GPU is about to change (in-use: evacuate), so they are not offered until the "
            "switch has run or the layout change is reverted"
        )


def allocate(
    inv: ResourceInventory,
    ids: Sequence[str],
    *,
    iommufd: bool,
    withheld: frozenset[str] = frozenset(),
) -> ContainerAllocation:
    """The env vars and device nodes for one container's device IDs.

    ``iommufd``: the host has ``/dev/iommu``; then a vGPU with a VFIO cdev also
    gets ``/dev/iommu`` and ``/dev/vfio/devices/vfio<N>``. ``withheld``: IDs not
    offered now (a pending layout switch); asking for one is refused.
    """
    unknown = [i for i in ids if i not in inv.by_id]
    if unknown:
        raise UnknownDevicesError(inv.resource, unknown)
    held_back = [i for i in ids if i in withheld]
    if held_back:
        raise WithheldDevicesError(inv.resource, held_back)
    devices = [inv.by_id[i] for i in ids]
    no_group = [d.id for d in devices if d.iommu_group is None]
    if no_group:
        raise AllocationError(
            f"{inv.resource}: no IOMMU group known for {', '.join(no_group)}; "
            "a VM cannot open it through VFIO"
        )
    envs: dict[str, str] = {}
    for kind in ("mdev", "vf"):
        chosen = [d.id for d in devices if d.kind == kind]
        if chosen:
            envs[env_var(inv.resource, kind)] = ",".join(chosen)
    nodes: list[str] = [VFIO_CONTAINER]
    for d in devices:
        nodes.append(f"/dev/vfio/{d.iommu_group}")
    if iommufd:
        cdevs = [f"/dev/vfio/devices/{d.vfio_cdev}" for d in devices if d.vfio_cdev]
        if cdevs:
            nodes += [IOMMUFD, *cdevs]
    return ContainerAllocation(envs, tuple(dict.fromkeys(nodes)))


def preferred(
    inv: ResourceInventory,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """Choose ``size`` IDs from ``available``, packing onto the fullest GPU first.

    A GPU's fill is the number of this resource's devices on it that are not
    available (allocated), plus those already chosen. Ties go to the GPU with
    the fewest available devices, then to the lower address, so the same
    request always gets the same answer. IDs the plugin does not know come last.
    """
    chosen = list(dict.fromkeys(must_include))[: max(size, 0)]
    free = [i for i in dict.fromkeys(available) if i not in chosen]
    gpu_of = {i: inv.by_id[i].gpu for i in free if i in inv.by_id}
    free_on: Counter[str] = Counter(gpu_of.values())
    available_set = set(available)
    used_on: Counter[str] = Counter(d.gpu for d in inv.devices if d.id not in available_set)
    for i in chosen:
        if i in inv.by_id:
            used_on[inv.by_id[i].gpu] += 0 if i not in available_set else 1
    while len(chosen) < size and free:
        known = [i for i in free if i in gpu_of]
        if not known:
            chosen += free[: size - len(chosen)]
            break
        best = min(known, key=lambda i: (-used_on[gpu_of[i]], free_on[gpu_of[i]], gpu_of[i], i))
        chosen.append(best)
        free.remove(best)
        used_on[gpu_of[best]] += 1
        free_on[gpu_of[best]] -= 1
    return chosen
