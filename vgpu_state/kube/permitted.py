"""The KubeVirt CR's permitted host devices, as values: which entries a node's vGPUs need,
what in the CR stops vgpu-state, and the guarded JSON Patch of a change. No I/O here
(:mod:`vgpu_state.kube.kubevirt` reads and writes the CR).

A VM may only request a vGPU resource that
``spec.configuration.permittedHostDevices`` lists. For every vGPU type live on
a node vgpu-state wants one entry, with ``externalResourceProvider: true`` (our
device plugin advertises the resource, not virt-handler):

* mdev types in ``mediatedDevices``: ``mdevNameSelector`` is the type's sysfs
  name (``NVIDIA A2-4Q``);
* vendor-VFIO types (a VF carrying a vGPU type) in ``pciHostDevices``:
  ``pciVendorSelector`` is ``10DE:<the VF's device id>``.

The resource name is :func:`vgpu_state.model.resources.resource_name` of the
sysfs type name, the one rule the device plugin uses too.

Both lists are ``x-kubernetes-list-type: atomic``: a merge patch would replace a
whole list and drop entries another writer added meanwhile. A write is
therefore a JSON Patch that first ``test``s each list it replaces (and the
ownership annotation) against the value it was computed from; when a
container had to be created, it also tests ``metadata.resourceVersion``. The
patch is the ``jsonpatch`` library's difference between the CR read and the CR
wanted, with those guards in front (:mod:`vgpu_state.kube.guardedpatch`), and it
is checked, by applying it to the CR read, before it is sent.

Fencing: a write of the cluster controller also carries its term's token
(:mod:`vgpu_state.kube.fencing`) in the annotation ``vgpu-state.io/writer-term``:
the patch tests it (or, on the term's first write, tests the older token it read
and replaces it), so a write of a deposed term is refused.

Ownership: the annotation ``vgpu-state.io/managed-resources`` lists the resource
names vgpu-state added. Entries not listed there are never changed, removed or
reordered. An owned entry is removed only when the caller's ``keep`` (the
resources some node still reports) leaves it out.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Literal

from vgpu_state.kube.fencing import WRITER_TERM_ANNOTATION
from vgpu_state.kube.guardedpatch import guarded_patch, pointer
from vgpu_state.model import bounded
from vgpu_state.model.ids import NVIDIA_VENDOR_ID
from vgpu_state.model.plan import ClusterAction
from vgpu_state.model.resources import (
    DEFAULT_DOMAIN,
    ResourceNameError,
    driver_type_name,
    name_prefix,
    resource_name,
    sysfs_names,
)
from vgpu_state.model.snapshot import NodeSnapshot, SysfsInterface

JsonObject = dict[str, Any]

OWNERSHIP_ANNOTATION = "vgpu-state.io/managed-resources"
DISABLE_MDEV_GATE = "DisableMDEVConfiguration"

ListName = Literal["mediatedDevices", "pciHostDevices"]
LISTS: tuple[ListName, ...] = ("mediatedDevices", "pciHostDevices")
_SELECTOR: dict[ListName, str] = {
    "mediatedDevices": "mdevNameSelector",
    "pciHostDevices": "pciVendorSelector",
}
_BASE = "/spec/configuration/permittedHostDevices"


@dataclass(frozen=True, order=True)
class PermittedEntry:
    """One entry vgpu-state wants in ``permittedHostDevices``."""

    list: ListName
    resource: str
    selector: str

    def to_json(self) -> JsonObject:
        return {
            _SELECTOR[self.list]: self.selector,
            "resourceName": self.resource,
            "externalResourceProvider": True,
        }

    @property
    def label(self) -> str:
        """How a plan names it: ``mediatedDevices[NVIDIA A2-4Q]``."""
        return f"{self.list}[{self.selector if self.list == 'mediatedDevices' else self.resource}]"


@dataclass(frozen=True)
class EntryChange:
    op: Literal["add", "update", "remove"]
    entry: PermittedEntry

    def describe(self, ref: object) -> str:
        """``+ kubevirt[<ref>].mediatedDevices[NVIDIA A2-4Q]`` (``ref``: NAMESPACE/NAME)."""
        sign = {"add": "+", "update": "~", "remove": "-"}[self.op]
        return f"{sign} kubevirt[{ref}].{self.entry.label}"

    def action(self, ref: object) -> ClusterAction:
        """The change as a plan's cluster action."""
        return ClusterAction(
            op=self.op,
            address=f"kubevirt[{ref}].{self.entry.label}",
            resource=self.entry.resource,
            entry=self.entry.to_json(),
        )


