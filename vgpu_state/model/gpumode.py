"""A GPU's mode: time-sliced equal-size (the driver's default), mixed-size, or MIG-backed.

The mode is part of a GPU's desired layout (:class:`vgpu_state.model.desired.DesiredGpu`)
and of what a scan reads (:attr:`vgpu_state.model.snapshot.Gpu.modes`, from
``nvidia-smi``: sysfs shows neither MIG mode nor mixed-size mode).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from vgpu_state.model.frozen import Frozen


class GpuMode(StrEnum):
    """How a GPU shares itself among its vGPUs.

    * ``time-sliced``: every vGPU has the same framebuffer size (the driver's
      equal-size mode, its default);
    * ``mixed-size``: time-sliced vGPUs of different framebuffer sizes (the
      driver's heterogeneous mode, vGPU 17 and later);
    * ``mig``: MIG-backed vGPUs, each inside a GPU instance (MIG mode on).
    """

    TIME_SLICED = "time-sliced"
    MIXED_SIZE = "mixed-size"
    MIG = "mig"


class GpuInstance(Frozen):
    """One MIG GPU instance as ``nvidia-smi mig -lgi`` lists it."""

    id: int = Field(ge=0, le=1023)
    profile: str = Field(max_length=32)
    """The GPU instance profile's name without ``MIG``: ``1g.24gb``, ``1g.5gb+me``."""
    placement_start: int | None = Field(default=None, ge=0, le=63)
    placement_size: int | None = Field(default=None, ge=1, le=64)


class GpuModes(Frozen):
    """A GPU's modes as ``nvidia-smi`` reports them; read again after every change.

    ``None`` in a field means the tool does not report it for this GPU (not
    MIG-capable; heterogeneous mode reads ``N/A`` in MIG mode).
    """

    mig: bool | None = None
    """MIG mode (current); ``None`` for a GPU without MIG."""
    mig_pending: bool | None = Field(default=None, exclude_if=lambda v: v is None)
    """MIG mode after the next GPU reset, when the tool reports it and it differs."""
    heterogeneous: bool | None = None
    """The driver's mixed-size (heterogeneous) vGPU mode."""
    gpu_instances: tuple[GpuInstance, ...] = Field(default=(), max_length=64)

    @property
    def mode(self) -> GpuMode:
        """The mode these readings put the GPU in."""
        if self.mig:
            return GpuMode.MIG
        if self.heterogeneous:
            return GpuMode.MIXED_SIZE
        return GpuMode.TIME_SLICED

    def gi_counts(self) -> dict[str, int]:
        """GPU instances per profile."""
        out: dict[str, int] = {}
        for gi in self.gpu_instances:
            out[gi.profile] = out.get(gi.profile, 0) + 1
        return out
