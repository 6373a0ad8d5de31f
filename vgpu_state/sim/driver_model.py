"""The simulated NVIDIA vGPU driver: a pure state machine of one node (no I/O).

Every operation takes the bytes a process wrote and either changes the state or
raises ``OSError`` with the errno the real driver returns
(``reference/nvidia-sysfs.md`` §2.3, §3.3, §4.2, §5, §6).
"""

from __future__ import annotations

import errno
import fnmatch
import uuid as uuid_mod
from dataclasses import dataclass, field
from functools import lru_cache

from vgpu_state.catalog import GpuModel, VgpuType, default_catalog, parse_type_name
from vgpu_state.model.ids import UUID_PATTERN
from vgpu_state.model.pci import vf_address
from vgpu_state.sim.spec import (
    DriverSpec,
    FaultSpec,
    GpuSpec,
    NodeSpec,
    SpecError,
    VgpuSpec,
    errno_value,
)

SRIOV_OFFSET = 4
SRIOV_STRIDE = 1
_UUID = UUID_PATTERN
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
            t
            for t in (*self.model.types, *self.extra_types)
            if not t.is_mig and t.series in series
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
        if self.vgpus:
            size = self.vgpus[0].type.framebuffer_mib
            if t.framebuffer_mib != size:
                return 0
            left = max(0, t.max_instances - len(self.vgpus))
        else:
            left = t.max_instances
        if self.sriov_capable:
            left = min(left, self.free_vfs())
        return left

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

    def mdev_parent_vfs(self) -> bool:
        return self.layout == "mdev" and self.sriov_capable and self.driver == "nvidia"


@dataclass
class FaultState:
    spec: FaultSpec
    seen: int = 0
    fired: bool = False


@dataclass(frozen=True)
class FaultEffect:
    delay_seconds: float = 0.0
    errno: int | None = None


