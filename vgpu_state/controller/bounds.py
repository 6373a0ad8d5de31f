"""What the admin's layouts document lets the KubeVirt CR permit (pure).

A node's report can only *confirm* that a resource the layouts document can
produce exists on it; it can never add a resource, pick a resource's kind or
choose its selector. :class:`LayoutBounds` holds what the document and the
catalog allow, and :meth:`LayoutBounds.check` says why one reported vGPU is
outside them:

* its type is one the document names (in any layout: the set is finite, the
  admin's, and no report adds to it);
* the catalog's model of the GPU (told by its PCI ids, the ones the selector is
  made of) offers the type; a type the catalog does not know at all (a newer
  driver's) must carry that model's product part;
* the kind agrees with the GPU's reported sysfs interface and the catalog: an
  mdev only on an mdev-layout GPU, a VF-backed vGPU only on a vendor-VFIO GPU
  whose model has SR-IOV;
* the name carries the product prefix the catalog gives the model (``NVIDIA``,
  ``GRID`` for the Tesla T4 and V100 families), so the resource name is the
  catalog's, not the node's spelling;
* a VF's device id is the GPU's own (the id the catalog lists for the model;
  NVIDIA's VFs carry their PF's device id), so ``pciVendorSelector`` is
  derived from the catalog.

So the CR can hold at most one entry per type the document names and product
prefix, whatever the number or size of the reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from vgpu_state.catalog import Catalog, GpuModel, parse_type_name, short_type_name
from vgpu_state.config import ConfigDocument, canonical_type_name
from vgpu_state.model.resources import DEFAULT_DOMAIN, ResourceNameError, resource_name
from vgpu_state.model.snapshot import Gpu, SysfsInterface

PREFIXES = ("NVIDIA", "GRID")
"""The product prefixes NVIDIA's drivers put before a type name; a GPU the catalog does not
know may carry either."""


@dataclass(frozen=True)
class LayoutBounds:
    """The vGPU types a layouts document names, checked against the catalog."""

    names: frozenset[str]
    """Canonical short names (``A2-4Q``) of every type some layout of the document names."""
    catalog: Catalog = field(compare=False, hash=False)
    source: str = field(default="", compare=False)
    """Where the document came from (its file), for messages."""

    @classmethod
    def of(cls, document: ConfigDocument, catalog: Catalog) -> LayoutBounds:
        names = {
            canonical_type_name(name, catalog)
            for config in document.configs.values()
            for entry in config.entries
            for name in entry.vgpu_devices
        }
        return cls(frozenset(n for n in names if n), catalog, document.file)

    def model(self, gpu: Gpu) -> GpuModel | None:
        """The catalog's model of ``gpu`` by its PCI ids (the reported model name only
        where it names a model with that device id)."""
        cat = self.catalog
        found = cat.model_for_pci(gpu.device_id, gpu.subsystem_device_id)
        if found is None and gpu.model:
            named = cat.model(gpu.model) or cat.find_model(gpu.model)
            if named is not None and gpu.device_id in named.device_ids:
                found = named
        return found

    def check(
        self,
        gpu: Gpu,
        model: GpuModel | None,
        kind: Literal["mdev", "vf"],
        name: str,
        vf_device: int | None = None,
    ) -> str | None:
        """Why a vGPU of driver name ``name`` and ``kind`` on ``gpu`` cannot be permitted
        (``None``: it can). ``vf_device``: the device id of its VF (VF-backed only)."""
        short = short_type_name(name)
        where = self.source or "the layouts document"
        if short not in self.names:
            return f"type {short!r} is not one {where} names"
        label = self.catalog.label(model) if model is not None else None
        if self.catalog.knows(short):
            if model is None:
                return (
                    f"the catalog knows type {short!r} but not the GPU "
                    f"(device {gpu.device_id:04x}, subsystem {gpu.subsystem_device_id:04x})"
                )
            if not model.offers(short):
                return f"type {short!r} is not a type of the {label} (catalog)"
        elif model is not None:
            parsed = parse_type_name(short)
            if parsed is None or parsed.product not in model.products:
                return f"type {short!r} is not a type of the {label} (its product differs)"
        prefixes = (model.mdev_name_prefix,) if model is not None else PREFIXES
        if name not in {f"{p} {short}" for p in prefixes}:
            return (
                f"the driver name {name!r} is not {' or '.join(f'{p} {short}' for p in prefixes)!r}"
                + (f" (the {label}'s, catalog)" if label else "")
            )
        if kind == "mdev":
            if gpu.layout != SysfsInterface.MDEV:
                return f"an mdev on a GPU whose sysfs interface is {gpu.layout.value}"
            return None
        if gpu.layout != SysfsInterface.VENDOR_VFIO:
            return f"a VF-backed vGPU on a GPU whose sysfs interface is {gpu.layout.value}"
        if model is None or not model.sriov_capable:
            what = f"the {label}" if label else "a GPU the catalog does not know"
            return f"a VF-backed vGPU on {what}, which has no SR-IOV (catalog)"
        if vf_device is not None and vf_device != gpu.device_id:
            return (
                f"its VF's device id {vf_device:04x} is not the GPU's {gpu.device_id:04x} "
                f"(the {label}'s, catalog)"
            )
        return None

    def resources(self, domain: str = DEFAULT_DOMAIN) -> frozenset[str]:
        """Every resource name the document can produce: the most the CR can hold."""
        found: set[str] = set()
        prefixes = set(PREFIXES) | {m.mdev_name_prefix for m in self.catalog.models}
        for short in self.names:
            for prefix in prefixes:
                try:
                    found.add(resource_name(f"{prefix} {short}", domain))
                except ResourceNameError:
                    continue
        return frozenset(found)


@dataclass(frozen=True)
class Summary:
    """A bounded account of many items: how many, and the first few of them."""

    count: int = 0
    first: tuple[str, ...] = ()

    LIMIT = 5
    """Items kept."""
    WIDTH = 240
    """Characters kept of each (a reported name can be as long as a status allows)."""

    def __bool__(self) -> bool:
        return self.count > 0

    def __str__(self) -> str:
        more = self.count - len(self.first)
        return "; ".join(self.first) + (f"; and {more} more" if more > 0 else "")


NOTHING = Summary()
"""No item."""
