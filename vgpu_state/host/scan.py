"""Read one node's NVIDIA GPUs and vGPUs from sysfs into a :class:`NodeSnapshot`.

Only plain file reads, directory listings and ``readlink`` are used, so the
same code reads a real ``/sys``, a container's ``/host/sys``, the simulator's
directory tree and its FUSE mount.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from vgpu_state.catalog import Catalog, short_type_name
from vgpu_state.catalog.mig import mig_capable, mixed_size_capable
from vgpu_state.host.reader import Filesystem, OsFilesystem, Reader
from vgpu_state.model.gpumode import GpuModes
from vgpu_state.model.ids import NVIDIA_VENDOR_ID, UUID_PATTERN
from vgpu_state.model.pci import PciAddress
from vgpu_state.model.snapshot import (
    CreatableType,
    Gpu,
    NodeSnapshot,
    OfferedType,
    SysfsInterface,
    Vgpu,
    VirtualFunction,
)

GPU_CLASSES = (0x0300, 0x0302)
_CREATABLE_LINE = re.compile(r"^\s*([0-9]{1,10})(?![0-9])\s*:?\s*(.+?)\s*$")
_TYPE_DIR = re.compile(r"^nvidia-([0-9]{1,10})$")
"""Type ids have at most 10 digits; a longer number is not a type (and ``int()`` of
thousands of digits raises)."""
_FRAMEBUFFER = re.compile(r"\bframebuffer=([0-9]{1,9})M\b")
_MAX_INSTANCE = re.compile(r"\bmax_instance=([0-9]{1,9})\b")

ModesReader = Callable[[str], tuple[GpuModes | None, str | None]]
"""``read(pf)``: a GPU's modes from ``nvidia-smi`` (or ``None``) and a problem line
(or ``None``); see :func:`vgpu_state.host.nvidia_smi.modes_or_problem`."""
_MAX_VF_ID = 1023


def parse_type_description(text: str) -> tuple[int | None, int | None]:
    """``(framebuffer MiB, max_instance)`` of an mdev type's ``description`` line."""
    fb = _FRAMEBUFFER.search(text)
    most = _MAX_INSTANCE.search(text)
    return (int(fb.group(1)) if fb else None, int(most.group(1)) if most else None)


@dataclass(frozen=True)
class ScanStats:
    """How much a scan read (the benchmark reports it)."""

    files_read: int
    seconds: float


def parse_creatable_vgpu_types(text: str) -> tuple[tuple[int, str], ...]:
    """``(type id, short name)`` pairs of a vendor-VFIO ``creatable_vgpu_types`` file.

    Accepts the driver's ``ID    : vGPU Name`` header with ``<id>  : NVIDIA <name>``
    lines, and ``<id> <name>`` lines without the colon.
    """
    return tuple((i, short_type_name(full)) for i, full in _creatable_lines(text))


def _creatable_lines(text: str) -> tuple[tuple[int, str], ...]:
    """``(type id, name as the driver wrote it)`` of a ``creatable_vgpu_types`` file."""
    found: list[tuple[int, str]] = []
    for line in text.splitlines():
        m = _CREATABLE_LINE.match(line)
        if m is None:
            continue
        found.append((int(m.group(1)), " ".join(m.group(2).split())))
    return tuple(found)


def scan(
    root: str = "/sys",
    node: str = "",
    fs: Filesystem | None = None,
    *,
    catalog: Catalog,
    modes: ModesReader | None = None,
) -> NodeSnapshot:
    """Scan the sysfs tree at ``root``; never raises on an unexpected tree.

    ``fs`` replaces the real file system (the simulator's in-memory tree);
    ``catalog`` names GPU models and types the driver lists only by id.
    ``modes`` (a node with ``nvidia-smi``) reads the MIG and mixed-size mode of
    each GPU whose model may have them, and with it the VFs' ``gpu_instance_id``
    and ``placement_id``; without it :attr:`Gpu.modes` stays ``None``.
    """
    return scan_with_stats(root, node, fs, catalog=catalog, modes=modes)[0]


def scan_gpu(
    root: str,
    node: str,
    address: str,
    fs: Filesystem | None = None,
    *,
    catalog: Catalog,
    modes: ModesReader | None = None,
) -> NodeSnapshot:
    """Scan one GPU (the PF at ``address``) and nothing else; never raises.

    The snapshot holds that GPU (index 0: its place among the node's GPUs is
    known only to a full scan, see :meth:`NodeSnapshot.with_gpu_scan`), or no
    GPU when none is there any more. Its work does not grow with the number of
    GPUs on the node: the executor reads a GPU it just changed this way.
    """
    reader = Reader(fs if fs is not None else OsFilesystem())
    return _Scanner(root, reader, catalog, modes).run_one(node, address)


