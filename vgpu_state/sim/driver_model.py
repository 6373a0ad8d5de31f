"""The simulated NVIDIA vGPU driver: a pure state machine of one node (no I/O).

The state of each GPU and its rules live in :mod:`vgpu_state.sim.gpu_state`,
building the driver from a spec in :mod:`vgpu_state.sim.driver_spec`, injected
faults in :mod:`vgpu_state.sim.faults`; this module holds the reactions to writes.

Every operation takes the bytes a process wrote and either changes the state or
raises ``OSError`` with the errno the real driver returns
(``reference/nvidia-sysfs.md`` §2.3, §3.3, §4.2, §5, §6).
"""

from __future__ import annotations

import errno
import fnmatch
from collections.abc import Sequence

from vgpu_state.catalog import VgpuType
from vgpu_state.model.ids import UUID_PATTERN
from vgpu_state.sim.driver_spec import _SpecDriver
from vgpu_state.sim.faults import FaultEffect, FaultState
from vgpu_state.sim.gpu_state import (
    SRIOV_OFFSET,
    SRIOV_STRIDE,
    SimGpu,
    SimGpuInstance,
    SimVgpu,
    fail,
)
from vgpu_state.sim.spec import (
    errno_value,
)


class SimDriver(_SpecDriver):
    """All GPUs of one simulated node and the driver's reactions to writes."""

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

    # holders -------------------------------------------------------------------
    def holder(self, gpu: SimGpu, v: SimVgpu) -> str | None:
        """Who holds ``v``: the spec's holder, or a process with its VFIO node open."""
        if v.in_use:
            return v.in_use
        if v.uuid is not None:
            key = v.uuid
        elif v.vf is not None and v.vf < len(vfs := gpu.vf_addresses()):
            key = vfs[v.vf]
        else:
            return None
        pids = self.vfio_open.get(key)
        return f"process {pids[0]}" if pids else None

    # mdev ----------------------------------------------------------------------
    def mdev_create(self, parent: str, type_id: int, data: bytes) -> None:
        if not 36 <= len(data) <= 37:
            raise fail(errno.EINVAL, "UUID must be 36 characters")
        text = data[:36].decode("ascii", "replace")
        if UUID_PATTERN.match(text) is None:
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
        gi, placement = self._place(gpu, t, None, None, self.create_unavailable_errno)
        self._add_vgpu(
            gpu,
            SimVgpu(
                type=t,
                uuid=uid,
                vf=vf,
                iommu_group=self._new_group(),
                gpu_instance=gi,
                placement=placement,
            ),
        )

    def _place(
        self, gpu: SimGpu, t: VgpuType, gi: int | None, placement: int | None, code: int
    ) -> tuple[int | None, int | None]:
        """Where a new vGPU of ``t`` goes: its GPU instance (MIG mode) and its first slot
        (mixed-size mode); ``gi``/``placement`` ask for one (a spec being loaded)."""
        if gpu.mig_mode:
            slots = gpu.gi_slots(t)
            if gi is not None:
                slots = [x for x in slots if x[0].id == gi]
            if not slots:
                raise fail(code, "no GPU instance with room for this vGPU type")
            return min(x.id for x, _ in slots), None
        if gpu.heterogeneous:
            start = gpu.free_placement(t)
            if placement is not None:
                taken = [(v.placement or 0, gpu.slot_size(v.type)) for v in gpu.vgpus]
                size = gpu.slot_size(t)
                ok = (
                    start is not None
                    and placement % size == 0
                    and placement + size <= gpu.slot_model()[0]
                    and not any(s < placement + size and placement < s + n for s, n in taken)
                )
                start = placement if ok else None
            if start is None:
                raise fail(code, "no free placement for this vGPU type")
            return None, start
        return None, None

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
        if holder := self.holder(gpu, v):
            raise fail(errno.EBUSY, f"in use by {holder}")
        self._remove_vgpu(gpu, v)

    # vendor-specific VFIO --------------------------------------------------------
    def vf_type_write(
        self,
        vf_addr: str,
        data: bytes,
        *,
        gpu_instance: int | None = None,
        placement: int | None = None,
    ) -> None:
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
            if holder := self.holder(gpu, current):
                raise fail(errno.EBUSY, f"in use by {holder}")
            self._remove_vgpu(gpu, current)
            return
        if current is not None:
            raise fail(errno.EBUSY, "the VF already has a vGPU type")
        t = gpu.type_by_id(type_id)
        if t is None or t not in gpu.creatable_on_vf(vf):
            raise fail(errno.EIO, "vGPU type not creatable on this VF")
        gi, slot = self._place(gpu, t, gpu_instance, placement, errno.EIO)
        self._add_vgpu(
            gpu,
            SimVgpu(
                type=t,
                uuid=None,
                vf=vf,
                iommu_group=self._new_group(),
                gpu_instance=gi,
                placement=slot,
            ),
        )

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
        self._rebind(gpu)
        self._set_numvfs(gpu, value)

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
                    self._rebind(g)
                    self._set_numvfs(g, g.totalvfs)
                    out.append(f"Enabling VFs on {g.address}")
            elif g.numvfs == 0:
                out.append(f"GPU at {g.address} has no VFs enabled.")
            elif holders := [h for v in g.vgpus if (h := self.holder(g, v))]:
                holder = holders[0]
                out.append(f"Cannot obtain unbindLock for {g.address} (held by {holder})")
                status = 1
            else:
                self._rebind(g)
                self._set_numvfs(g, 0)
                out.append(f"Disabling VFs on {g.address}")
        return status, "\n".join(out)

    def _rebind(self, g: SimGpu) -> None:
        """What rebinding the PF (sriov-manage's stub dance) does besides the VFs: every
        vGPU and every GPU instance is gone and mixed-size mode is off; MIG mode stays
        (reference §4.3, §4.4, §5.3)."""
        self._clear_vgpus(g)
        if g.gpu_instances or g.heterogeneous:
            g.gpu_instances.clear()
            g.heterogeneous = False
            self._touch(g)

    # modes (changed through nvidia-smi) -------------------------------------------
    def set_mig_mode(self, g: SimGpu, enabled: bool) -> None:
        if g.mig_mode != enabled:
            g.mig_mode = enabled
            g.gpu_instances.clear()
            self._touch(g)

    def set_heterogeneous(self, g: SimGpu, enabled: bool) -> None:
        if g.heterogeneous != enabled:
            g.heterogeneous = enabled
            self._touch(g)

    def add_gpu_instance(self, g: SimGpu, gi: SimGpuInstance) -> None:
        g.gpu_instances.append(gi)
        g.gpu_instances.sort(key=lambda x: x.id)
        self._touch(g)

    def remove_gpu_instance(self, g: SimGpu, gi: SimGpuInstance) -> None:
        g.gpu_instances.remove(gi)
        self._touch(g)

    # nvidia-smi ------------------------------------------------------------------
    def nvidia_smi(self, argv: Sequence[str]) -> tuple[int, str]:
        """Answer one ``nvidia-smi`` command line (see :mod:`vgpu_state.sim.nvidia_smi`)."""
        from vgpu_state.sim.nvidia_smi import run

        return run(self, list(argv))


__all__ = [
    "SRIOV_OFFSET",
    "SRIOV_STRIDE",
    "FaultEffect",
    "FaultState",
    "SimDriver",
    "SimGpu",
    "SimGpuInstance",
    "SimVgpu",
    "fail",
]
