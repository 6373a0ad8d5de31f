"""Building the simulated driver from a node spec, and the spec of its current state."""

from __future__ import annotations

import errno
import uuid as uuid_mod
from abc import ABC, abstractmethod

from vgpu_state.catalog import Catalog, VgpuType, parse_type_name, suggest
from vgpu_state.sim.faults import FaultState
from vgpu_state.sim.gpu_state import (
    SimGpu,
    SimGpuInstance,
    SimVgpu,
)
from vgpu_state.sim.spec import (
    DriverSpec,
    GpuInstanceSpec,
    GpuSpec,
    NodeSpec,
    SpecError,
    VgpuSpec,
    errno_value,
)


def _extra_types(driver: DriverSpec, catalog: Catalog) -> dict[str, tuple[VgpuType, ...]]:
    """The spec's ``driver.extra-types`` as catalog-shaped types, by GPU model name."""
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
                mig_slices=parsed.mig_slices,
            )
        )
    return {name: tuple(ts) for name, ts in found.items()}


def _gi_specs(g: SimGpu) -> tuple[str | GpuInstanceSpec, ...]:
    """The GPU instances of ``g`` as a spec lists them: by profile name where loading
    that name reaches the same id and placement, else with both."""
    probe = SimGpu(**{**g.__dict__, "gpu_instances": [], "vgpus": []})
    out: list[str | GpuInstanceSpec] = []
    for gi in sorted(g.gpu_instances, key=lambda x: x.id):
        auto = (probe.next_gi_id(), probe.gi_room(gi.profile))
        if auto == (gi.id, gi.start):
            out.append(gi.profile.name)
        else:
            out.append(GpuInstanceSpec(profile=gi.profile.name, id=gi.id, placement=gi.start))
        probe.gpu_instances.append(gi)
    return tuple(out)


def _suggest_model(text: str, catalog: Catalog) -> str:
    names = [m.short_name for m in catalog.models] + [m.name for m in catalog.models]
    found = suggest(text, names)
    return f"; did you mean {found!r}?" if found else ""


