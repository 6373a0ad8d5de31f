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

Then the admin's layouts document bounds what is left
(:class:`~vgpu_state.controller.bounds.LayoutBounds`): a vGPU whose type the
document does not name, whose kind the GPU's interface and the catalog do not
agree on, or whose name or VF device id is not the catalog's, is *outside* and
justifies nothing. A report keeps only a bounded summary of what it left out,
so a status listing 10,000 made-up types costs the controller a few lines.

A status whose scan names another node or repeats a PCI address is refused
whole (:func:`~vgpu_state.model.snapshot.scan_problem`); one that cannot be
read at all is *unreadable*, which the controller treats as "may still need
anything".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu_state.catalog import GpuModel
from vgpu_state.catalog.names import parse_type_name, short_type_name
from vgpu_state.controller.bounds import NOTHING, LayoutBounds, Summary
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
    skipped: Summary = NOTHING
    """vGPUs left out for want of a fact (a name not reported, a VF not found): how many, the
    first few with the reason."""
    outside: Summary = NOTHING
    """vGPUs the layouts document and the catalog do not allow (a type the document does not
    name, a kind or selector the catalog disagrees with): how many, the first few with why."""

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
    gpu: Gpu,
    v: Vgpu,
    known: dict[int, str],
    domain: str,
    prefix: str | None,
    bounds: LayoutBounds,
    model: GpuModel | None,
    listed: set[str],
) -> tuple[PermittedEntry | None, str, bool]:
    """The vGPU's entry, or why not and whether the bounds refused it (else a fact lacks);
    ``prefix`` and ``listed`` are the GPU's :func:`name_prefix` and :func:`_driver_names`
    (worked out once per GPU: each reads all its VFs' lists)."""
    where = f"vGPU {v.key} on {gpu.address}"
    name = driver_type_name(v, known, prefix)
    if not name:
        return None, f"{where}: the driver's name of its type is not reported", False
    if parse_type_name(name) is None:
        return None, f"{where}: {name!r} is not an NVIDIA vGPU type name", True
    if short_type_name(name) not in listed:
        return None, f"{where}: type {name!r} is not one the GPU's driver lists", True
    device: int | None = None
    if v.kind != "mdev":
        vf = gpu.vf(v.parent)
        if vf is None:
            return None, f"{where}: its VF {v.parent} is not one of the GPU's VFs", False
        device = vf.device_id if vf.device_id else gpu.device_id
    outside = bounds.check(gpu, model, v.kind, name, device)
    if outside is not None:
        return None, f"{where}: {outside}", True
    try:
        resource = resource_name(name, domain)
    except ResourceNameError as e:
        return None, f"{where}: {e}", True
    if device is None:
        return PermittedEntry("mediatedDevices", resource, name), "", False
    selector = f"{NVIDIA_VENDOR_ID:04X}:{device:04X}"
    return PermittedEntry("pciHostDevices", resource, selector), "", False


class _Tally:
    """Counts items and keeps the first :attr:`Summary.LIMIT` of them."""

    def __init__(self) -> None:
        self.count = 0
        self.first: list[str] = []

    def add(self, item: str) -> None:
        self.count += 1
        if len(self.first) < Summary.LIMIT:
            cut = item if len(item) <= Summary.WIDTH else item[: Summary.WIDTH - 1] + "…"
            self.first.append(cut)

    def summary(self) -> Summary:
        return Summary(self.count, tuple(self.first))


@dataclass(frozen=True)
class Checked:
    """What one scan justifies within the bounds, and bounded accounts of the rest."""

    entries: tuple[PermittedEntry, ...]
    skipped: Summary = NOTHING
    outside: Summary = NOTHING


def checked_entries(
    snapshot: NodeSnapshot, bounds: LayoutBounds, domain: str = DEFAULT_DOMAIN
) -> Checked:
    """The entries ``snapshot``'s vGPUs justify within ``bounds``, and what was left out.

    A resource two of the node's own vGPUs claim with different entries (an mdev and a VF
    of one type) is outside: the node disagrees with itself.
    """
    found: dict[str, PermittedEntry] = {}
    skipped, outside = _Tally(), _Tally()
    split: set[str] = set()
    for gpu in snapshot.gpus:
        if gpu.vendor_id != NVIDIA_VENDOR_ID:
            if gpu.vgpus:
                outside.add(
                    f"{gpu.address}: vendor {gpu.vendor_id:04x} is not NVIDIA (10de); "
                    f"its {len(gpu.vgpus)} vGPU(s) are left out"
                )
            continue
        known = gpus_sysfs_names([gpu])
        model = bounds.model(gpu)
        prefix, listed = name_prefix(gpu), _driver_names(gpu)
        for v in gpu.vgpus:
            entry, why, refused = _entry(gpu, v, known, domain, prefix, bounds, model, listed)
            if entry is None:
                (outside if refused else skipped).add(why)
            elif found.setdefault(entry.resource, entry) != entry and entry.resource not in split:
                split.add(entry.resource)
                outside.add(
                    f"vGPU {v.key} on {gpu.address}: {entry.resource} is also reported as "
                    f"{found[entry.resource].label}, not {entry.label}"
                )
    entries = tuple(sorted(e for e in found.values() if e.resource not in split))
    return Checked(entries, skipped.summary(), outside.summary())


def read_report(
    obj: Mapping[str, Any], bounds: LayoutBounds, domain: str = DEFAULT_DOMAIN
) -> NodeReport:
    """A ``VGPUNodeState`` object (as listed) as a :class:`NodeReport` within ``bounds``.

    Forward compatible: fields a newer agent adds are ignored, so only a status
    that lacks a scan or whose scan cannot be decoded is unreadable.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    node = str((spec.get("nodeName") if isinstance(spec, dict) else None) or meta.get("name") or "")
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
        # Named by the object, so the refusal is said on the object that made the claim.
        name = str(meta.get("name"))
        return NodeReport(name, refused=f"object {name!r} reports node {node!r}")
    problem = scan_problem(node, snapshot)
    if problem is not None:
        return NodeReport(node, refused=problem)
    checked = checked_entries(snapshot, bounds, domain)
    return NodeReport(node, checked.entries, skipped=checked.skipped, outside=checked.outside)
