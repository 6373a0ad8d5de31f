"""What a scan of one node's sysfs found: frozen, JSON-serialisable, fingerprinted."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from operator import is_
from typing import Any, Literal, TypeVar

from pydantic import Field

from vgpu_state.model.frozen import Frozen
from vgpu_state.model.gpumode import GpuModes
from vgpu_state.model.pci import PciAddress

T = TypeVar("T")


class SysfsInterface(StrEnum):
    """How a GPU's driver exposes vGPUs in sysfs, detected from sysfs only: mdev,
    vendor-specific VFIO, SR-IOV still off, or no vGPU manager at all.

    Not to be confused with a *layout* (the vGPU types a config wants on a GPU).
    Serialised as the ``layout`` field of scans, plans and ``VGPUNodeState``
    status, with these values, so saved plans and status stay readable.
    """

    MDEV = "mdev"
    VENDOR_VFIO = "vendor-vfio"
    SRIOV_DISABLED = "sriov-disabled"
    UNAVAILABLE = "unavailable"


class CreatableType(Frozen):
    """A vGPU type a parent can create now.

    ``available`` is ``available_instances`` (mdev) or 1 for a type listed in a
    free VF's ``creatable_vgpu_types`` (vendor-vfio).
    """

    type_id: int
    name: str
    available: int
    sysfs_name: str | None = None
    """The type's name exactly as the driver shows it (``NVIDIA A2-4Q``), when read."""


class OfferedType(Frozen):
    """A vGPU type the GPU's driver lists, with what the driver says about it.

    mdev: every directory of ``mdev_supported_types`` (``description`` gives
    ``framebuffer`` and ``max_instance``). vendor-VFIO: the union of the VFs'
    ``creatable_vgpu_types`` (names and ids only).
    """

    type_id: int
    name: str
    framebuffer_mib: int | None = None
    max_instances: int | None = None


class Vgpu(Frozen):
    """One existing vGPU: an mdev (by UUID) or a VF with a vGPU type assigned.

    ``type_name`` is the short name (``T4-4Q``). ``iommu_group`` and
    ``vfio_cdev`` (``vfio<N>``, present when the kernel offers VFIO device files
    for iommufd) say which ``/dev/vfio`` nodes a VM using the vGPU needs.
    """

    kind: Literal["mdev", "vf"]
    parent: PciAddress
    """The mdev's parent (PF or VF), or the VF that holds the type."""
    uuid: str | None = None
    type_id: int | None = None
    type_name: str | None = None
    type_sysfs_name: str | None = None
    """The type's name exactly as the driver shows it (``NVIDIA A2-4Q``, ``GRID T4-1Q``);
    Kubernetes resource names and the KubeVirt CR's ``mdevNameSelector`` are made from it."""
    iommu_group: int | None = None
    vfio_cdev: str | None = None
    gpu_instance_id: int | None = Field(default=None, exclude_if=lambda v: v is None)
    """vendor-VFIO: the VF's ``nvidia/gpu_instance_id`` (the MIG GPU instance it landed on)."""
    placement_id: int | None = Field(default=None, exclude_if=lambda v: v is None)
    """vendor-VFIO: the VF's ``nvidia/placement_id`` (where on the GPU the driver put it)."""

    @property
    def key(self) -> str:
        """The identity used in plans and in-use lists: the mdev UUID or the VF address."""
        return self.uuid if self.uuid is not None else self.parent

    @property
    def type_label(self) -> str:
        """The type's short name, or ``type id N`` when the name is not known."""
        return self.type_name or f"type id {self.type_id}"


class VirtualFunction(Frozen):
    index: int
    address: PciAddress
    driver: str | None = None
    iommu_group: int | None = None
    device_id: int | None = None
    """The VF's PCI device id (KubeVirt's ``pciVendorSelector`` is ``10DE:<device id>``)."""
    creatable: tuple[CreatableType, ...] = ()
    current_type_id: int | None = None