def scan_with_stats(
    root: str = "/sys",
    node: str = "",
    fs: Filesystem | None = None,
    *,
    catalog: Catalog,
    modes: ModesReader | None = None,
) -> tuple[NodeSnapshot, ScanStats]:
    import time

    started = time.perf_counter()
    reader = Reader(fs if fs is not None else OsFilesystem())
    snapshot = _Scanner(root, reader, catalog, modes).run(node)
    return snapshot, ScanStats(reader.files_read, time.perf_counter() - started)


class _Scanner:
    def __init__(
        self, root: str, reader: Reader, catalog: Catalog, modes: ModesReader | None = None
    ) -> None:
        self.root = root
        self.modes = modes
        self.read = reader
        self.devices = os.path.join(root, "bus", "pci", "devices")
        self.catalog = catalog
        # Free VFs of one GPU list identical types; share the frozen values.
        self._listings: dict[str, tuple[CreatableType, ...]] = {}
        # The driver's full type names (mdev ``name`` files) by type id.
        self._full_names: dict[int, str] = {}
        self._types: dict[tuple[int, str, int, str | None], CreatableType] = {}

    def creatable(
        self, type_id: int, name: str, available: int, sysfs_name: str | None = None
    ) -> CreatableType:
        key = (type_id, name, available, sysfs_name)
        found = self._types.get(key)
        if found is None:
            found = self._types[key] = CreatableType(
                type_id=type_id, name=name, available=available, sysfs_name=sysfs_name
            )
        return found

    def listing(self, text: str) -> tuple[CreatableType, ...]:
        found = self._listings.get(text)
        if found is None:
            pairs = _creatable_lines(text)
            found = self._listings[text] = tuple(
                self.creatable(i, short_type_name(full), 1, full) for i, full in pairs
            )
        return found

    def unreadable(self, node: str) -> NodeSnapshot:
        found = self.read.take_problems()
        why = found[0] if found else f"{self.devices} not found"
        error = f"cannot read the host: {why}: is sysfs mounted at {self.root}?"
        return NodeSnapshot(node=node, sysfs_root=self.root, problems=(*found, error), error=error)

    def is_gpu(self, name: str) -> bool:
        """Is ``devices/name`` an NVIDIA GPU's PF (not a VF, not another device)?"""
        path = os.path.join(self.devices, name)
        if self.read.integer(os.path.join(path, "vendor"), note=False) != NVIDIA_VENDOR_ID:
            return False
        cls = self.read.integer(os.path.join(path, "class"), note=False)
        if cls is None or (cls >> 8) not in GPU_CLASSES:
            return False
        if self.read.fs.lexists(os.path.join(path, "physfn")):
            return False
        if not is_canonical_address(name):
            self.read.problems.append(f"{path}: not a PCI address; this GPU is skipped")
            return False
        return True

    def run(self, node: str) -> NodeSnapshot:
        names = self.read.listdir(self.devices)
        if names is None:
            return self.unreadable(node)
        pfs = [name for name in names if self.is_gpu(name)]
        node_problems = self.read.take_problems()
        pfs.sort(key=lambda a: int(a.replace(":", "").replace(".", ""), 16) if _is_hex(a) else -1)
        gpus = tuple(self._gpu(i, a) for i, a in enumerate(pfs))
        return self.finish(node, gpus, node_problems)

    def run_one(self, node: str, address: str) -> NodeSnapshot:
        if self.is_gpu(address):
            gpus: tuple[Gpu, ...] = (self._gpu(0, address),)
        elif self.read.dead is None and self.read.listdir(self.devices, note=False) is None:
            # Not a missing GPU: no device can be read at all.
            return self.unreadable(node)
        else:
            gpus = ()
        return self.finish(node, gpus, self.read.take_problems())

    def finish(
        self, node: str, gpus: tuple[Gpu, ...], node_problems: tuple[str, ...]
    ) -> NodeSnapshot:
        dead: str | None = None
        if self.read.dead is not None:
            dead = f"cannot read the host: {self.read.dead}"
            node_problems = (*node_problems, dead)
        return NodeSnapshot(
            node=node, sysfs_root=self.root, gpus=gpus, problems=node_problems, error=dead
        )

    # one GPU -------------------------------------------------------------------
    def _gpu(self, index: int, address: str) -> Gpu:
        rd = self.read
        path = os.path.join(self.devices, address)
        device_id = rd.integer(os.path.join(path, "device")) or 0
        sub_vendor = rd.integer(os.path.join(path, "subsystem_vendor")) or 0
        sub_device = rd.integer(os.path.join(path, "subsystem_device")) or 0
        model = self.catalog.model_for_pci(device_id, sub_device)
        driver = rd.link_name(os.path.join(path, "driver"))
        numa = rd.integer(os.path.join(path, "numa_node"))
        group = rd.link_int(os.path.join(path, "iommu_group"))
        totalvfs = rd.integer(os.path.join(path, "sriov_totalvfs"))
        numvfs = rd.integer(os.path.join(path, "sriov_numvfs")) if totalvfs is not None else None

        offered: dict[int, OfferedType] = {}
        pf_types = self._mdev_types(path, None, offered)
        pf_mdevs = self._mdevs(path, address) if pf_types is not None else []

        vf_entries: list[tuple[int, str]] = []
        for entry in rd.listdir(path) or []:
            if entry.startswith("virtfn") and entry[6:].isdigit():
                link = os.path.join(path, entry)
                target = rd.link_name(link)
                if target is not None and not is_canonical_address(target):
                    rd.problems.append(f"{link} -> {target}: not a PCI address; VF skipped")
                elif target is not None:
                    vf_entries.append((int(entry[6:]), target))
        vf_entries.sort()

        vfs: list[VirtualFunction] = []
        vgpus: list[Vgpu] = list(pf_mdevs)
        vf_has_mdev = False
        vf_has_vfio = False
        vfio_current: list[tuple[str, int, int | None, str | None]] = []
        known_names: dict[int, str] = {}
        full_names: dict[int, str] = {}
        for t in pf_types or ():
            known_names[t.type_id] = t.name
        for vf_index, vf_address in vf_entries:
            vf_path = os.path.join(self.devices, vf_address)
            vf_driver = rd.link_name(os.path.join(vf_path, "driver"))
            vf_group = rd.link_int(os.path.join(vf_path, "iommu_group"))
            vf_device = rd.integer(os.path.join(vf_path, "device"))
            creatable: tuple[CreatableType, ...] = ()
            current: int | None = None
            types = self._mdev_types(vf_path, known_names, offered)
            if types is not None:
                vf_has_mdev = True
                creatable = tuple(t for t in types if t.available > 0)
                for t in types:
                    known_names.setdefault(t.type_id, t.name)
                vgpus.extend(self._mdevs(vf_path, vf_address))
            else:
                cur = rd.integer(os.path.join(vf_path, "nvidia", "current_vgpu_type"))
                if cur is not None:
                    vf_has_vfio = True
                    listed = rd.text(os.path.join(vf_path, "nvidia", "creatable_vgpu_types"))
                    creatable = self.listing(listed or "")
                    for t in creatable:
                        known_names.setdefault(t.type_id, t.name)
                        if t.sysfs_name:
                            full_names.setdefault(t.type_id, t.sysfs_name)
                        if t.type_id not in offered:
                            offered[t.type_id] = OfferedType(type_id=t.type_id, name=t.name)
                    if cur != 0:
                        current = cur
                        cdev = self._vfio_cdev(vf_path)
                        vfio_current.append((vf_address, cur, vf_group, cdev))
            vfs.append(
                VirtualFunction(
                    index=vf_index,
                    address=vf_address,
                    driver=vf_driver,
                    iommu_group=vf_group,
                    device_id=vf_device,
                    creatable=creatable,
                    current_type_id=current,
                )
            )
        for vf_address, type_id, vf_group, cdev in vfio_current:
            short = known_names.get(type_id) or self._catalog_name(type_id)
            full = full_names.get(type_id)
            if full is None and short is not None and model is not None:
                # Every VF holds a vGPU, so no listing names the type: the driver
                # names it as it names the others, "<product prefix> <type>".
                full = f"{model.mdev_name_prefix} {short}"
            vgpus.append(
                Vgpu(
                    kind="vf",
                    parent=vf_address,
                    type_id=type_id,
                    type_name=short,
                    type_sysfs_name=full,
                    iommu_group=vf_group,
                    vfio_cdev=cdev,
                )
            )

        layout, reason = self._layout(
            driver=driver,
            sriov_totalvfs=totalvfs,
            sriov_numvfs=numvfs or 0,
            pf_has_mdev=pf_types is not None,
            vf_has_mdev=vf_has_mdev,
            vf_has_vfio=vf_has_vfio,
            vf_count=len(vfs),
        )
        gpu_modes: GpuModes | None = None
        mode_problem: str | None = None
        capable = model is not None and (mig_capable(model) or mixed_size_capable(model))
        if self.modes is not None and capable and driver == "nvidia":
            gpu_modes, mode_problem = self.modes(address)
        if gpu_modes is not None and layout is SysfsInterface.VENDOR_VFIO:
            vgpus = [self._vf_ids(v, bool(gpu_modes.mig)) if v.kind == "vf" else v for v in vgpus]
        problems = list(rd.take_problems())
        if mode_problem:
            problems.append(mode_problem)
        if model is None:
            problems.append(
                f"device 0x{device_id:04x} subsystem 0x{sub_device:04x} is not in the vGPU catalog"
            )
        return Gpu(
            index=index,
            address=address,
            vendor_id=NVIDIA_VENDOR_ID,
            device_id=device_id,
            subsystem_vendor_id=sub_vendor,
            subsystem_device_id=sub_device,
            model=model.name if model else None,
            driver=driver,
            numa_node=numa,
            iommu_group=group,
            sriov_totalvfs=totalvfs,
            sriov_numvfs=numvfs or 0,
            vfs=tuple(vfs),
            layout=layout,
            layout_reason=reason,
            pf_creatable=tuple(t for t in pf_types or () if t.available > 0),
            offered=tuple(offered[i] for i in sorted(offered)),
            offered_complete=bool(offered)
            and (
                layout is SysfsInterface.MDEV
                or (layout is SysfsInterface.VENDOR_VFIO and not vgpus)
            ),
            vgpus=tuple(sorted(vgpus, key=lambda v: (v.parent, v.uuid or ""))),
            problems=tuple(problems),
            modes=gpu_modes,
        )

    def _vf_ids(self, v: Vgpu, mig: bool) -> Vgpu:
        """``v`` with its VF's ``gpu_instance_id`` (MIG mode only) and ``placement_id``
        (unreadable, empty or out of range: ``None``)."""
        base = os.path.join(self.devices, v.parent, "nvidia")

        def read(name: str) -> int | None:
            value = self.read.integer(os.path.join(base, name), note=False)
            return value if value is not None and 0 <= value <= _MAX_VF_ID else None

        gi = read("gpu_instance_id") if mig else None
        return v.model_copy(update={"gpu_instance_id": gi, "placement_id": read("placement_id")})

    @staticmethod
    def _layout(
        *,
        driver: str | None,
        sriov_totalvfs: int | None,
        sriov_numvfs: int,
        pf_has_mdev: bool,
        vf_has_mdev: bool,
        vf_has_vfio: bool,
        vf_count: int,
    ) -> tuple[SysfsInterface, str]:
        if driver != "nvidia":
            bound = f"bound to {driver}" if driver else "not bound to any driver"
            return SysfsInterface.UNAVAILABLE, (
                f"the GPU is {bound}, not to nvidia (the vGPU Manager's host driver)"
            )
        if pf_has_mdev or vf_has_mdev:
            where = "the PF" if pf_has_mdev else "its VFs"
            return SysfsInterface.MDEV, f"mdev types found on {where}"
        if vf_has_vfio:
            return SysfsInterface.VENDOR_VFIO, "VFs expose nvidia/current_vgpu_type"
        if sriov_totalvfs and sriov_numvfs == 0:
            return SysfsInterface.SRIOV_DISABLED, (
                "SR-IOV capable with no VFs enabled (run sriov-manage -e)"
            )
        if sriov_totalvfs and vf_count == 0:
            return SysfsInterface.UNAVAILABLE, (
                f"sriov_numvfs is {sriov_numvfs} but the PF lists no virtfn links"
            )
        if sriov_totalvfs:
            return SysfsInterface.UNAVAILABLE, (
                "VFs are enabled but expose neither mdev types nor nvidia/current_vgpu_type: "
                "is the vGPU Manager (not the data-centre) driver installed?"
            )
        return SysfsInterface.UNAVAILABLE, (
            "no mdev types and no vendor-VFIO interface: is the vGPU Manager driver loaded?"
        )

    # mdev ----------------------------------------------------------------------
    def _mdev_types(
        self,
        device_path: str,
        names: dict[int, str] | None = None,
        offered: dict[int, OfferedType] | None = None,
    ) -> tuple[CreatableType, ...] | None:
        """Every type of a parent with its ``available_instances``; ``None`` if not a parent.

        ``names`` caches type names already read on the same GPU (a type id names
        one type), so each ``name`` file is read once per GPU. ``offered`` collects
        the GPU's supported types with their ``description`` (read once per type).
        """
        types_dir = os.path.join(device_path, "mdev_supported_types")
        entries = self.read.listdir(types_dir)
        if entries is None:
            return None
        found: list[CreatableType] = []
        for entry in entries:
            m = _TYPE_DIR.match(entry)
            if m is None:
                continue
            type_id = int(m.group(1))
            type_path = f"{types_dir}/{entry}"
            available = self.read.integer(f"{type_path}/available_instances")
            name: str | None = names.get(type_id) if names is not None else None
            full = self._full_names.get(type_id)
            if name is None:
                raw_name = self.read.text(f"{type_path}/name")
                name = short_type_name(raw_name) if raw_name else self._catalog_name(type_id)
                if raw_name and raw_name.strip():
                    full = self._full_names[type_id] = " ".join(raw_name.split())
                if name and names is not None:
                    names[type_id] = name
            found.append(self.creatable(type_id, name or entry, available or 0, full))
            if offered is not None and type_id not in offered:
                text = self.read.text(f"{type_path}/description", note=False) or ""
                fb, most = parse_type_description(text)
                offered[type_id] = OfferedType(
                    type_id=type_id, name=name or entry, framebuffer_mib=fb, max_instances=most
                )
        found.sort(key=lambda t: t.type_id)
        return tuple(found)

    def _vfio_cdev(self, device_path: str) -> str | None:
        """``vfio<N>`` under ``vfio-dev/``: the VFIO cdev (iommufd) if the kernel has one."""
        entries = self.read.listdir(os.path.join(device_path, "vfio-dev"), note=False)
        found = sorted(e for e in entries or () if e.startswith("vfio") and e[4:].isdigit())
        return found[0] if found else None

    def _mdevs(self, parent_path: str, parent: str) -> list[Vgpu]:
        found: list[Vgpu] = []
        for entry in self.read.listdir(parent_path) or []:
            if UUID_PATTERN.match(entry) is None:
                continue
            mdev_path = os.path.join(parent_path, entry)
            group = self.read.link_int(os.path.join(mdev_path, "iommu_group"))
            cdev = self._vfio_cdev(mdev_path)
            type_link = os.path.join(mdev_path, "mdev_type")
            try:
                target = self.read.fs.readlink(type_link)
            except OSError:
                self.read.problems.append(f"{type_link} missing: mdev {entry} has no type")
                found.append(
                    Vgpu(
                        kind="mdev",
                        parent=parent,
                        uuid=entry.lower(),
                        iommu_group=group,
                        vfio_cdev=cdev,
                    )
                )
                continue
            m = _TYPE_DIR.match(os.path.basename(target.rstrip("/")))
            type_id = int(m.group(1)) if m else None
            full = self._full_names.get(type_id) if type_id is not None else None
            raw_name = None if full else self.read.text(os.path.join(type_link, "name"), note=False)
            if raw_name and raw_name.strip():
                full = " ".join(raw_name.split())
            if full:
                name: str | None = short_type_name(full)
            else:
                name = self._catalog_name(type_id) if type_id is not None else None
            found.append(
                Vgpu(
                    kind="mdev",
                    parent=parent,
                    uuid=entry.lower(),
                    type_id=type_id,
                    type_name=name,
                    type_sysfs_name=full,
                    iommu_group=group,
                    vfio_cdev=cdev,
                )
            )
        return found

    def _catalog_name(self, type_id: int) -> str | None:
        t = self.catalog.type_by_id(type_id)
        return t.name if t else None


def is_canonical_address(name: str) -> bool:
    """True when ``name`` is a PCI address exactly as sysfs spells it (``0000:3b:00.0``)."""
    try:
        return PciAddress(name) == name
    except ValueError:
        return False


def _is_hex(address: str) -> bool:
    try:
        int(address.replace(":", "").replace(".", ""), 16)
    except ValueError:
        return False
    return True