@dataclass(frozen=True)
class Blocker:
    """Something in the KubeVirt CR that makes it unsafe for vgpu-state to manage vGPUs."""

    reason: str
    message: str


@dataclass(frozen=True)
class Desired:
    """The entries a node's live vGPU types need, and types that cannot have one."""

    entries: tuple[PermittedEntry, ...]
    problems: tuple[str, ...] = ()

    @property
    def resources(self) -> frozenset[str]:
        return frozenset(e.resource for e in self.entries)


@dataclass(frozen=True)
class KubeVirtPlan:
    """What a write to the CR would change, computed from one read of it."""

    changes: tuple[EntryChange, ...]
    patch: tuple[JsonObject, ...]
    foreign: tuple[str, ...] = ()
    """Resources we need that an entry vgpu-state does not own already lists."""
    managed: tuple[str, ...] = ()
    """The ownership annotation after the write."""
    resource_version: str = ""
    wanted: JsonObject | None = field(default=None, compare=False, repr=False)
    """The CR the patch gives, applied to the read it was computed from (checked before
    it is sent: :func:`vgpu_state.kube.guardedpatch.send`); ``None`` without a patch."""


# desired entries --------------------------------------------------------------------
def desired_entries(snapshot: NodeSnapshot, domain: str = DEFAULT_DOMAIN) -> Desired:
    """One entry per vGPU type live on the node (sorted, no duplicates).

    A vGPU of an expected snapshot (one a plan will create) carries no sysfs
    name yet; the driver's name for its type id is taken from the snapshot's
    creatable types, else made from the product prefix the driver gives the
    GPU's other types. When neither is known (a GPU whose VFs do not exist
    yet), the entry is left out with a problem saying so.
    """
    found: dict[tuple[ListName, str], PermittedEntry] = {}
    problems: list[str] = []
    known = sysfs_names(snapshot)
    for gpu in snapshot.gpus:
        prefix = name_prefix(gpu)
        for v in gpu.vgpus:
            name = driver_type_name(v, known, prefix)
            if not name:
                what = v.type_label
                problems.append(
                    f"vGPU {v.key or '(new)'} on {gpu.address} ({what}): the driver's name of "
                    "its type is not known yet, so its KubeVirt CR entry is not shown"
                )
                continue
            try:
                resource = resource_name(name, domain)
            except ResourceNameError as e:
                problems.append(str(e))
                continue
            entry: PermittedEntry
            if v.kind == "mdev":
                entry = PermittedEntry("mediatedDevices", resource, name)
            else:
                vf = gpu.vf(v.parent)
                device = vf.device_id if vf is not None and vf.device_id else gpu.device_id
                entry = PermittedEntry(
                    "pciHostDevices", resource, f"{NVIDIA_VENDOR_ID:04X}:{device:04X}"
                )
            found.setdefault((entry.list, entry.resource), entry)
    return Desired(tuple(sorted(found.values())), tuple(problems))


# reading the CR -------------------------------------------------------------------
def managed_resources(cr: Mapping[str, Any]) -> frozenset[str]:
    """The resource names the ownership annotation lists (a malformed one lists none)."""
    raw = ((cr.get("metadata") or {}).get("annotations") or {}).get(OWNERSHIP_ANNOTATION)
    if not raw:
        return frozenset()
    try:
        value = bounded.loads(str(raw), OWNERSHIP_ANNOTATION)
    except ValueError:
        return frozenset(p.strip() for p in str(raw).split(",") if p.strip())
    if isinstance(value, list):
        return frozenset(str(v) for v in value)
    return frozenset()