class Gpu(Frozen):
    index: int
    address: PciAddress
    vendor_id: int
    device_id: int
    subsystem_vendor_id: int = 0
    subsystem_device_id: int = 0
    model: str | None = None
    driver: str | None = None
    numa_node: int | None = None
    iommu_group: int | None = None
    sriov_totalvfs: int | None = None
    sriov_numvfs: int = 0
    vfs: tuple[VirtualFunction, ...] = ()
    layout: SysfsInterface = SysfsInterface.UNAVAILABLE
    """The GPU's sysfs interface (the field keeps its serialised name ``layout``)."""
    layout_reason: str = ""
    pf_creatable: tuple[CreatableType, ...] = ()
    offered: tuple[OfferedType, ...] = ()
    """The vGPU types the driver lists for this GPU (see :class:`OfferedType`)."""
    offered_complete: bool = False
    """True when ``offered`` is everything the driver supports on this GPU: always for
    mdev (``mdev_supported_types`` lists supported types, available or not); for
    vendor-VFIO only while the GPU holds no vGPU (its lists shrink to what is
    creatable now)."""
    vgpus: tuple[Vgpu, ...] = ()
    problems: tuple[str, ...] = ()
    modes: GpuModes | None = Field(default=None, exclude_if=lambda v: v is None)
    """MIG and mixed-size mode and the GPU instances, read with ``nvidia-smi``; ``None``
    when they were not read (no ``nvidia-smi``, or a model with neither mode)."""

    def with_vgpus(self, vgpus: tuple[Vgpu, ...]) -> Gpu:
        """This GPU with ``vgpus`` (``model_copy(update={"vgpus": vgpus})``, faster)."""
        return _copy_with(self, "vgpus", vgpus)

    @property
    def sriov_capable(self) -> bool:
        return bool(self.sriov_totalvfs)

    def offered_type(self, name: str) -> OfferedType | None:
        for t in self.offered:
            if t.name == name:
                return t
        return None

    def vf(self, address: str) -> VirtualFunction | None:
        for vf in self.vfs:
            if vf.address == address:
                return vf
        return None


class NodeSnapshot(Frozen):
    node: str = ""
    sysfs_root: str = "/sys"
    gpus: tuple[Gpu, ...] = ()
    problems: tuple[str, ...] = ()
    error: str | None = None
    """Set when the host could not be read at all (no sysfs, an empty one, a dead
    mount): then nothing else in the snapshot says anything about the host."""

    def with_gpus(self, gpus: tuple[Gpu, ...]) -> NodeSnapshot:
        """This snapshot with ``gpus`` (``model_copy(update={"gpus": gpus})``, faster)."""
        return _copy_with(self, "gpus", gpus)

    def with_node(self, node: str) -> NodeSnapshot:
        """This snapshot of node ``node`` (``model_copy(update={"node": node})``, faster;
        the fingerprint, which does not depend on the name, is kept)."""
        return _copy_with(self, "node", node)

    def gpu(self, address: str) -> Gpu | None:
        for g in self.gpus:
            if g.address == address:
                return g
        return None

    def only_gpu(self, address: str) -> NodeSnapshot:
        """This snapshot as a scan of the GPU at ``address`` alone would see it."""
        return self.model_copy(update={"gpus": tuple(g for g in self.gpus if g.address == address)})

    def with_gpu_scan(self, address: str, part: NodeSnapshot) -> NodeSnapshot:
        """This snapshot with the GPU at ``address`` replaced by a scan of that GPU alone.

        ``part`` is what a one-GPU scan returned (``HostPort.scan_gpu``): the GPU
        (keeping its index in this snapshot) or nothing when it is gone; its
        ``error`` and problems are carried over (a host that could not be read).
        """
        fresh = part.gpu(address)
        gpus: list[Gpu] = []
        for g in self.gpus:
            if g.address != address:
                gpus.append(g)
            elif fresh is not None:
                gpus.append(fresh.model_copy(update={"index": g.index}))
                fresh = None
        if fresh is not None:
            gpus.append(fresh.model_copy(update={"index": len(gpus)}))
        return self.model_copy(
            update={
                "gpus": tuple(gpus),
                "error": part.error,
                "problems": tuple(dict.fromkeys((*self.problems, *part.problems))),
            }
        )

    def stable_view(self) -> dict[str, Any]:
        """The fields that define the host's vGPU state (no paths, problems or counters)."""
        view: dict[str, Any] = {
            "gpus": [{**_gpu_view(g), "vgpus": _vgpus_view(g)} for g in self.gpus]
        }
        modes = _modes_view(self.gpus)
        if modes:
            view["modes"] = modes
        return view

    def fingerprint(self) -> str:
        """sha256 of :meth:`stable_view`; equal for equal host state.

        Computed once per snapshot: the value is kept with the ``gpus`` it was
        computed from (the only field it depends on; tuples of frozen models), so
        a copy with other ``gpus`` (``model_copy(update=...)``) computes its own.
        """
        kept = self.__dict__.get("_fingerprint")
        if kept is not None and kept[0] is self.gpus:
            return str(kept[1])
        # json.dumps(self.stable_view(), sort_keys=True, separators=(",", ":")), a GPU at a
        # time (_gpu_text): "vgpus" is the last key, the text before it is the same on
        # every node with that GPU (its VFs are one shared tuple when decoded by
        # SnapshotDecoder: see SharedParts), and a GPU shared whole keeps its text.
        blob = '{"gpus":[' + ",".join(_gpu_text(g) for g in self.gpus) + "]"
        modes = _modes_view(self.gpus)
        if modes:
            # The GPUs' modes as nvidia-smi read them, where it did (a change of MIG mode,
            # GPU instances or mixed-size mode is a change of the host).
            blob += ',"modes":' + json.dumps(modes, sort_keys=True, separators=(",", ":"))
        blob += "}"
        value = "sha256:" + hashlib.sha256(blob.encode()).hexdigest()
        # Not a field: equality, hashing and serialisation ignore it.
        self.__dict__["_fingerprint"] = (self.gpus, value)
        return value


