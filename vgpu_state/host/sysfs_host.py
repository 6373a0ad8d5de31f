"""``SysfsHost``: the :class:`~vgpu_state.ports.HostPort` of a real (or mounted) sysfs tree."""

from __future__ import annotations

import errno
from collections.abc import Sequence

from vgpu_state.catalog import Catalog
from vgpu_state.host import driver
from vgpu_state.host.nvidia_smi import (
    ModeOperations,
    NvidiaSmi,
    command_runner,
    default_nvidia_smi,
    modes_or_problem,
)
from vgpu_state.host.paths import SysfsPaths
from vgpu_state.host.scan import ModesReader, scan, scan_gpu
from vgpu_state.model.errors import InterfaceMissingError
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.statefiles.drivertypes import DriverTypeMemory


class SysfsHost(ModeOperations):
    """:class:`HostPort` on a real (or mounted) sysfs tree.

    ``sriov_manage``: the sriov-manage command (a path or an argv prefix). ``None``
    uses ``/usr/lib/nvidia/sriov-manage`` when it is installed; an empty string or
    sequence always writes ``sriov_numvfs`` instead. ``catalog`` names the GPU
    models and the types the driver lists only by id. ``driver_types`` remembers
    the types the driver listed, to name vGPUs once a full GPU lists none (a
    memory of this object only when omitted).

    ``nvidia_smi``: the nvidia-smi command (a path or an argv prefix) that reads and
    changes MIG and mixed-size mode. ``None`` uses ``/usr/bin/nvidia-smi`` when it is
    installed; an empty string or sequence means none: scans leave ``Gpu.modes``
    unread and mode changes fail.
    """

    def __init__(
        self,
        root: str = "/sys",
        node: str = "",
        sriov_manage: str | Sequence[str] | None = None,
        *,
        catalog: Catalog,
        driver_types: DriverTypeMemory | None = None,
        nvidia_smi: str | Sequence[str] | None = None,
    ) -> None:
        self.root = root
        self.driver_types = driver_types if driver_types is not None else DriverTypeMemory()
        self.node = node
        self.catalog = catalog
        if sriov_manage is None:
            self.sriov_manage = driver.default_sriov_manage()
        elif isinstance(sriov_manage, str):
            self.sriov_manage = (sriov_manage,) if sriov_manage else None
        else:
            self.sriov_manage = tuple(sriov_manage) or None
        command: tuple[str, ...] | None
        if nvidia_smi is None:
            command = default_nvidia_smi()
        elif isinstance(nvidia_smi, str):
            command = (nvidia_smi,) if nvidia_smi else None
        else:
            command = tuple(nvidia_smi) or None
        self.nvidia_smi_command = command
        self.nvidia_smi = (
            NvidiaSmi(command_runner(command), command[0]) if command is not None else None
        )

    def _modes(self) -> ModesReader | None:
        tool = self.nvidia_smi
        if tool is None:
            return None
        return lambda pf: modes_or_problem(tool, pf)

    def _tool(self, operation: str, pf: str) -> NvidiaSmi:
        SysfsPaths(self.root).device(operation, pf)  # a PCI address, nothing else
        if self.nvidia_smi is None:
            raise InterfaceMissingError(
                operation, "nvidia-smi", pf, errno.ENOENT, "no nvidia-smi (--nvidia-smi PATH)"
            )
        return self.nvidia_smi

    def scan(self) -> NodeSnapshot:
        return self.driver_types.observe(
            scan(self.root, self.node, catalog=self.catalog, modes=self._modes())
        )

    def scan_gpu(self, address: str) -> NodeSnapshot:
        return self.driver_types.observe(
            scan_gpu(self.root, self.node, address, catalog=self.catalog, modes=self._modes())
        )

    def enable_sriov(self, pf: str) -> None:
        driver.enable_sriov(self.root, pf, self.sriov_manage)

    def disable_sriov(self, pf: str) -> None:
        driver.disable_sriov(self.root, pf, self.sriov_manage)

    def create_mdev(self, parent: str, type_id: int, uuid: str) -> None:
        driver.create_mdev(self.root, parent, type_id, uuid)

    def remove_mdev(self, uuid: str) -> None:
        driver.remove_mdev(self.root, uuid)

    def set_vf_type(self, vf: str, type_id: int) -> None:
        driver.set_vf_type(self.root, vf, type_id)

    def clear_vf_type(self, vf: str) -> None:
        driver.clear_vf_type(self.root, vf)