class _SpecDriver(ABC):
    """The driver's GPUs as a spec describes them; lookups by address and UUID.

    Abstract: the state machine (:class:`~vgpu_state.sim.driver_model.SimDriver`)
    supplies the writes that create the spec's vGPUs.
    """

    def __init__(self, spec: NodeSpec, catalog: Catalog) -> None:
        self.catalog = catalog
        self.node = spec.node
        self.labels = dict(spec.labels)
        self.driver_spec: DriverSpec = spec.driver
        self.sriov_manage_installed = spec.sriov_manage
        self.nvidia_smi_installed = spec.nvidia_smi
        self.nvidia_smi_output = ""
        self.nvidia_smi_status = 0
        self.extra_pci_devices = spec.extra_pci_devices
        self.create_unavailable_errno = errno_value(spec.driver.create_unavailable_errno)
        self.faults = [FaultState(f) for f in spec.faults]
        self.gpus: list[SimGpu] = []
        self.sriov_manage_output = ""
        self.vfio_open: dict[str, list[int]] = {}
        """vGPU key -> the pids with its VFIO node open (through the FUSE frontend)."""
        extras = _extra_types(spec.driver, catalog)
        seen: set[str] = set()
        for i, g in enumerate(sorted(spec.gpus, key=lambda g: g.address)):
            model = catalog.find_model(g.model)
            if model is None:
                hint = _suggest_model(g.model, catalog)
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
        self._by_address = {g.address: g for g in self.gpus}
        self._functions: dict[str, dict[tuple[int, int], tuple[SimGpu, int | None]]] = {}
        """PCI address -> each GPU function there, by (GPU index, -1 for the PF or the
        VF's index): :meth:`parent` answers with the first, as a walk of the GPUs in
        order would, without the walk."""
        self._mdevs: dict[str, tuple[SimGpu, SimVgpu]] = {}
        """mdev UUID -> its GPU and vGPU."""
        self.changed: dict[str, SimGpu] = {}
        """The GPUs whose state changed since :meth:`take_changed` (by address)."""
        for gpu in self.gpus:
            self._index_functions(gpu, add=True)
        self.next_iommu_group = 1 + max(
            [g.iommu_group for g in self.gpus]
            + [g.vf_iommu_group_base + max(g.totalvfs, 1) - 1 for g in self.gpus]
            + [0]
        )
        by_address = {g.address: g for g in self.gpus}
        for i, g in enumerate(spec.gpus):
            self._load_modes(by_address[g.address], g, f"gpus[{i}]")
            for j, v in enumerate(g.vgpus):
                self._load_vgpu(by_address[g.address], v, f"gpus[{i}].vgpus[{j}]")

    # loading -------------------------------------------------------------------
    def _load_modes(self, gpu: SimGpu, g: GpuSpec, where: str) -> None:
        """MIG mode, the GPU instances and mixed-size mode of the spec's GPU ``g``."""
        if g.mig_mode:
            if not gpu.mig_capable:
                raise SpecError(f"{where}.mig-mode: {gpu.model.name} has no MIG-backed vGPU types")
            gpu.mig_mode = True
        if g.gpu_instances and not g.mig_mode:
            raise SpecError(f"{where}.gpu-instances: GPU instances need mig-mode: true")
        if g.gpu_instances and gpu.numvfs == 0:
            raise SpecError(
                f"{where}.gpu-instances: GPU instances need SR-IOV on (sriov-manage -e "
                "destroys every GPU instance, so they are created after it)"
            )
        profiles = {p.name: p for p in gpu.gi_profiles()}
        for k, item in enumerate(g.gpu_instances):
            at = f"{where}.gpu-instances[{k}]"
            entry = item if isinstance(item, GpuInstanceSpec) else GpuInstanceSpec(profile=item)
            profile = profiles.get(entry.profile.strip())
            if profile is None:
                known = ", ".join(profiles) or "none"
                raise SpecError(
                    f"{at}: {gpu.model.name} has no GPU instance profile {entry.profile!r} "
                    f"(profiles: {known})"
                )
            start = gpu.gi_room(profile, entry.placement)
            if start is None:
                raise SpecError(f"{at}: no room for a {profile.name} GPU instance on {gpu.address}")
            gi_id = entry.id if entry.id is not None else gpu.next_gi_id()
            if gpu.gpu_instance(gi_id) is not None:
                raise SpecError(f"{at}.id: GPU instance {gi_id} is listed twice")
            gpu.gpu_instances.append(SimGpuInstance(gi_id, profile, start))
        if g.heterogeneous:
            if g.layout != "vendor-vfio" or gpu.numvfs == 0:
                raise SpecError(
                    f"{where}.heterogeneous: mixed-size mode needs the vendor-vfio layout "
                    "with SR-IOV on"
                )
            if g.mig_mode:
                raise SpecError(f"{where}.heterogeneous: not in MIG mode (it reads N/A there)")
            gpu.heterogeneous = True

    def _load_vgpu(self, gpu: SimGpu, v: VgpuSpec, where: str) -> None:
        t = gpu.type_named(v.type)
        if t is None:
            raise SpecError(f"{where}.type: {gpu.model.name} has no vGPU type {v.type!r}")
        if t.is_mig and not gpu.mig_mode:
            raise SpecError(f"{where}.type: {t.name} is MIG-backed: the GPU needs mig-mode: true")
        if not t.is_mig and gpu.mig_mode:
            raise SpecError(
                f"{where}.type: {t.name} is time-sliced; a GPU in MIG mode offers only "
                "MIG-backed types"
            )
        if gpu.type_by_id(t.type_id) is None:
            raise SpecError(
                f"{where}.type: {t.name} is not offered by the {gpu.flavour!r} driver flavour"
            )
        if v.gpu_instance is not None and not t.is_mig:
            raise SpecError(f"{where}.gpu-instance: {t.name} is not MIG-backed")
        if v.placement is not None and not gpu.heterogeneous:
            raise SpecError(f"{where}.placement: only in mixed-size mode (heterogeneous: true)")
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
                self.vf_type_write(
                    gpu.vf_addresses()[vf],
                    str(t.type_id).encode(),
                    gpu_instance=v.gpu_instance,
                    placement=v.placement,
                )
        except OSError as e:
            reason = "already used" if e.errno == errno.EEXIST else "not creatable there"
            if gpu.mig_mode:
                rule = "a MIG-backed vGPU needs a GPU instance of its profile with room"
            elif gpu.heterogeneous:
                rule = "mixed-size mode needs free aligned slots and framebuffer"
            else:
                rule = "vGPUs on one GPU must share one framebuffer size and fit its max instances"
            raise SpecError(
                f"{where}: {t.name} on {gpu.address}"
                f"{'' if vf is None else f' VF {vf}'} is {reason} "
                f"({errno.errorcode.get(e.errno or 0, '?')}; {rule})"
            ) from e
        gpu.vgpus[-1].in_use = v.in_use
        self._touch(gpu)

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
                        VgpuSpec(
                            type=v.type.name,
                            uuid=v.uuid,
                            vf=v.vf,
                            in_use=v.in_use,
                            gpu_instance=v.gpu_instance,
                            placement=v.placement,
                        )
                        for v in g.vgpus
                    ),
                    mig_mode=g.mig_mode,
                    gpu_instances=_gi_specs(g),
                    heterogeneous=g.heterogeneous,
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
            nvidia_smi=self.nvidia_smi_installed,
            gpus=tuple(gpus),
            faults=tuple(faults),
            extra_pci_devices=self.extra_pci_devices,
        )

    # lookups -------------------------------------------------------------------
    def gpu(self, address: str) -> SimGpu | None:
        return self._by_address.get(address)

    def parent(self, address: str) -> tuple[SimGpu, int | None] | None:
        """The GPU and VF index (``None`` for the PF) of a PCI function."""
        found = self._functions.get(address)
        return found[min(found)] if found else None

    def mdev(self, uuid: str) -> tuple[SimGpu, SimVgpu] | None:
        return self._mdevs.get(uuid)

    # changes ---------------------------------------------------------------------
    # Every change of a GPU's state goes through these, which keep the lookups
    # above and the record of changed GPUs (what the tree renders again) true.
    def _index_functions(self, g: SimGpu, *, add: bool) -> None:
        functions = [(g.address, -1), *((a, i) for i, a in enumerate(g.vf_addresses()))]
        for address, fn in functions:
            key = (g.index, fn)
            if add:
                self._functions.setdefault(address, {})[key] = (g, None if fn < 0 else fn)
                continue
            there = self._functions.get(address)
            if there is not None:
                there.pop(key, None)
                if not there:
                    del self._functions[address]

    def _touch(self, g: SimGpu) -> None:
        self.changed[g.address] = g

    def take_changed(self) -> list[SimGpu]:
        """The GPUs changed since the last call (the tree renders only these again)."""
        changed = list(self.changed.values())
        self.changed.clear()
        return changed

    def _add_vgpu(self, g: SimGpu, v: SimVgpu) -> None:
        g.vgpus.append(v)
        if v.uuid is not None:
            self._mdevs[v.uuid] = (g, v)
        self._touch(g)

    def _remove_vgpu(self, g: SimGpu, v: SimVgpu) -> None:
        g.vgpus.remove(v)
        self._forget_mdev(v)
        self._touch(g)

    def _clear_vgpus(self, g: SimGpu) -> None:
        for v in g.vgpus:
            self._forget_mdev(v)
        g.vgpus.clear()
        self._touch(g)

    def _forget_mdev(self, v: SimVgpu) -> None:
        if v.uuid is None:
            return
        found = self._mdevs.get(v.uuid)
        if found is not None and found[1] is v:
            del self._mdevs[v.uuid]

    def _set_numvfs(self, g: SimGpu, value: int) -> None:
        self._index_functions(g, add=False)
        g.numvfs = value
        self._index_functions(g, add=True)
        self._touch(g)

    def _new_group(self) -> int:
        group = self.next_iommu_group
        self.next_iommu_group += 1
        return group

    # The state machine (:class:`~vgpu_state.sim.driver_model.SimDriver`) creates
    # the spec's vGPUs through the same writes a client makes.
    @abstractmethod
    def mdev_create(self, parent: str, type_id: int, data: bytes) -> None: ...

    @abstractmethod
    def vf_type_write(
        self,
        vf_addr: str,
        data: bytes,
        *,
        gpu_instance: int | None = None,
        placement: int | None = None,
    ) -> None: ...