M = TypeVar("M", bound=Frozen)


def _copy_with(model: M, name: str, value: Any) -> M:
    """``model.model_copy(update={name: value})`` for a frozen model without extra fields
    or private attributes: the same fields, fields set and (for a :class:`NodeSnapshot`)
    kept fingerprint, without pydantic's general copy. ``value`` is not validated (nor is
    it by ``model_copy``): the typed callers pass valid values only."""
    copied = model.__class__.__new__(model.__class__)
    fields = model.__dict__.copy()
    fields[name] = value
    object.__setattr__(copied, "__dict__", fields)
    object.__setattr__(copied, "__pydantic_extra__", None)
    object.__setattr__(copied, "__pydantic_fields_set__", model.__pydantic_fields_set__ | {name})
    object.__setattr__(copied, "__pydantic_private__", None)
    return copied


def _gpu_view(g: Gpu) -> dict[str, Any]:
    """A GPU's part of :meth:`NodeSnapshot.stable_view` but its vGPUs."""
    return {
        "address": g.address,
        "device_id": g.device_id,
        "subsystem_device_id": g.subsystem_device_id,
        "driver": g.driver,
        "layout": g.layout.value,
        "sriov_numvfs": g.sriov_numvfs,
        "vfs": [vf.address for vf in g.vfs],
    }


def _modes_view(gpus: tuple[Gpu, ...]) -> dict[str, list[Any]]:
    """The modes of the GPUs whose modes were read, by address: MIG mode, mixed-size mode
    and the GPU instances (id, profile)."""
    return {
        g.address: [
            g.modes.mig,
            g.modes.heterogeneous,
            sorted([gi.id, gi.profile] for gi in g.modes.gpu_instances),
        ]
        for g in gpus
        if g.modes is not None
    }


def _vgpus_view(g: Gpu) -> list[list[Any]]:
    return sorted(
        [v.kind, v.parent, v.uuid or "", v.type_id or 0, v.type_name or ""] for v in g.vgpus
    )


_COMPACT = json.JSONEncoder(separators=(",", ":"))
"""``json.dumps(value, separators=(",", ":"))`` as ``_COMPACT.encode(value)``: the same
encoder, made once instead of on every call."""


def _vgpus_view_text(g: Gpu) -> str:
    """``json.dumps(_vgpus_view(g), separators=(",", ":"))``."""
    return _COMPACT.encode(_vgpus_view(g))


