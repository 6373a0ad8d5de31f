"""What the device plugin advertises, computed from a :class:`NodeSnapshot` (pure).

One resource per vGPU type (``nvidia.com/<type name, whitespace as _>``, the
rule of :mod:`vgpu_state.model.resources` that the KubeVirt CR entries use too);
one device per vGPU: the mdev UUID, or the VF address for the vendor-VFIO layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from vgpu_state.model.resources import DEFAULT_DOMAIN, ResourceNameError, resource_name
from vgpu_state.model.snapshot import NodeSnapshot, Vgpu

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Device:
    """One advertised vGPU."""

    id: str
    """The mdev UUID or the VF address: what ``Allocate`` receives and KubeVirt reads."""
    kind: Literal["mdev", "vf"]
    gpu: str
    """The physical GPU (PF address) the vGPU lives on."""
    numa_node: int | None
    iommu_group: int | None
    vfio_cdev: str | None
    type_id: int | None
    sysfs_root: str


@dataclass(frozen=True)
class ResourceInventory:
    """The devices of one resource, sorted by ID."""

    resource: str
    devices: tuple[Device, ...]
    by_id: Mapping[str, Device] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {d.id: d for d in self.devices})


@dataclass(frozen=True)
class Inventory:
    resources: Mapping[str, ResourceInventory]
    problems: tuple[str, ...] = ()


def vgpu_resource(v: Vgpu, domain: str = DEFAULT_DOMAIN) -> str:
    """The resource a vGPU is advertised under; :class:`ResourceNameError` if it has none."""
    name = v.type_sysfs_name or v.type_name
    if not name:
        raise ResourceNameError(f"vGPU {v.key} has no type name, so no resource name")
    return resource_name(name, domain)


def inventory(snapshot: NodeSnapshot, domain: str = DEFAULT_DOMAIN) -> Inventory:
    """Every resource with its devices; a vGPU whose type gives no legal name is a problem."""
    grouped: dict[str, list[Device]] = {}
    problems: list[str] = []
    reported: set[str] = set()
    for gpu in snapshot.gpus:
        numa = gpu.numa_node if gpu.numa_node is not None and gpu.numa_node >= 0 else None
        for v in gpu.vgpus:
            try:
                resource = vgpu_resource(v, domain)
            except ResourceNameError as e:
                if str(e) not in reported:
                    reported.add(str(e))
                    problems.append(f"{e}; its vGPUs are not advertised to the kubelet")
                continue
            grouped.setdefault(resource, []).append(
                Device(
                    id=v.key,
                    kind=v.kind,
                    gpu=gpu.address,
                    numa_node=numa,
                    iommu_group=v.iommu_group,
                    vfio_cdev=v.vfio_cdev,
                    type_id=v.type_id,
                    sysfs_root=snapshot.sysfs_root,
                )
            )
    resources = {
        name: ResourceInventory(name, tuple(sorted(devs, key=lambda d: d.id)))
        for name, devs in sorted(grouped.items())
    }
    return Inventory(resources, tuple(problems))