def permitted(cr: Mapping[str, Any]) -> dict[ListName, list[JsonObject]]:
    devices = _get(cr, "spec", "configuration", "permittedHostDevices") or {}
    return {name: list(devices.get(name) or []) for name in LISTS}


def blockers(
    cr: Mapping[str, Any], node_labels: Mapping[str, str], snapshot: NodeSnapshot | None = None
) -> tuple[Blocker, ...]:
    """Why vgpu-state must not create or remove mdevs on this node while the CR is as it is.

    KubeVirt's own mediated-device handling creates mdevs of the types it is told
    to (``mediatedDevicesConfiguration``) on every free parent and removes every
    mdev of other types, unless ``mediatedDevicesConfiguration.enabled`` is
    ``false`` (KubeVirt 1.8+) or the ``DisableMDEVConfiguration`` feature gate is
    listed. Nodes without mdev-layout GPUs are not affected.

    On a node with vendor-VFIO GPUs, a ``pciHostDevices`` entry vgpu-state does not own
    and without ``externalResourceProvider: true`` whose ``pciVendorSelector`` matches
    one of the node's vGPU VFs blocks too: KubeVirt (1.9 and later) would advertise
    those VFs itself under that entry's resource name, next to vgpu-state's.
    """
    found: list[Blocker] = []
    if snapshot is not None:
        found.extend(_vf_blockers(cr, snapshot))
        if not any(g.layout == SysfsInterface.MDEV for g in snapshot.gpus):
            return tuple(found)
    config = _get(cr, "spec", "configuration") or {}
    mdev_config = config.get("mediatedDevicesConfiguration") or {}
    gates = (config.get("developerConfiguration") or {}).get("featureGates") or []
    enabled = mdev_config.get("enabled")
    types = _node_mdev_types(mdev_config, node_labels)
    handled = enabled is True or (enabled is None and DISABLE_MDEV_GATE not in gates)
    if types and handled:
        found.append(
            Blocker(
                "KubeVirtMdevManagementActive",
                "KubeVirt manages mediated devices on this node (mediatedDevicesConfiguration "
                f"asks for {', '.join(sorted(types))}); virt-handler would create its own vGPUs "
                "and remove the ones vgpu-state creates. Set spec.configuration."
                "mediatedDevicesConfiguration.enabled: false in the KubeVirt CR (KubeVirt 1.8 "
                f"or later) or add the {DISABLE_MDEV_GATE} feature gate to spec.configuration."
                "developerConfiguration.featureGates, and let vgpu-state own the layout.",
            )
        )
    owners = (cr.get("metadata") or {}).get("ownerReferences") or []
    if any(isinstance(o, dict) and o.get("kind") == "HyperConverged" for o in owners):
        found.append(
            Blocker(
                "KubeVirtManagedByHCO",
                "the KubeVirt CR is owned by a HyperConverged CR, whose operator reverts edits "
                "to permittedHostDevices; list the vGPU resources in the HyperConverged CR's "
                "spec.permittedHostDevices (with externalResourceProvider: true) instead.",
            )
        )
    return tuple(found)


