"""Host layer: sysfs scan (read) and NVIDIA driver operations (write) for both layouts."""

from vgpu_state.host.port import HostPort, SysfsHost
from vgpu_state.host.scan import ScanStats, parse_creatable_vgpu_types, scan, scan_with_stats

__all__ = [
    "HostPort",
    "ScanStats",
    "SysfsHost",
    "parse_creatable_vgpu_types",
    "scan",
    "scan_with_stats",
]
