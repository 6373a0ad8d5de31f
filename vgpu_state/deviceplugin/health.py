"""Is an advertised vGPU still in sysfs? One ``lstat`` or one small read per device.

inotify does not see sysfs, so the manager asks this periodically.
"""

from __future__ import annotations

import os

from vgpu_state.deviceplugin.inventory import Device


def present_in_sysfs(device: Device) -> bool:
    """An mdev still listed under ``bus/mdev/devices``; a VF still carrying its vGPU type."""
    root = device.sysfs_root
    if device.kind == "mdev":
        return os.path.lexists(os.path.join(root, "bus", "mdev", "devices", device.id))
    path = os.path.join(root, "bus", "pci", "devices", device.id, "nvidia", "current_vgpu_type")
    try:
        with open(path, "rb") as f:
            current = int(f.read().strip() or b"0")
    except (OSError, ValueError):
        return False
    return current != 0 and (device.type_id is None or current == device.type_id)
