"""``HostPort``: what a reconcile needs from a node's driver."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vgpu_state.model.snapshot import NodeSnapshot


@runtime_checkable
class HostPort(Protocol):
    """Read and change one node's vGPU state. Every change raises ``DriverError`` on failure.

    Real: :class:`vgpu_state.host.SysfsHost`. Simulated: :class:`vgpu_state.sim.host.SimHost`.
    """

    def scan(self) -> NodeSnapshot:
        """A fresh read of every GPU on the node."""
        ...

    def scan_gpu(self, address: str) -> NodeSnapshot:
        """A fresh read of the GPU at ``address`` alone: a snapshot holding that GPU,
        or no GPU when it is gone (``error`` set when the host cannot be read).
        Its cost does not grow with the node's other GPUs."""
        ...

    def enable_sriov(self, pf: str) -> None: ...

    def disable_sriov(self, pf: str) -> None: ...

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None: ...

    def remove_mdev(self, uuid: str) -> None: ...

    def set_vf_type(self, vf: str, type_id: int) -> None: ...

    def clear_vf_type(self, vf: str) -> None: ...

    def set_mig_mode(self, pf: str, enabled: bool) -> None:
        """MIG mode on or off (``nvidia-smi -i PF -mig 1|0``); the driver refuses while
        the GPU's VFs are enabled."""
        ...

    def create_gpu_instance(self, pf: str, profile: str) -> int:
        """A MIG GPU instance of ``profile`` (``1g.24gb``) with its compute instance;
        returns the new instance's id."""
        ...

    def destroy_gpu_instance(self, pf: str, gi_id: int) -> None:
        """Destroy GPU instance ``gi_id`` (its compute instances first)."""
        ...

    def set_heterogeneous_mode(self, pf: str, enabled: bool) -> None:
        """The driver's mixed-size (heterogeneous) vGPU mode on or off
        (``nvidia-smi vgpu -i PF -shm 1|0``); refused while a vGPU exists."""
        ...