class SimDriver:
    """All GPUs of one simulated node and the driver's reactions to writes."""

    def __init__(self, spec: NodeSpec) -> None:
        self.node = spec.node
        self.labels = dict(spec.labels)
        self.driver_spec: DriverSpec = spec.driver
        self.sriov_manage_installed = spec.sriov_manage
        self.extra_pci_devices = spec.extra_pci_devices
        self.create_unavailable_errno = errno_value(spec.driver.create_unavailable_errno)
        self.faults = [FaultState(f) for f in spec.faults]
        self.gpus: list[SimGpu] = []
        self.sriov_manage_output = ""
        catalog = default_catalog()
        extras = _extra_types(spec.driver)
        seen: set[str] = set()
        for i, g in enumerate(sorted(spec.gpus, key=lambda g: g.address)):
            model = catalog.find_model(g.model)
            if model is None:
                hint = _suggest_model(g.model)
                raise SpecError(f"gpus[{i}].model: unknown GPU model {g.model!r}{hint}")
            if g.address in seen:
                raise SpecError(f"gpus[{i}].address: {g.address} is listed twice")
            seen.add(g.address)
            if g.layout == "vendor-vfio" and not model.sriov_capable:
                raise SpecError(
                    f"gpus[{i}]: {model.name} has no SR-IOV; vendor-vfio needs VFs (use mdev)"
                )
            numvfs = model.sriov_totalvfs if (g.sriov and model.sriov_capable) else 0
            self.gpus.append(
                SimGpu(
                    index=i,
                    address=g.address,
                    model=model,
                    model_text=g.model,
                    layout=g.layout,
                    driver=g.driver,
                    numvfs=numvfs,
                    numa_node=g.numa_node,
                    iommu_group=g.iommu_group if g.iommu_group is not None else 16 + i,
                    vf_iommu_group_base=(
                        g.vf_iommu_group_base if g.vf_iommu_group_base is not None else 100 + 64 * i
                    ),
                    flavour=spec.driver.flavour,
                    spec_iommu_group=g.iommu_group,
                    spec_vf_iommu_group_base=g.vf_iommu_group_base,
                    extra_types=extras.get(model.name, ()),
                )
            )
        self.next_iommu_group = 1 + max(
            [g.iommu_group for g in self.gpus]
            + [g.vf_iommu_group_base + max(g.totalvfs, 1) - 1 for g in self.gpus]
            + [0]
        )
        by_address = {g.address: g for g in self.gpus}
        for i, g in enumerate(spec.gpus):
            for j, v in enumerate(g.vgpus):
                self._load_vgpu(by_address[g.address], v, f"gpus[{i}].vgpus[{j}]")

    # loading -------------------------------------------------------------------
    def _load_vgpu(self, gpu: SimGpu, v: VgpuSpec, where: str) -> None:
        t = gpu.type_named(v.type)
        if t is None:
            raise SpecError(f"{where}.type: {gpu.model.name} has no vGPU type {v.type!r}")
        if gpu.type_by_id(t.type_id) is None:
            raise SpecError(
                f"{where}.type: {t.name} is not offered by the {gpu.flavour!r} driver flavour"
            )
        vf = v.vf
        if gpu.sriov_capable:
            if gpu.numvfs == 0:
                raise SpecError(
                    f"{where}: {gpu.address} has SR-IOV disabled; no VF can hold {t.name}"
                )
            if vf is None:
                vf = next(
                    i for i in range(gpu.numvfs + 1) if i == gpu.numvfs or gpu.vgpu_on_vf(i) is None
                )
            if not 0 <= vf < gpu.numvfs:
                raise SpecError(f"{where}.vf: VF {vf} does not exist (0…{gpu.numvfs - 1})")
        elif vf is not None:
            raise SpecError(f"{where}.vf: {gpu.model.name} has no VFs; vGPUs sit on the PF")
        try:
            if gpu.layout == "mdev":
                uid = v.uuid or str(
                    uuid_mod.uuid5(
                        uuid_mod.NAMESPACE_URL,
                        f"vgpu-state-sim/{self.node}/{gpu.address}/{len(gpu.vgpus)}",
                    )
                )
                parent = gpu.address if vf is None else gpu.vf_addresses()[vf]
                self.mdev_create(parent, t.type_id, uid.encode())
            else:
                assert vf is not None
                self.vf_type_write(gpu.vf_addresses()[vf], str(t.type_id).encode())
        except OSError as e:
            reason = "already used" if e.errno == errno.EEXIST else "not creatable there"
            raise SpecError(
                f"{where}: {t.name} on {gpu.address}"
                f"{'' if vf is None else f' VF {vf}'} is {reason} "
                f"({errno.errorcode.get(e.errno or 0, '?')}; vGPUs on one GPU must share one "
                "framebuffer size and fit its max instances)"
            ) from e
        gpu.vgpus[-1].in_use = v.in_use

    def to_spec(self) -> NodeSpec:
        """The current state as a spec that loads back into an equal driver."""
        gpus = []
        for g in self.gpus:
            gpus.append(
                GpuSpec(
                    address=g.address,
                    model=g.model_text,
                    layout=g.layout,
                    sriov=g.numvfs > 0 or not g.sriov_capable,
                    driver=g.driver,
                    numa_node=g.numa_node,
                    iommu_group=g.spec_iommu_group,
                    vf_iommu_group_base=g.spec_vf_iommu_group_base,
                    vgpus=tuple(
                        VgpuSpec(type=v.type.name, uuid=v.uuid, vf=v.vf, in_use=v.in_use)
                        for v in g.vgpus
                    ),
                )
            )
        faults = []
        for f in self.faults:
            if f.fired:
                continue
            if f.spec.nth is not None:
                faults.append(f.spec.model_copy(update={"nth": f.spec.nth - f.seen}))
            else:
                faults.append(f.spec)
        return NodeSpec(
            node=self.node,
            labels=self.labels,
            driver=self.driver_spec,
            sriov_manage=self.sriov_manage_installed,
            gpus=tuple(gpus),
            faults=tuple(faults),
            extra_pci_devices=self.extra_pci_devices,
        )

    # lookups -------------------------------------------------------------------
    def gpu(self, address: str) -> SimGpu | None:
        for g in self.gpus:
            if g.address == address:
                return g
        return None

    def parent(self, address: str) -> tuple[SimGpu, int | None] | None:
        """The GPU and VF index (``None`` for the PF) of a PCI function."""
        for g in self.gpus:
            if g.address == address:
                return g, None
            i = g.vf_index(address)
            if i is not None:
                return g, i
        return None

    def mdev(self, uuid: str) -> tuple[SimGpu, SimVgpu] | None:
        for g in self.gpus:
            for v in g.vgpus:
                if v.uuid == uuid:
                    return g, v
        return None

    def _new_group(self) -> int:
        group = self.next_iommu_group
        self.next_iommu_group += 1
        return group

    # faults --------------------------------------------------------------------
    def fault_for(self, op: str, path: str) -> FaultEffect:
        """Count a write of kind ``op`` to ``path`` against the configured faults."""
        delay = 0.0
        code: int | None = None
        for f in self.faults:
            s = f.spec
            if f.fired or (s.op != "any" and s.op != op):
                continue
            if s.path is not None and not fnmatch.fnmatch(path.lstrip("/"), s.path.lstrip("/")):
                continue
            f.seen += 1
            hit = s.nth is None or f.seen == s.nth
            if not hit:
                continue
            delay += s.delay_ms / 1000.0
            if s.errno is not None and code is None:
                code = errno_value(s.errno)
            if s.nth is not None:
                f.fired = True
        return FaultEffect(delay, code)

    # mdev ----------------------------------------------------------------------
    def mdev_create(self, parent: str, type_id: int, data: bytes) -> None:
        if not 36 <= len(data) <= 37:
            raise fail(errno.EINVAL, "UUID must be 36 characters")
        text = data[:36].decode("ascii", "replace")
        if _UUID.match(text) is None:
            raise fail(errno.EINVAL, "malformed UUID")
        uid = text.lower()
        if self.mdev(uid) is not None:
            raise fail(errno.EEXIST)
        found = self.parent(parent)
        if found is None:
            raise fail(errno.ENODEV)
        gpu, vf = found
        t = gpu.type_by_id(type_id)
        if t is None or gpu.available(vf, t) < 1:
            raise fail(self.create_unavailable_errno, "vGPU type not available")
        gpu.vgpus.append(SimVgpu(type=t, uuid=uid, vf=vf, iommu_group=self._new_group()))

    def mdev_remove(self, uuid: str, data: bytes) -> None:
        try:
            value = int(data.decode("ascii").strip(), 0)
        except (UnicodeDecodeError, ValueError) as e:
            raise fail(errno.EINVAL) from e
        if value == 0:
            return
        found = self.mdev(uuid)
        if found is None:
            raise fail(errno.ENODEV)
        gpu, v = found
        if v.in_use:
            raise fail(errno.EBUSY, f"in use by {v.in_use}")
        gpu.vgpus.remove(v)

    # vendor-specific VFIO --------------------------------------------------------
    def vf_type_write(self, vf_addr: str, data: bytes) -> None:
        try:
            type_id = int(data.decode("ascii").strip(), 10)
        except (UnicodeDecodeError, ValueError) as e:
            raise fail(errno.EINVAL) from e
        found = self.parent(vf_addr)
        if found is None:
            raise fail(errno.ENODEV)
        gpu, vf = found
        if vf is None:
            raise fail(errno.ENODEV)
        current = gpu.vgpu_on_vf(vf)
        if type_id == 0:
            if current is None:
                return
            if current.in_use:
                raise fail(errno.EBUSY, f"in use by {current.in_use}")
            gpu.vgpus.remove(current)
            return
        if current is not None:
            raise fail(errno.EBUSY, "the VF already has a vGPU type")
        t = gpu.type_by_id(type_id)
        if t is None or t not in gpu.creatable_on_vf(vf):
            raise fail(errno.EIO, "vGPU type not creatable on this VF")
        gpu.vgpus.append(SimVgpu(type=t, uuid=None, vf=vf, iommu_group=self._new_group()))

    # SR-IOV ----------------------------------------------------------------------
    def sriov_numvfs_write(self, pf: str, data: bytes) -> None:
        gpu = self.gpu(pf)
        if gpu is None or not gpu.sriov_capable:
            raise fail(errno.ENODEV)
        try:
            value = int(data.decode("ascii").strip(), 0)
        except (UnicodeDecodeError, ValueError) as e:
            raise fail(errno.EINVAL) from e
        if not 0 <= value <= 0xFFFF:
            raise fail(errno.ERANGE if value > 0 else errno.EINVAL)
        if value > gpu.totalvfs:
            raise fail(errno.ERANGE)
        if value == gpu.numvfs:
            return
        if gpu.driver in ("nvidia", ""):
            raise fail(errno.ENOENT, "Driver does not support SRIOV configuration via sysfs")
        if value > 0 and gpu.numvfs > 0:
            raise fail(errno.EBUSY, f"{gpu.numvfs} VFs already enabled")
        if value == 0:
            gpu.vgpus.clear()
        gpu.numvfs = value

    def sriov_manage(self, args: str) -> tuple[int, str]:
        """Run ``sriov-manage <-e|-d> <bdf|ALL>``; returns (exit status, output)."""
        words = args.split()
        if len(words) != 2 or words[0] not in ("-e", "-d"):
            return 2, "usage: sriov-manage <-e|-d> <ssss:bb:dd.f|ALL>"
        flag, target = words
        if target.upper() == "ALL":
            gpus = [g for g in self.gpus if g.sriov_capable]
        else:
            g = self.gpu(target.lower())
            if g is None:
                return 1, f"No NVIDIA GPU found at {target}"
            gpus = [g]
        out: list[str] = []
        status = 0
        for g in gpus:
            if not g.sriov_capable:
                out.append(f"GPU at {g.address} does not support SR-IOV.")
            elif flag == "-e":
                if g.numvfs:
                    out.append(f"GPU at {g.address} already has VFs enabled.")
                else:
                    g.numvfs = g.totalvfs
                    out.append(f"Enabling VFs on {g.address}")
            elif g.numvfs == 0:
                out.append(f"GPU at {g.address} has no VFs enabled.")
            elif any(v.in_use for v in g.vgpus):
                holder = next(v.in_use for v in g.vgpus if v.in_use)
                out.append(f"Cannot obtain unbindLock for {g.address} (held by {holder})")
                status = 1
            else:
                g.vgpus.clear()
                g.numvfs = 0
                out.append(f"Disabling VFs on {g.address}")
        return status, "\n".join(out)


