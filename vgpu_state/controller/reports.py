"""What one node's ``VGPUNodeState`` lets the controller permit, checked (pure).

A node's status is a claim, not a fact: an agent may be older or newer than
the controller, or compromised. The controller therefore builds KubeVirt CR
entries only from the node's reported scan, and only for vGPUs that

* sit on an NVIDIA GPU (PCI vendor ``10de``);
* carry a type name the driver of that same GPU lists (its offered or
  creatable types) and that follows NVIDIA's vGPU type-name grammar;
* on a VF (vendor-VFIO), sit on a VF of that GPU.

The entry's selector is derived, never copied: ``mdevNameSelector`` is the
driver's type name, ``pciVendorSelector`` is ``10DE:<the VF's device id>``, and
the resource name follows from the type name. So no report can make the
controller permit a non-NVIDIA device (a NIC ``8086:1572`` has no way in).

A status whose scan names another node or repeats a PCI address is refused
whole (:func:`~vgpu_state.model.snapshot.scan_problem`); one that cannot be
read at all is *unreadable*, which the controller treats as "may still need
anything".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu_state.catalog.names import parse_type_name, short_type_name
from vgpu_state.kube.nodestate import ReportedSnapshot, SnapshotDecodeError, decode_snapshot
from vgpu_state.kube.permitted import PermittedEntry
from vgpu_state.model.ids import NVIDIA_VENDOR_ID
from vgpu_state.model.lenient import known_fields
from vgpu_state.model.resources import (
    DEFAULT_DOMAIN,
    ResourceNameError,
    driver_type_name,
    gpus_sysfs_names,
    name_prefix,
    resource_name,
)
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, Vgpu, scan_problem


@dataclass(frozen=True)
class NodeReport:
    """One node's ``VGPUNodeState`` as the controller reads it."""

    node: str
    entries: tuple[PermittedEntry, ...] = ()
    """The entries its scan justifies (checked; sorted)."""
    unreadable: str | None = None
    """Why the status could not be read (no scan, bad encoding, a version it cannot parse)."""
    refused: str | None = None
    """Why the status was read but not trusted (another node's scan, repeated addresses)."""
    skipped: tuple[str, ...] = ()
    """vGPUs left out, each with the reason."""

    @property
    def resources(self) -> frozenset[str]:
        return frozenset(e.resource for e in self.entries)


def _driver_names(gpu: Gpu) -> set[str]:
    """Short names of the types this GPU's driver lists (offered or creatable)."""
    names = {short_type_name(t.name) for t in gpu.offered}
    names |= {short_type_name(t.sysfs_name or t.name) for t in gpu.pf_creatable}
    names |= {short_type_name(t.sysfs_name or t.name) for vf in gpu.vfs for t in vf.creatable}
    return names - {""}


def _entry(
    gpu: Gpu, v: Vgpu, known: dict[int, str], domain: str, prefix: str | None, listed: set[str]
) -> tuple[PermittedEntry | None, str]:
    """``v``'s entry; ``prefix`` and ``listed`` are the GPU's :func:`name_prefix` and
    :func:`_driver_names` (worked out once per GPU: each reads all its VFs' lists)."""
    where = f"vGPU {v.key} on {gpu.address}"
    name = driver_type_name(v, known, prefix)
    if not name:
        return None, f"{where}: the driver's name of its type is not reported"
    if parse_type_name(name) is None:
        return None, f"{where}: {name!r} is not an NVIDIA vGPU type name"
    if short_type_name(name) not in listed:
        return None, f"{where}: type {name!r} is not one the GPU's driver lists"
    try:
        resource = resource_name(name, domain)
    except ResourceNameError as e:
        return None, f"{where}: {e}"
    if v.kind == "mdev":
        return PermittedEntry("mediatedDevices", resource, name), ""
    vf = gpu.vf(v.parent)
    if vf is None:
        return None, f"{where}: its VF {v.parent} is not one of the GPU's VFs"
    device = vf.device_id if vf.device_id else gpu.device_id
    return PermittedEntry("pciHostDevices", resource, f"{NVIDIA_VENDOR_ID:04X}:{device:04X}"), ""


def checked_entries(
    snapshot: NodeSnapshot, domain: str = DEFAULT_DOMAIN
) -> tuple[tuple[PermittedEntry, ...], tuple[str, ...]]:
    """The entries ``snapshot``'s vGPUs justify, and the vGPUs left out with why."""
    found: dict[str, PermittedEntry] = {}
    skipped: list[str] = []
    for gpu in snapshot.gpus:
        if gpu.vendor_id != NVIDIA_VENDOR_ID:
            if gpu.vgpus:
                skipped.append(
                    f"{gpu.address}: vendor {gpu.vendor_id:04x} is not NVIDIA (10de); "
                    f"its {len(gpu.vgpus)} vGPU(s) are left out"
                )
            continue
        known = gpus_sysfs_names([gpu])
        prefix, listed = name_prefix(gpu), _driver_names(gpu)
        for v in gpu.vgpus:
            entry, why = _entry(gpu, v, known, domain, prefix, listed)
            if entry is None:
                skipped.append(why)
            else:
                found.setdefault(entry.resource, entry)
    return tuple(sorted(found.values())), tuple(skipped)


def read_report(obj: Mapping[str, Any], domain: str = DEFAULT_DOMAIN) -> NodeReport:
    """A ``VGPUNodeState`` object (as listed) as a :class:`NodeReport`.

    Forward compatible: fields a newer agent adds are ignored, so only a status
    that lacks a scan or whose scan cannot be decoded is unreadable.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    node = str(
        (spec.get("nodeName") if isinstance(spec, dict) else None) or meta.get("name") or ""
    )
    status = obj.get("status")
    raw = status.get("snapshot") if isinstance(status, dict) else None
    if not isinstance(raw, dict):
        return NodeReport(node, unreadable="its status carries no scan yet")
    try:
        reported = ReportedSnapshot.model_validate(known_fields(ReportedSnapshot, raw))
        snapshot = decode_snapshot(reported)
    except (ValueError, SnapshotDecodeError) as e:
        return NodeReport(node, unreadable=f"its scan cannot be read: {str(e).splitlines()[0]}")
    if str(meta.get("name") or node) != node:
        return NodeReport(node, refused=f"object {meta.get('name')!r} reports node {node!r}")
    problem = scan_problem(node, snapshot)
    if problem is not None:
        return NodeReport(node, refused=problem)
    entries, skipped = checked_entries(snapshot, domain)
    return NodeReport(node, entries, skipped=skipped)
