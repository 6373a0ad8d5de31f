"""Frozen domain values shared by every layer of vgpu-state."""

from vgpu_state.model.desired import DesiredGpu, DesiredState
from vgpu_state.model.errors import (
    BlockedError,
    ConfigError,
    ConfigIssue,
    DriverError,
    PlanningError,
    SelectionError,
    TransientError,
    VgpuStateError,
)
from vgpu_state.model.pci import PciAddress, format_pci_address, parse_pci_address
from vgpu_state.model.policy import InUsePolicy, Policy, SriovPolicy
from vgpu_state.model.snapshot import (
    CreatableType,
    Gpu,
    NodeSnapshot,
    SysfsInterface,
    Vgpu,
    VirtualFunction,
)

__all__ = [
    "BlockedError",
    "ConfigError",
    "ConfigIssue",
    "CreatableType",
    "DesiredGpu",
    "DesiredState",
    "DriverError",
    "Gpu",
    "InUsePolicy",
    "NodeSnapshot",
    "PciAddress",
    "PlanningError",
    "Policy",
    "SelectionError",
    "SriovPolicy",
    "SysfsInterface",
    "TransientError",
    "Vgpu",
    "VgpuStateError",
    "VirtualFunction",
    "format_pci_address",
    "parse_pci_address",
]
