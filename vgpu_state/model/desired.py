"""The desired layout of one node: what the config resolves to for its GPUs."""

from __future__ import annotations

from pydantic import Field

from vgpu_state.model.frozen import Frozen
from vgpu_state.model.gpumode import GpuMode
from vgpu_state.model.pci import PciAddress
from vgpu_state.model.policy import Policy, Publish


class DesiredGpu(Frozen):
    """The target multiset of vGPU types for one managed GPU."""

    address: PciAddress
    index: int
    model: str | None = None
    types: tuple[tuple[str, int], ...] = ()
    """(type name, count) pairs sorted by name; an empty tuple means 'no vGPUs'."""
    entry: str = ""
    """Where the layout came from, e.g. ``configs/x.yaml:12:5 (vgpu-configs.a[1])``."""
    publish: Publish = Publish.DEVICE_PLUGIN
    """The channel its vGPUs are offered through (the entry's ``publish``, else the policy's)."""
    mode: GpuMode = Field(
        default=GpuMode.TIME_SLICED, exclude_if=lambda v: v is GpuMode.TIME_SLICED
    )
    """The GPU's mode: the entry's ``mode``, or ``mig`` when its types are MIG-backed."""
    mig_geometry: tuple[tuple[str, int], ...] = Field(default=(), exclude_if=lambda v: not v)
    """Under ``mig``: (GPU instance profile, count) pairs sorted by profile (``1g.24gb``):
    the entry's ``mig-geometry``, or what its types need."""

    def counts(self) -> dict[str, int]:
        return dict(self.types)


class SkippedEntry(Frozen):
    """An entry of the selected config that selects no GPU of the node (an index past
    its GPUs, a device-filter that matches none): skipped, and said so."""

    config: str
    index: int
    entry: str
    """Where it is, e.g. ``configs/x.yaml:12:5 (vgpu-configs.a[1])``."""
    reason: str
    """E.g. ``no GPU 1 on this node``."""
    message: str
    """E.g. ``entry [1] of T4-small: no GPU 1 on this node, skipped``."""


class DesiredState(Frozen):
    node: str
    config: str
    selection_source: str
    """``label``, ``node-selector[N]``, ``default``, ``default-config`` or ``flag``."""
    policy: Policy = Policy()
    gpus: tuple[DesiredGpu, ...] = ()
    unmanaged: tuple[PciAddress, ...] = ()
    """Addresses of GPUs that no entry covers; they are never touched."""
    skipped: tuple[SkippedEntry, ...] = ()
    """Entries that select no GPU of this node (``policy: {missing-gpus: skip}``)."""

    def publish_for(self, address: str) -> Publish:
        """The channel of the vGPUs on GPU ``address`` (an unmanaged GPU: the policy's)."""
        for g in self.gpus:
            if g.address == address:
                return g.publish
        return self.policy.publish
