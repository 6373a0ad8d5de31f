"""``ProcessHolders``: which vGPUs the node's processes hold, read from the host now."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from vgpu_state.model.snapshot import NodeSnapshot


@runtime_checkable
class ProcessHolders(Protocol):
    """The vGPUs a process on the node holds open (a VM's QEMU and its VFIO fds).

    Real: :class:`vgpu_state.host.holders.ProcHolders` (``/proc``). A simulated
    node serves its own ``/proc``. :class:`NoProcesses` sees none (a node read
    from elsewhere, e.g. its agent's report).
    """

    def holders(self, snapshot: NodeSnapshot) -> tuple[Mapping[str, str], tuple[str, ...]]:
        """vGPU key -> holder for the vGPUs of ``snapshot``, and warnings (what was not read)."""
        ...


class NoProcesses:
    """Sees no process: for a node that is not this host."""

    def holders(self, snapshot: NodeSnapshot) -> tuple[Mapping[str, str], tuple[str, ...]]:
        return {}, ()
