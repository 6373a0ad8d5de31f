"""The KubeVirt CR's permitted host devices: which entries a node needs, and a safe write.

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
whole list and drop entries another writer added meanwhile. Every write is
therefore a JSON Patch that first ``test``s each list it replaces (and the
ownership annotation) against the value it was computed from; when a
container had to be created, it also tests ``metadata.resourceVersion``. If
anything changed in between, the API server refuses the patch (422), and
:func:`sync` reads again and retries after a jittered backoff.

Many nodes adding at once all test the same lists, so only one write per read
can win. A node that loses (``sync`` with ``node``) leaves what it still needs
in a request annotation of its own on the CR (``pending.vgpu-state.io/<node>``,
an unguarded write that conflicts with nobody), and every guarded write adds
the entries of every request it sees and removes those requests in the same
patch. One winning write thus serves every node that lost before it, and the
losers find their entries present on their next read instead of writing again.

Ownership: the annotation ``vgpu-state.io/managed-resources`` lists the resource
names vgpu-state added. Entries not listed there are never changed, removed or
reordered. An owned entry is removed only when the caller says no node still
advertises it (:func:`sync`'s ``keep``), which the cluster adapter only does
while holding the cluster-duties Lease, and no request on the CR asks for it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Literal

from vgpu_state.kube.api import ConflictError, InvalidError, JsonObject, KubeApi, path_of
from vgpu_state.kube.errors import ClusterConflictError, ClusterError, NotFoundError
from vgpu_state.model.ids import NVIDIA_VENDOR_ID
from vgpu_state.model.plan import ClusterAction
from vgpu_state.model.resources import (
    DEFAULT_DOMAIN,
    ResourceNameError,
    driver_type_name,
    name_prefix,
    resource_name,
    resource_name_problem,
    sysfs_names,
)
from vgpu_state.model.snapshot import NodeSnapshot, SysfsInterface

log = logging.getLogger(__name__)

OWNERSHIP_ANNOTATION = "vgpu-state.io/managed-resources"
PENDING_PREFIX = "pending.vgpu-state.io/"
"""Annotations ``pending.vgpu-state.io/<node>``: entries a node still needs."""
DISABLE_MDEV_GATE = "DisableMDEVConfiguration"

ListName = Literal["mediatedDevices", "pciHostDevices"]
LISTS: tuple[ListName, ...] = ("mediatedDevices", "pciHostDevices")
_SELECTOR: dict[ListName, str] = {
    "mediatedDevices": "mdevNameSelector",
    "pciHostDevices": "pciVendorSelector",
}
_BASE = "/spec/configuration/permittedHostDevices"
_PCI_SELECTOR = re.compile(r"[0-9A-F]{4}:[0-9A-F]{4}")


@dataclass(frozen=True, order=True)
class KubeVirtRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> KubeVirtRef:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"{text!r}: expected NAMESPACE/NAME of the KubeVirt CR")
        return cls(namespace, name)

    @property
    def path(self) -> str:
        return path_of("kubevirt.io", "v1", "kubevirts", self.name, self.namespace)


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
    requested_by: str = ""
    """The request annotation the entry was added for (another node's); empty: our own."""

    def describe(self, ref: KubeVirtRef) -> str:
        sign = {"add": "+", "update": "~", "remove": "-"}[self.op]
        text = f"{sign} kubevirt[{ref}].{self.entry.label}"
        if self.requested_by:
            text += f" (requested by {self.requested_by})"
        return text

    def action(self, ref: KubeVirtRef) -> ClusterAction:
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
    served: tuple[str, ...] = ()
    """Request annotations (other nodes' pending entries) this write settles and removes."""

    @property
    def own_changes(self) -> tuple[EntryChange, ...]:
        return tuple(c for c in self.changes if not c.requested_by)


@dataclass
class SyncResult:
    ref: KubeVirtRef
    changes: tuple[EntryChange, ...] = ()
    """What this node's write changed (its own entries, removals, other nodes' requests)."""
    foreign: tuple[str, ...] = ()
    attempts: int = 0
    conflicts: int = 0
    waited: float = 0.0
    problems: tuple[str, ...] = field(default=())
    requested: int = 0
    """How often this node left its missing entries as a request on the CR."""
    served: tuple[str, ...] = ()
    """Request annotations of other nodes that this node's write settled."""

    @property
    def own_changes(self) -> tuple[EntryChange, ...]:
        return tuple(c for c in self.changes if not c.requested_by)


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
                what = v.type_name or f"type id {v.type_id}"
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
        value = json.loads(raw)
    except ValueError:
        return frozenset(p.strip() for p in str(raw).split(",") if p.strip())
    if isinstance(value, list):
        return frozenset(str(v) for v in value)
    return frozenset()


def pending_key(node: str) -> str:
    """The request annotation of ``node``: ``pending.vgpu-state.io/<node>``.

    An annotation's name part holds at most 63 characters; a longer node name
    keeps its first 46 and gets a hash of the whole name.
    """
    if len(node) <= 63:
        return PENDING_PREFIX + node
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return f"{PENDING_PREFIX}{node[:46].rstrip('.-_')}-{digest}"


def encode_request(entries: Iterable[PermittedEntry]) -> str:
    """A request annotation's value: ``[[list, resourceName, selector], ...]`` (compact JSON)."""
    return json.dumps(
        [[e.list, e.resource, e.selector] for e in sorted(set(entries))], separators=(",", ":")
    )


def decode_request(value: Any) -> tuple[PermittedEntry, ...]:
    """The entries of a request annotation; a malformed value or item yields none of it.

    Only the shapes vgpu-state writes are read back: a known list, a non-empty
    resource name and selector. Anything else is dropped, never written to the CR.
    """
    try:
        items = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return ()
    if not isinstance(items, list):
        return ()
    found: list[PermittedEntry] = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 3 and item[0] in LISTS):
            continue
        name, resource, selector = item
        if not isinstance(resource, str) or resource_name_problem(resource) is not None:
            continue
        if name == "pciHostDevices":
            if not (isinstance(selector, str) and _PCI_SELECTOR.fullmatch(selector)):
                continue
        elif not (
            isinstance(selector, str)
            and 0 < len(selector) <= 128
            and selector.strip() == selector
            and selector.isprintable()
        ):
            continue
        found.append(PermittedEntry(name, resource, selector))
    return tuple(found)