def _vf_blockers(cr: Mapping[str, Any], snapshot: NodeSnapshot) -> list[Blocker]:
    """:func:`blockers`' foreign ``pciHostDevices`` entries over this node's vGPU VFs."""
    selectors = {
        f"{NVIDIA_VENDOR_ID:04X}:{(vf.device_id or gpu.device_id):04X}"
        for gpu in snapshot.gpus
        if gpu.layout == SysfsInterface.VENDOR_VFIO and gpu.vendor_id == NVIDIA_VENDOR_ID
        for vf in gpu.vfs
    }
    if not selectors:
        return []
    owned = managed_resources(cr)
    found: list[Blocker] = []
    for item in permitted(cr)["pciHostDevices"]:
        if not isinstance(item, dict):
            continue
        resource = str(item.get("resourceName") or "")
        selector = str(item.get("pciVendorSelector") or "").strip().upper()
        if resource in owned or item.get("externalResourceProvider") is True:
            continue
        if selector in selectors:
            found.append(
                Blocker(
                    "KubeVirtAdvertisesVFs",
                    f"the KubeVirt CR's pciHostDevices entry {resource or '(no name)'} "
                    f"(pciVendorSelector {selector}) is not vgpu-state's and lacks "
                    "externalResourceProvider: true, so KubeVirt (1.9 or later) advertises "
                    "this node's vGPU VFs under it as well as vgpu-state does under "
                    "nvidia.com/<type>: one VF under two resource names. Set "
                    "externalResourceProvider: true on that entry, or remove it.",
                )
            )
    return found


def _node_mdev_types(mdev_config: Mapping[str, Any], labels: Mapping[str, str]) -> set[str]:
    """The types KubeVirt would configure on a node with ``labels``."""
    per_node: set[str] = set()
    for item in mdev_config.get("nodeMediatedDeviceTypes") or []:
        selector = item.get("nodeSelector") or {}
        if all(labels.get(k) == v for k, v in selector.items()):
            per_node.update(item.get("mediatedDeviceTypes") or [])
            per_node.update(item.get("mediatedDevicesTypes") or [])
    if per_node:
        return per_node
    return set(mdev_config.get("mediatedDeviceTypes") or []) | set(
        mdev_config.get("mediatedDevicesTypes") or []
    )


# planning a write -----------------------------------------------------------------
def plan_write(
    cr: Mapping[str, Any],
    desired: Iterable[PermittedEntry],
    keep: Set[str] | None = None,
    *,
    fence: str | None = None,
) -> KubeVirtPlan:
    """The changes and the guarded JSON Patch that bring ``cr`` to hold ``desired``.

    ``keep``: when given, the resources that must stay; owned entries whose
    resource is neither there nor in ``desired`` are removed. ``None`` removes
    nothing. The first entry of ``desired`` for a resource wins.

    ``fence``: the writer's term token. The patch tests that the CR's writer-term
    annotation still holds what was read and sets it to ``fence``; a CR whose
    annotation is not ``fence`` yet gets that patch even when nothing else changes
    (the caller decides that its term may claim the CR:
    :func:`vgpu_state.kube.fencing.standing`).
    """
    owned = managed_resources(cr)
    lists = permitted(cr)
    new_lists = {name: [copy.deepcopy(e) for e in items] for name, items in lists.items()}
    changes: list[EntryChange] = []
    foreign: list[str] = []
    wanted: list[PermittedEntry] = []
    seen: set[str] = set()
    for entry in desired:
        if entry.resource not in seen:
            seen.add(entry.resource)
            wanted.append(entry)
    added: set[str] = set()
    for entry in wanted:
        items = new_lists[entry.list]
        index = next(
            (i for i, item in enumerate(items) if item.get("resourceName") == entry.resource), None
        )
        other = next(
            (
                name
                for name in LISTS
                if name != entry.list
                and any(i.get("resourceName") == entry.resource for i in new_lists[name])
            ),
            None,
        )
        if index is None and other is not None and entry.resource not in owned:
            foreign.append(entry.resource)
            continue
        if index is None and other is not None:
            # Our entry changes kind (every node now reports the other one): moved, so the
            # resource is never listed twice.
            new_lists[other] = [
                i for i in new_lists[other] if i.get("resourceName") != entry.resource
            ]
            items.append(entry.to_json())
            changes.append(EntryChange("update", entry))
        elif index is None:
            items.append(entry.to_json())
            changes.append(EntryChange("add", entry))
            added.add(entry.resource)
        elif entry.resource not in owned:
            foreign.append(entry.resource)
        elif items[index] != entry.to_json():
            items[index] = entry.to_json()
            changes.append(EntryChange("update", entry))
    removed: set[str] = set()
    if keep is not None:
        for name in LISTS:
            kept: list[JsonObject] = []
            for item in new_lists[name]:
                res = item.get("resourceName")
                if res in owned and res not in seen and res not in keep:
                    removed.add(str(res))
                    changes.append(EntryChange("remove", _entry_of(name, item)))
                else:
                    kept.append(item)
            new_lists[name] = kept
    managed = sorted((owned | added) - removed)
    ops: list[JsonObject] = []
    after: JsonObject | None = None
    claim = fence is not None and _annotation(cr, WRITER_TERM_ANNOTATION) != fence
    if changes or set(managed) != owned or claim:
        after = _wanted(cr, lists, new_lists, managed, fence)
        ops = _patch(cr, after, fence=fence)
    rv = str(_get(cr, "metadata", "resourceVersion") or "")
    return KubeVirtPlan(
        tuple(changes),
        tuple(ops),
        tuple(sorted(set(foreign))),
        tuple(managed),
        rv,
        after if ops else None,
    )