def _extra_types(driver: DriverSpec) -> dict[str, tuple[VgpuType, ...]]:
    """The spec's ``driver.extra-types`` as catalog-shaped types, by GPU model name."""
    catalog = default_catalog()
    found: dict[str, list[VgpuType]] = {}
    for i, x in enumerate(driver.extra_types):
        where = f"driver.extra-types[{i}]"
        parsed = parse_type_name(x.name)
        assert parsed is not None  # checked by the spec
        model = catalog.find_model(x.model or parsed.product)
        if model is None:
            raise SpecError(
                f"{where}.model: no GPU model has types named {parsed.product}-…; "
                "name the model (model: L40S)"
            )
        taken = {t.name: t for t in (*model.types, *found.get(model.name, ()))}
        if x.name in taken:
            raise SpecError(f"{where}.name: {model.name} already has a type {x.name}")
        ids = {t.type_id for t in (*model.types, *found.get(model.name, ())) if t.type_id_known}
        if x.id in ids:
            raise SpecError(f"{where}.id: {model.name} already has a type with id {x.id}")
        found.setdefault(model.name, []).append(
            VgpuType(
                name=x.name,
                model=model.name,
                series=parsed.series,
                framebuffer_mib=x.framebuffer_mib,
                max_instances=x.max_instances,
                type_id=x.id,
                type_id_known=True,
            )
        )
    return {name: tuple(ts) for name, ts in found.items()}


def _suggest_model(text: str) -> str:
    from vgpu_state.catalog import suggest

    catalog = default_catalog()
    names = [m.short_name for m in catalog.models] + [m.name for m in catalog.models]
    found = suggest(text, names)
    return f"; did you mean {found!r}?" if found else ""