def pending_requests(cr: Mapping[str, Any]) -> dict[str, tuple[PermittedEntry, ...]]:
    """Every request annotation on the CR: key -> the entries it asks for (sorted by key)."""
    annotations = _get(cr, "metadata", "annotations")
    if not isinstance(annotations, dict):
        return {}
    return {
        key: decode_request(value)
        for key, value in sorted(annotations.items())
        if key.startswith(PENDING_PREFIX)
    }


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
    """
    found: list[Blocker] = []
    if snapshot is not None and not any(g.layout == SysfsInterface.MDEV for g in snapshot.gpus):
        return ()
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
def plan(
    cr: Mapping[str, Any],
    desired: Iterable[PermittedEntry],
    keep: Set[str] | None = None,
    *,
    serve_requests: bool = False,
    own_request: str | None = None,
) -> KubeVirtPlan:
    """The changes and the guarded JSON Patch that bring ``cr`` to hold ``desired``.

    ``keep``: when given, the resources some node still advertises; owned entries
    whose resource is neither there nor in ``desired`` are removed. ``None``
    removes nothing.

    ``serve_requests``: also add the entries of every request annotation on the
    CR (after ``desired``; the first entry for a resource wins) and remove those
    annotations in the same patch (one already gone makes the patch fail).
    ``own_request``: the writer's own request annotation, removed by the write
    like the others but never read (``desired`` says what the writer needs now);
    without ``serve_requests`` the only request the write settles.
    """
    owned = managed_resources(cr)
    lists = permitted(cr)
    new_lists = {name: [copy.deepcopy(e) for e in items] for name, items in lists.items()}
    changes: list[EntryChange] = []
    foreign: list[str] = []
    own = list(desired)
    own_resources = {e.resource for e in own}
    requests = pending_requests(cr)
    if not serve_requests:
        requests = {k: v for k, v in requests.items() if k == own_request}
    wanted: list[tuple[PermittedEntry, str]] = [(e, "") for e in own]
    seen = set(own_resources)
    for key, requested in requests.items():
        if key == own_request:
            continue  # the writer's own request: ``desired`` is what it needs now
        for entry in requested:
            if entry.resource not in seen:
                seen.add(entry.resource)
                wanted.append((entry, key.removeprefix(PENDING_PREFIX)))
    wanted_resources = seen
    added: set[str] = set()
    for entry, requester in wanted:
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
            if not requester:
                foreign.append(entry.resource)
            continue
        if index is None:
            items.append(entry.to_json())
            changes.append(EntryChange("add", entry, requester))
            added.add(entry.resource)
        elif entry.resource not in owned:
            if not requester:
                foreign.append(entry.resource)
        elif items[index] != entry.to_json() and not requester:
            # Another node's request never rewrites an entry that is already there.
            items[index] = entry.to_json()
            changes.append(EntryChange("update", entry))
    removed: set[str] = set()
    if keep is not None:
        for name in LISTS:
            kept: list[JsonObject] = []
            for item in new_lists[name]:
                res = item.get("resourceName")
                if res in owned and res not in wanted_resources and res not in keep:
                    removed.add(str(res))
                    changes.append(EntryChange("remove", _entry_of(name, item)))
                else:
                    kept.append(item)
            new_lists[name] = kept
    managed = sorted((owned | added) - removed)
    ops: list[JsonObject] = []
    if changes or set(managed) != owned or requests:
        ops = _patch(cr, lists, new_lists, owned, managed)
        # No test of a request's value: a request rewritten meanwhile is removed unserved,
        # and its node, which returns only once it reads its entries in the CR, asks again.
        ops.extend({"op": "remove", "path": _annotation_path(key)} for key in requests)
    rv = str(_get(cr, "metadata", "resourceVersion") or "")
    return KubeVirtPlan(
        tuple(changes),
        tuple(ops),
        tuple(sorted(set(foreign))),
        tuple(managed),
        rv,
        tuple(requests),
    )


def _annotation_path(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def _entry_of(name: ListName, item: Mapping[str, Any]) -> PermittedEntry:
    return PermittedEntry(
        name, str(item.get("resourceName", "")), str(item.get(_SELECTOR[name], ""))
    )


def _patch(
    cr: Mapping[str, Any],
    old: Mapping[ListName, list[JsonObject]],
    new: Mapping[ListName, list[JsonObject]],
    owned: frozenset[str],
    managed: list[str],
) -> list[JsonObject]:
    ops: list[JsonObject] = []
    guard_version = False
    devices = _get(cr, "spec", "configuration", "permittedHostDevices")
    changed = [name for name in LISTS if old[name] != new[name]]
    if changed and not isinstance(devices, dict):
        guard_version = True
        body = {name: new[name] for name in changed}
        if not isinstance(_get(cr, "spec", "configuration"), dict):
            if not isinstance(cr.get("spec"), dict):
                ops.append({"op": "add", "path": "/spec", "value": {}})
            ops.append({"op": "add", "path": "/spec/configuration", "value": {}})
        ops.append({"op": "add", "path": _BASE, "value": body})
    else:
        for name in changed:
            path = f"{_BASE}/{name}"
            if isinstance(devices, dict) and name in devices:
                ops.append({"op": "test", "path": path, "value": devices[name]})
                ops.append({"op": "replace", "path": path, "value": new[name]})
            else:
                guard_version = True
                ops.append({"op": "add", "path": path, "value": new[name]})
    annotations = _get(cr, "metadata", "annotations")
    key = _annotation_path(OWNERSHIP_ANNOTATION)
    value = json.dumps(managed)
    if not isinstance(annotations, dict):
        guard_version = True
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        ops.append({"op": "add", "path": key, "value": value})
    elif OWNERSHIP_ANNOTATION not in annotations:
        guard_version = True
        ops.append({"op": "add", "path": key, "value": value})
    elif annotations[OWNERSHIP_ANNOTATION] != value or managed != sorted(owned):
        ops.append({"op": "test", "path": key, "value": annotations[OWNERSHIP_ANNOTATION]})
        ops.append({"op": "replace", "path": key, "value": value})
    else:
        # Unchanged ownership still guards the lists: a writer that changed it meanwhile
        # (e.g. removed an entry we would re-add) makes this write fail and re-plan.
        ops.append({"op": "test", "path": key, "value": annotations[OWNERSHIP_ANNOTATION]})
    if guard_version:
        rv = _get(cr, "metadata", "resourceVersion")
        if rv is not None:
            ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": rv})
    return ops


def _get(obj: Mapping[str, Any], *keys: str) -> Any:
    cur: Any = obj
    for key in keys:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


# the write ----------------------------------------------------------------------------
def find(api: KubeApi, ref: KubeVirtRef | None) -> KubeVirtRef:
    """``ref``, or the one KubeVirt CR in the cluster."""
    if ref is not None:
        return ref
    try:
        items = api.list(path_of("kubevirt.io", "v1", "kubevirts"))
    except NotFoundError as e:
        raise ClusterError(
            "KubeVirt is not installed: the API server serves no kubevirt.io/v1 KubeVirt resource"
        ) from e
    refs = sorted(
        KubeVirtRef(str(_get(i, "metadata", "namespace")), str(_get(i, "metadata", "name")))
        for i in items
    )
    if not refs:
        raise ClusterError("no KubeVirt CR found in the cluster (is KubeVirt deployed?)")
    if len(refs) > 1:
        raise ClusterError(
            f"{len(refs)} KubeVirt CRs found ({', '.join(map(str, refs))}); name the one to "
            "manage as NAMESPACE/NAME"
        )
    return refs[0]


def read(api: KubeApi, ref: KubeVirtRef) -> JsonObject:
    try:
        return api.get(ref.path)
    except NotFoundError as e:
        raise ClusterError(f"KubeVirt CR {ref} not found") from e


@dataclass(frozen=True)
class Backoff:
    """Full-jitter exponential backoff: attempt n sleeps uniform(0, min(cap, base * 2**n))."""

    base: float = 0.05
    cap: float = 2.0
    attempts: int = 40

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.cap, self.base * (2**attempt)))


def sync(
    api: KubeApi,
    ref: KubeVirtRef,
    desired: Iterable[PermittedEntry],
    keep: Callable[[], Set[str]] | None = None,
    *,
    node: str | None = None,
    backoff: Backoff = Backoff(),
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> SyncResult:
    """Bring the CR to hold ``desired`` (and drop unadvertised owned entries if ``keep``).

    Read, plan, send the guarded patch; on 409 or 422 read again and retry after
    a jittered backoff. A 422 on an object that did not change since it was read
    is a real refusal (an invalid patch) and is raised at once.

    With ``node`` (the node's name), the write also adds what other nodes'
    request annotations ask for, and a lost race leaves this node's missing
    entries in its own request annotation before the backoff, so that whichever
    node writes next adds them too. The result is returned only once a read or
    this node's own accepted write shows every entry in the CR (or held by an
    entry vgpu-state does not own); after ``backoff.attempts`` lost races it
    raises :class:`ClusterConflictError`, and the request stays for the next
    writer.
    """
    wanted = tuple(desired)
    rng = rng or random.Random()
    result = SyncResult(ref)
    serve = node is not None
    cr = read(api, ref)
    failed_on: str | None = None
    served_last = False
    for attempt in range(backoff.attempts):
        if failed_on is not None and _rv(cr) == failed_on:
            raise ClusterError(
                f"KubeVirt CR {ref}: the API server refused the update although the CR did not "
                "change since it was read"
            )
        p = plan(
            cr,
            wanted,
            keep() if keep is not None else None,
            serve_requests=serve,
            own_request=pending_key(node) if node is not None else None,
        )
        served_last = bool(p.served)
        result.attempts = attempt + 1
        result.foreign = p.foreign
        if not p.patch:
            return result
        try:
            api.patch(ref.path, list(p.patch), "json")
        except (ConflictError, InvalidError) as e:
            result.conflicts += 1
            if not p.own_changes:
                # Our entries are all in (the read shows them); the write only carried
                # other nodes' requests, which the next writer or they themselves settle.
                log.debug("KubeVirt CR %s: requests not settled (%s); left to others", ref, e)
                return result
            if node is None:
                failed_on = _rv(cr) if isinstance(e, InvalidError) else None
            else:
                fresh = read(api, ref)
                if isinstance(e, InvalidError) and _rv(fresh) == _rv(cr):
                    if not served_last:
                        raise ClusterError(
                            f"KubeVirt CR {ref}: the API server refused the update although "
                            "the CR did not change since it was read"
                        ) from e
                    # Perhaps a request made the write invalid: write our own entries alone.
                    log.warning("KubeVirt CR %s refused a write with other nodes' requests", ref)
                    serve, cr = False, fresh
                    continue
                # Ask only for what the CR still lacks now: in a fleet most types are
                # added by another node in the meantime, and then no request is written.
                missing = [c.entry for c in plan(fresh, wanted).own_changes if c.op == "add"]
                if _request(api, ref, fresh, node, missing) is not None:
                    result.requested += 1
            delay = backoff.delay(attempt, rng)
            result.waited += delay
            log.debug("KubeVirt CR %s changed meanwhile (%s); retrying in %.3f s", ref, e, delay)
            sleep(delay)
            cr = read(api, ref)
            continue
        result.changes = p.changes
        result.served = tuple(k for k in p.served if k != pending_key(node or ""))
        for change in p.changes:
            log.info("%s", change.describe(ref))
        return result
    waiting = (
        f"; its missing entries wait in the request annotation {pending_key(node)}, which "
        "the next write by any vgpu-state agent adds"
        if node is not None and pending_key(node) in _annotations(cr)
        else ""
    )
    raise ClusterConflictError(
        f"KubeVirt CR {ref}: {result.conflicts} concurrent changes in a row; this node's "
        f"entries are not all in it yet{waiting}"
    )


def _rv(cr: Mapping[str, Any]) -> str:
    return str(_get(cr, "metadata", "resourceVersion") or "")


def _annotations(cr: Mapping[str, Any]) -> Mapping[str, Any]:
    found = _get(cr, "metadata", "annotations")
    return found if isinstance(found, dict) else {}


def _request(
    api: KubeApi,
    ref: KubeVirtRef,
    cr: Mapping[str, Any],
    node: str,
    missing: Iterable[PermittedEntry],
) -> JsonObject | None:
    """Leave ``missing`` in ``node``'s request annotation; the CR after the write, if written.

    ``cr`` is a read made after the lost write. The write tests
    nothing: it sets one key that only this node writes (JSON Patch ``add``
    replaces its value), so it conflicts with no other writer. Nothing is
    written when nothing is missing or ``cr`` shows a request for all of it. A
    CR without annotations refuses the write (the path does not exist); the
    node then retries on its own, as its next guarded write creates them.
    Entries that another writer added meanwhile make a request that the next
    write finds already settled and simply removes.
    """
    wanted = list(missing)
    key = pending_key(node)
    if not wanted or set(wanted) <= set(decode_request(_annotations(cr).get(key))):
        return None
    value = encode_request(wanted)
    try:
        return api.patch(
            ref.path, [{"op": "add", "path": _annotation_path(key), "value": value}], "json"
        )
    except ClusterError as e:
        log.debug("KubeVirt CR %s: request %s not written: %s", ref, key, e)
        return None
