"""Host layer: sysfs scan (read) and NVIDIA driver operations (write) for both layouts."""

from vgpu_state.host.scan import (
    ScanStats,
    parse_creatable_vgpu_types,
    scan,
    scan_gpu,
    scan_with_stats,
)
from vgpu_state.host.sysfs_host import SysfsHost

__all__ = [
    "ScanStats",
    "SysfsHost",
    "parse_creatable_vgpu_types",
    "scan",
    "scan_gpu",
    "scan_with_stats",
]
