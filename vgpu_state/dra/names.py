"""The DRA driver's names: driver, attribute keys, and device names for vGPUs.

Kept apart from the pool builder so that readers of claims (the Kubernetes
adapter) need nothing but these names.
"""

from __future__ import annotations

import re

from vgpu_state.model.ids import is_canonical_uuid
from vgpu_state.model.snapshot import Vgpu

DOMAIN = "vgpu-state.io"
DRIVER = f"vgpu.{DOMAIN}"
"""The DRA driver name: a DNS subdomain under the project's own domain."""

PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"
MDEV_UUID = "mdevUUID"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_VF = re.compile(r"^vf-([0-9a-f]{4})-([0-9a-f]{2})-([0-9a-f]{2})-([0-7])$")


def device_name(v: Vgpu) -> str:
    """The DNS-label device name of a vGPU: ``mdev-<uuid>`` or ``vf-0000-41-00-4``."""
    if v.kind == "mdev" and v.uuid is not None:
        return f"mdev-{v.uuid.lower()}"
    return "vf-" + v.parent.lower().replace(":", "-").replace(".", "-")


def device_key(name: str) -> str | None:
    """The vGPU key (mdev UUID or VF address) a device name stands for, if it is one of ours."""
    if name.startswith("mdev-") and is_canonical_uuid(name[5:]):
        return name[5:]
    m = _VF.match(name)
    if m:
        return f"{m.group(1)}:{m.group(2)}:{m.group(3)}.{m.group(4)}"
    return None


def is_dns_label(name: str) -> bool:
    return bool(_DNS_LABEL.match(name))