class SharedParts:
    """Values computed from parts of scans that a ``SnapshotDecoder`` shares between the
    nodes of one hardware model (a GPU's VFs, its type lists), remembered by those
    parts' identity: each value is kept with the parts it was computed from (so their
    ids cannot name other objects while it is here), at most :attr:`LIMIT` of them.

    Off unless :meth:`remembering` is active (``fleet plan`` while it plans a page): a
    long-running agent scans anew every time, and would only hold old scans alive.
    """

    LIMIT = 512
    _kept: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] | None = None

    @classmethod
    @contextmanager
    def remembering(cls) -> Iterator[None]:
        outer = cls._kept is not None
        if not outer:
            cls._kept = {}
        try:
            yield
        finally:
            if not outer:
                cls._kept = None

    @classmethod
    def get(cls, parts: tuple[Any, ...], key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        """``compute()``, remembered by ``key`` and the identity of each of ``parts``."""
        kept = cls._kept
        if kept is None:
            return compute()
        full = (*key, *map(id, parts))
        found = kept.get(full)
        if found is not None and len(found[0]) == len(parts) and all(map(is_, found[0], parts)):
            value: T = found[1]
            return value
        value = compute()
        if len(kept) >= cls.LIMIT:
            kept.clear()
        kept[full] = (parts, value)
        return value


def _gpu_text(g: Gpu) -> str:
    """``g``'s part of the JSON text of :meth:`NodeSnapshot.stable_view`, kept with the GPU
    (a ``SnapshotDecoder`` gives the nodes whose GPUs are the same text the same
    :class:`Gpu`) together with the fields it was computed from, as the fingerprint is."""
    key = (g.address, g.device_id, g.subsystem_device_id, g.driver, g.layout, g.sriov_numvfs)
    kept = g.__dict__.get("_view_text")
    if kept is not None and kept[0] is g.vfs and kept[1] is g.vgpus and kept[2] == key:
        return str(kept[3])
    text = f'{_gpu_view_text(g)},"vgpus":{_vgpus_view_text(g)}}}'
    # Not a field: equality, hashing and serialisation ignore it.
    g.__dict__["_view_text"] = (g.vfs, g.vgpus, key, text)
    return text


def _gpu_view_text(g: Gpu) -> str:
    """``json.dumps(_gpu_view(g), sort_keys=True)`` without its closing brace."""
    key = (g.address, g.device_id, g.subsystem_device_id, g.driver, g.layout, g.sriov_numvfs)
    return SharedParts.get(
        (g.vfs,),
        ("view", *key),
        lambda: json.dumps(_gpu_view(g), sort_keys=True, separators=(",", ":"))[:-1],
    )


def scan_problem(node: str, snapshot: NodeSnapshot) -> str | None:
    """Why a scan reported for ``node`` cannot be that node's own scan, or ``None``.

    A scan names the node it was made on, and a host has each PCI address once
    (GPUs and their VFs): a report that copies another node's scan, or repeats
    GPUs, is not believed.
    """
    if snapshot.node and snapshot.node != node:
        return f"its scan is of node {snapshot.node!r}, not {node!r}"
    gpus = snapshot.gpus
    # Worked out once per set of GPU addresses and VF lists (shared by the nodes of one
    # hardware model: see SharedParts).
    return SharedParts.get(
        tuple(g.vfs for g in gpus),
        ("repeated addresses", *(g.address for g in gpus)),
        lambda: _repeated_addresses(gpus),
    )


def _repeated_addresses(gpus: tuple[Gpu, ...]) -> str | None:
    """What :func:`scan_problem` says of GPUs that repeat PCI addresses, or ``None``."""
    addresses = [a for gpu in gpus for a in (gpu.address, *(vf.address for vf in gpu.vfs))]
    if len(set(addresses)) == len(addresses):
        return None
    seen: set[str] = set()
    repeated: list[str] = []
    for gpu in gpus:
        for address in (gpu.address, *(vf.address for vf in gpu.vfs)):
            if str(address) in seen and str(address) not in repeated:
                repeated.append(str(address))
            seen.add(str(address))
    if repeated:
        more = f" and {len(repeated) - 3} more" if len(repeated) > 3 else ""
        return (
            f"its scan repeats PCI addresses ({', '.join(sorted(repeated)[:3])}{more}); "
            "a host has each address once"
        )
    return None