def _annotation(cr: Mapping[str, Any], key: str) -> Any:
    annotations = _get(cr, "metadata", "annotations")
    return annotations.get(key) if isinstance(annotations, dict) else None


def _annotation_path(key: str) -> str:
    return pointer("metadata", "annotations", key)


def _entry_of(name: ListName, item: Mapping[str, Any]) -> PermittedEntry:
    return PermittedEntry(
        name, str(item.get("resourceName", "")), str(item.get(_SELECTOR[name], ""))
    )


def _wanted(
    cr: Mapping[str, Any],
    old: Mapping[ListName, list[JsonObject]],
    new: Mapping[ListName, list[JsonObject]],
    managed: list[str],
    fence: str | None,
) -> JsonObject:
    """The CR after the write: the changed lists (and the containers they need), the
    ownership annotation and, with ``fence``, the writer's term."""
    wanted = copy.deepcopy(dict(cr))
    changed = [name for name in LISTS if old[name] != new[name]]
    if changed:
        devices = _child(_child(_child(wanted, "spec"), "configuration"), "permittedHostDevices")
        for name in changed:
            devices[name] = copy.deepcopy(new[name])
    annotations = _child(_child(wanted, "metadata"), "annotations")
    annotations[OWNERSHIP_ANNOTATION] = json.dumps(managed)
    if fence is not None:
        annotations[WRITER_TERM_ANNOTATION] = fence
    return wanted


def _child(obj: JsonObject, key: str) -> JsonObject:
    if not isinstance(obj.get(key), dict):
        obj[key] = {}
    child: JsonObject = obj[key]
    return child


_ATOMIC = tuple(f"{_BASE}/{name}" for name in LISTS)
"""``x-kubernetes-list-type: atomic``: tested as read and replaced whole."""


def _patch(
    cr: Mapping[str, Any], wanted: Mapping[str, Any], *, fence: str | None
) -> list[JsonObject]:
    """The guarded JSON Patch from ``cr`` to ``wanted`` (:func:`guarded_patch`).

    Every list it replaces is tested as read, and so is the ownership annotation, even
    when it stays: a writer that changed it meanwhile (e.g. removed an entry we would
    re-add) makes this write fail and re-plan. With ``fence`` the writer's term is
    tested as read too (and set to ``fence`` when it is not yet). Whatever the patch adds
    that the read lacked (a container, the annotations, the term on a CR never claimed)
    makes it test ``metadata.resourceVersion`` first.
    """
    guards = [_annotation_path(OWNERSHIP_ANNOTATION)]
    if fence is not None:
        guards.append(_annotation_path(WRITER_TERM_ANNOTATION))
    return guarded_patch(cr, wanted, atomic=_ATOMIC, guards=guards)


def _get(obj: Mapping[str, Any], *keys: str) -> Any:
    cur: Any = obj
    for key in keys:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur
