"""ResourceSlices for a node's vGPUs: a pure function of a :class:`NodeSnapshot`.

Every existing vGPU chosen for Dynamic Resource Allocation becomes one device of
the node's pool (pool name = node name): ``mdev-<uuid>`` for an mediated
device, ``vf-<domain>-<bus>-<device>-<function>`` for a VF that carries a vGPU
type. KubeVirt reads ``mdevUUID`` (unprefixed) for an mdev and
``resource.kubernetes.io/pciBusID`` for a VF; the other attributes let a
DeviceClass or claim select by type, series, framebuffer, parent GPU and NUMA
node. One slice per physical GPU (split further past the API's per-slice
device limit); the publisher adds the pool generation and slice count.

The API's limits are checked here, so nothing invalid reaches the API server:
device names are DNS labels, at most 32 attributes and capacities per device,
string values at most 64 characters (a longer value is left out and reported).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu_state.catalog import Catalog, VgpuType
from vgpu_state.dra.names import (
    DOMAIN,
    DRIVER,
    MDEV_UUID,
    NUMA_NODE,
    PCI_BUS_ID,
    device_key,
    device_name,
    is_dns_label,
)
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, Vgpu

__all__ = [
    "DOMAIN",
    "DRIVER",
    "MDEV_UUID",
    "NUMA_NODE",
    "PCI_BUS_ID",
    "DraDevice",
    "PoolSpec",
    "SliceSpec",
    "build_pool",
    "device_key",
    "device_name",
    "is_dns_label",
]

MAX_DEVICES_PER_SLICE = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING = 64
MAX_SLICE_NAME = 253

_DNS_SUBDOMAIN_PART = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")

AttributeValue = str | int | bool


def qualified_name_problem(name: str) -> str | None:
    """Why ``name`` is not a DRA attribute or capacity name, or ``None``."""
    prefix, _, local = name.rpartition("/")
    if not _C_IDENTIFIER.match(local):
        return f"{local!r} is not a C identifier of at most 32 characters"
    if prefix and (
        len(prefix) > 63 or not all(_DNS_SUBDOMAIN_PART.match(p) for p in prefix.split("."))
    ):
        return f"prefix {prefix!r} is not a DNS subdomain of at most 63 characters"
    return None


@dataclass(frozen=True)
class DraDevice:
    """One published device: its name, the vGPU behind it, attributes and capacity."""

    name: str
    gpu: str
    kind: str
    key: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, str] = field(default_factory=dict)

    def api_attributes(self) -> dict[str, dict[str, Any]]:
        """Attributes in the API's encoding (``{"string": …}``, ``{"int": …}``, ``{"bool": …}``)."""
        out: dict[str, dict[str, Any]] = {}
        for k, v in self.attributes.items():
            if isinstance(v, bool):
                out[k] = {"bool": v}
            elif isinstance(v, int):
                out[k] = {"int": v}
            else:
                out[k] = {"string": v}
        return out

    def api(self) -> dict[str, Any]:
        """The device as it appears in ``spec.devices[]`` of a v1 / v1beta2 ResourceSlice."""
        found: dict[str, Any] = {"name": self.name, "attributes": self.api_attributes()}
        if self.capacity:
            found["capacity"] = {k: {"value": v} for k, v in self.capacity.items()}
        return found


@dataclass(frozen=True)
class SliceSpec:
    """One ResourceSlice of the pool, without the pool generation and count."""

    name: str
    gpu: str
    devices: tuple[DraDevice, ...]


@dataclass(frozen=True)
class PoolSpec:
    """Every slice of a node's pool, plus what could not be published as asked."""

    driver: str
    node: str
    slices: tuple[SliceSpec, ...]
    problems: tuple[str, ...] = ()

    @property
    def devices(self) -> dict[str, DraDevice]:
        return {d.name: d for s in self.slices for d in s.devices}

    def manifests(self, generation: int, api_version: str) -> list[dict[str, Any]]:
        """The ResourceSlice objects (``resource.k8s.io/<api_version>``) at ``generation``."""
        return [
            {
                "apiVersion": f"resource.k8s.io/{api_version}",
                "kind": "ResourceSlice",
                "metadata": {"name": s.name},
                "spec": {
                    "driver": self.driver,
                    "nodeName": self.node,
                    "pool": {
                        "name": self.node,
                        "generation": generation,
                        "resourceSliceCount": len(self.slices),
                    },
                    "devices": [d.api() for d in s.devices],
                },
            }
            for s in self.slices
        ]


def _quantity(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def _type_info(catalog: Catalog, g: Gpu, name: str | None) -> VgpuType | None:
    if name is None:
        return None
    model = catalog.model(g.model) if g.model else None
    found = model.type(name) if model else None
    return found or catalog.type(name)


def _device(g: Gpu, v: Vgpu, catalog: Catalog, problems: list[str]) -> DraDevice:
    name = device_name(v)
    attrs: dict[str, AttributeValue] = {"type": "vgpu", "mode": v.kind}
    if v.kind == "mdev" and v.uuid is not None:
        attrs[MDEV_UUID] = v.uuid
        attrs["mdevParentPciBusID"] = v.parent
    else:
        attrs[PCI_BUS_ID] = v.parent
    if v.type_name:
        attrs["vgpuType"] = v.type_name
    if v.type_id is not None:
        attrs["vgpuTypeId"] = v.type_id
    info = _type_info(catalog, g, v.type_name)
    capacity: dict[str, str] = {}
    if info is not None:
        attrs["series"] = info.series
        attrs["framebufferMiB"] = info.framebuffer_mib
        capacity["framebuffer"] = _quantity(info.framebuffer_mib)
    if v.gpu_instance_id is not None:
        attrs["gpuInstanceID"] = v.gpu_instance_id
    if v.placement_id is not None:
        attrs["placementID"] = v.placement_id
    attrs["parentPciBusID"] = g.address
    if g.model:
        attrs["productName"] = g.model
    if g.numa_node is not None and g.numa_node >= 0:
        attrs[NUMA_NODE] = g.numa_node
    for key in list(attrs):
        value = attrs[key]
        problem = qualified_name_problem(key)
        if problem is None and isinstance(value, str) and len(value) > MAX_STRING:
            problem = f"value {value!r} is longer than {MAX_STRING} characters"
        if problem is not None:
            problems.append(f"device {name}: attribute {key} left out: {problem}")
            del attrs[key]
    assert len(attrs) + len(capacity) <= MAX_ATTRIBUTES_AND_CAPACITIES
    return DraDevice(
        name=name, gpu=g.address, kind=v.kind, key=v.key, attributes=attrs, capacity=capacity
    )


def slice_name(node: str, gpu: str, part: int) -> str:
    """``<node>-vgpu-<gpu address as a label>[-<part>]``, shortened to the API's limit."""
    base = f"{node}-vgpu-" + gpu.replace(":", "-").replace(".", "-")
    suffix = f"-{part}" if part else ""
    return base[: MAX_SLICE_NAME - len(suffix)].rstrip("-.") + suffix


def _chunks(items: list[DraDevice], size: int) -> Iterable[list[DraDevice]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def build_pool(
    snapshot: NodeSnapshot,
    *,
    node: str | None = None,
    driver: str = DRIVER,
    selected: Callable[[Gpu, Vgpu], bool] = lambda g, v: True,
    catalog: Catalog,
) -> PoolSpec:
    """The pool of ``node`` (default: the snapshot's node) for the vGPUs ``selected`` allows."""
    cat = catalog
    node_name = node or snapshot.node
    if not node_name:
        raise ValueError("a ResourceSlice pool needs a node name; the snapshot has none")
    problems: list[str] = []
    slices: list[SliceSpec] = []
    for g in sorted(snapshot.gpus, key=lambda g: g.address):
        devices = [
            _device(g, v, cat, problems)
            for v in sorted(g.vgpus, key=lambda v: device_name(v))
            if selected(g, v)
        ]
        for part, chunk in enumerate(_chunks(devices, MAX_DEVICES_PER_SLICE)):
            slices.append(
                SliceSpec(
                    name=slice_name(node_name, g.address, part), gpu=g.address, devices=tuple(chunk)
                )
            )
    for s in slices:
        for d in s.devices:
            if not is_dns_label(d.name):
                raise ValueError(f"device name {d.name!r} is not a DNS label")
    return PoolSpec(driver=driver, node=node_name, slices=tuple(slices), problems=tuple(problems))
