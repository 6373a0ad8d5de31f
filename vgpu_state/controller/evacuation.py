"""Which VMs the controller moves off nodes under ``in-use: evacuate`` (pure).

A node's switch of a GPU to a new layout can wait for the VMs that hold vGPUs of the
departing types (the switch is *deferred*). Under ``in-use: evacuate`` the controller moves
those VMs: a live migration (a KubeVirt ``VirtualMachineInstanceMigration`` steered to a node
with room) where KubeVirt says the VMI can migrate, a restart (its VMI deleted, so KubeVirt
starts it again elsewhere) only where the policy allows it. This module decides; the
controller's loop (:mod:`vgpu_state.controller.run`) reads the cluster and writes.

Trust. A node's ``VGPUNodeState`` status is written by the node's agent (one node's token):
everything read from it is bounded here before it is believed (:func:`read_node`), and none
of it alone moves anything. A VM is moved only when

* the node's config, chosen from the layouts document by the Node's labels (not from the
  report), has ``in-use: evacuate``;
* its ``VirtualMachineInstance`` (written by KubeVirt) exists, says it runs on that node
  (``status.nodeName``), is Running and requests a GPU whose ``deviceName`` is the held vGPU's
  resource;
* neither the VMI nor its VM carries ``vgpu-state.io/evacuate: "never"``;
* another node reports room for it (``free - withheld`` of that resource, less the moves
  already headed there) and has no switch of its own pending on that resource;
* no PodDisruptionBudget of the VMI's namespace that selects it (its virt-launcher pod
  carries its labels) allows no disruption (KubeVirt's own migration budget, owned by the
  VMI, excepted);
* the budget allows it: at most ``max-in-flight`` moves fleet-wide (the top-level policy's
  value) and ``max-per-node`` off one node, counted from the cluster (the controller's
  migrations not yet Succeeded or Failed).

So a node lying in its report can at most get VMs that KubeVirt says run on *that* node
moved; it can claim room it does not have (a migration then fails or waits in KubeVirt,
which checks the target's resources itself) but never move a VM off another node.

A migration that fails or does not finish within ``timeout`` pauses evacuation of its node
until the node's desired layout changes (:attr:`NodeConfig.fingerprint`); the pause is kept
in the cluster (an annotation on the node's ``VGPUNodeState``), so a new leader keeps it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from vgpu_state.model.policy import Evacuation

EVACUATION_LABEL = "vgpu-state.io/evacuation"
"""On every migration the controller creates (value ``"true"``)."""
NODE_LABEL = "vgpu-state.io/node"
"""On every migration the controller creates: the node the VM leaves."""
RESOURCE_ANNOTATION = "vgpu-state.io/resource"
"""On every migration the controller creates: the held vGPU's resource."""
LAYOUT_ANNOTATION = "vgpu-state.io/layout"
"""On every migration the controller creates: the fingerprint of the source node's desired
layout it was started under (its failure pauses the node only under that layout)."""
OPT_OUT_ANNOTATION = "vgpu-state.io/evacuate"
"""``"never"`` on a VirtualMachine or VirtualMachineInstance: the controller never moves it."""
PAUSE_ANNOTATION = "vgpu-state.io/evacuation-paused"
"""On a node's ``VGPUNodeState``: the fingerprint of the desired layout under which a move off
that node failed; evacuation of the node waits until its layout changes."""
HOSTNAME_LABEL = "kubernetes.io/hostname"

MAX_HELD = 64
"""Held vGPUs of one node kept (a VM moves off a node at most ``max-per-node`` at a time; a
node claiming more is read again after its first ones moved): what the controller keeps
between passes stays small, whatever a node reports."""
MAX_CANDIDATES = 64
"""VMs one pass looks at (read their VMI, VM and budgets) at most; the rest on later passes."""
MAX_VM_KEY = 317
"""``namespace/name``: a namespace (63) and a VMI name (253)."""
MAX_DEPARTING = 64
MAX_NAME = 253
FINAL_PHASES = frozenset({"Succeeded", "Failed"})
RESTARTABLE = frozenset({"Always", "RerunOnFailure"})
"""VM run strategies under which KubeVirt starts a deleted VMI again."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_PREFIXES = ("NVIDIA ", "GRID ")


# what a node reports, bounded ----------------------------------------------------------------
@dataclass(frozen=True)
class Held:
    """A vGPU of a departing type, held by a VM, on a GPU whose switch is deferred."""

    node: str
    gpu: str
    vgpu: str
    type_name: str
    resource: str
    vm: str
    """``namespace/name`` of the VM (as the node reports it: checked against its VMI)."""


@dataclass(frozen=True)
class NodeStatus:
    """What the controller believes of one node's ``VGPUNodeState`` status."""

    name: str
    room: Mapping[str, int]
    """Per resource: free vGPUs offered (``free - withheld``, never below 0)."""
    pending: frozenset[str]
    """Resources a switch of this node is pending on (no VM is moved onto them)."""
    held: tuple[Held, ...]
    paused: str | None = None
    """The pause annotation's value (a layout fingerprint), if any."""
    uid: str = ""
    problems: tuple[str, ...] = ()
    """What of the status was not believed (named, not acted on)."""


def vm_key(value: object) -> str | None:
    """``namespace/name`` when ``value`` is one (a DNS label and a DNS subdomain), else
    ``None``."""
    if not isinstance(value, str) or len(value) > MAX_VM_KEY or value.count("/") != 1:
        return None
    namespace, name = value.split("/")
    if not _DNS_LABEL.match(namespace) or not _DNS_NAME.match(name):
        return None
    return value


def short_type(name: str) -> str:
    """A type name without the driver's product prefix (``NVIDIA A2-4Q`` → ``A2-4Q``)."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value: object, limit: int = MAX_NAME) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= limit else None


def read_node(obj: Mapping[str, Any], max_gpus: int = 32, max_vgpus: int = 64) -> NodeStatus:
    """One ``VGPUNodeState`` as the controller believes it: every field bounded (type, size,
    count); what is out of bounds is left out and named in :attr:`NodeStatus.problems`."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    name = str(meta.get("name") or "")
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    assert isinstance(annotations, dict)
    paused = _text(annotations.get(PAUSE_ANNOTATION), 128)
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    assert isinstance(status, dict)
    problems: list[str] = []
    room: dict[str, int] = {}
    pending: set[str] = set()
    capacity = status.get("capacity")
    for row in (capacity if isinstance(capacity, list) else [])[:64]:
        if not isinstance(row, dict):
            continue
        resource = _text(row.get("resourceName"))
        free = _int(row.get("free"))
        withheld = _int(row.get("withheld", 0))
        if resource is None or free is None or withheld is None:
            problems.append(f"capacity row {str(row)[:80]} is not believed")
            continue
        if withheld > free:
            problems.append(f"{resource}: withheld {withheld} is more than free {free}")
            withheld = free
        if withheld:
            pending.add(resource)
        room[resource] = free - withheld
    held: list[Held] = []
    gpus = status.get("gpus")
    gpus = gpus if isinstance(gpus, list) else []
    if len(gpus) > max_gpus:
        problems.append(f"{len(gpus)} GPUs; at most {max_gpus} are read")
    for gpu in gpus[:max_gpus]:
        if not isinstance(gpu, dict):
            continue
        address = _text(gpu.get("address"), 64) or "?"
        switch = gpu.get("switch")
        if not isinstance(switch, dict):
            continue
        departing_raw = switch.get("departing")
        if not isinstance(departing_raw, list) or len(departing_raw) > MAX_DEPARTING:
            problems.append(
                f"GPU {address}: switch.departing is not a list of at most "
                f"{MAX_DEPARTING} type names"
            )
            continue
        departing = {short_type(t) for t in departing_raw if _text(t, 64)}
        vgpus = gpu.get("vgpus")
        vgpus = vgpus if isinstance(vgpus, list) else []
        for v in vgpus[:max_vgpus]:
            if not isinstance(v, dict):
                continue
            type_name, resource = _text(v.get("type"), 64), _text(v.get("resourceName"))
            if type_name is None or resource is None or short_type(type_name) not in departing:
                continue
            pending.add(resource)
            if switch.get("state") != "deferred" or v.get("vm") is None:
                continue
            vm = vm_key(v.get("vm"))
            if vm is None:
                problems.append(
                    f"GPU {address}: vGPU vm {str(v.get('vm'))[:80]!r} is not namespace/name"
                )
                continue
            if len(held) >= MAX_HELD:
                said = f"more than {MAX_HELD} held vGPUs in the way; the first {MAX_HELD} are read"
                if said not in problems:
                    problems.append(said)
                continue
            held.append(Held(name, address, _text(v.get("id"), 64) or "?", type_name,
                             resource, vm))  # fmt: skip
    return NodeStatus(name, room, frozenset(pending), tuple(held), paused,
                      str(meta.get("uid") or ""), tuple(problems))  # fmt: skip


# what KubeVirt says ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Vmi:
    """Of a ``VirtualMachineInstance``, what a move is decided on."""

    key: str
    uid: str
    node: str | None
    phase: str
    devices: frozenset[str]
    """``spec.domain.devices.gpus[].deviceName``."""
    migratable: bool
    why_not: str
    """The ``LiveMigratable`` condition's reason and message when it is not True."""
    labels: Mapping[str, str]
    opted_out: bool
    deleting: bool


def read_vmi(obj: Mapping[str, Any]) -> Vmi:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    gpus = (((spec.get("domain") or {}).get("devices") or {}).get("gpus")) or []
    devices = frozenset(
        str(g["deviceName"]) for g in gpus if isinstance(g, dict) and g.get("deviceName")
    )
    migratable, why = False, "no LiveMigratable condition"
    for c in status.get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "LiveMigratable":
            migratable = c.get("status") == "True"
            why = ": ".join(str(c[k]) for k in ("reason", "message") if c.get(k))
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return Vmi(
        key=f"{meta.get('namespace')}/{meta.get('name')}",
        uid=str(meta.get("uid") or ""),
        node=status.get("nodeName") if isinstance(status.get("nodeName"), str) else None,
        phase=str(status.get("phase") or ""),
        devices=devices,
        migratable=migratable,
        why_not="" if migratable else why,
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        opted_out=isinstance(annotations, dict) and annotations.get(OPT_OUT_ANNOTATION) == "never",
        deleting=bool(meta.get("deletionTimestamp")),
    )


@dataclass(frozen=True)
class Vm:
    run_strategy: str
    opted_out: bool


def read_vm(obj: Mapping[str, Any]) -> Vm:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    strategy = spec.get("runStrategy")
    if not isinstance(strategy, str):
        running = spec.get("running")
        strategy = "Always" if running is True else "Halted" if running is False else ""
    annotations = meta.get("annotations") or {}
    return Vm(
        strategy, isinstance(annotations, dict) and annotations.get(OPT_OUT_ANNOTATION) == "never"
    )


@dataclass(frozen=True)
class Pdb:
    key: str
    match_labels: Mapping[str, str]
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...]
    disruptions_allowed: int
    owners: frozenset[str]
    """uids of its owners (KubeVirt's migration budget is owned by the VMI)."""
    selects_nothing: bool = False

    def selects(self, labels: Mapping[str, str]) -> bool:
        if self.selects_nothing:
            return False
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for key, op, values in self.expressions:
            have = key in labels
            if op == "In" and (not have or labels[key] not in values):
                return False
            if op == "NotIn" and have and labels[key] in values:
                return False
            if op == "Exists" and not have:
                return False
            if op == "DoesNotExist" and have:
                return False
        return True


def read_pdb(obj: Mapping[str, Any]) -> Pdb:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    selector = spec.get("selector")
    status = obj.get("status") or {}
    allowed = status.get("disruptionsAllowed")
    owners = frozenset(
        str(r.get("uid")) for r in meta.get("ownerReferences") or [] if isinstance(r, dict)
    )
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    if not isinstance(selector, dict):  # a PDB without a selector selects no pod (policy/v1)
        return Pdb(key, {}, (), 0, owners, selects_nothing=True)
    expressions = tuple(
        (str(e.get("key")), str(e.get("operator")), tuple(str(v) for v in e.get("values") or []))
        for e in selector.get("matchExpressions") or []
        if isinstance(e, dict)
    )
    return Pdb(
        key,
        {str(k): str(v) for k, v in (selector.get("matchLabels") or {}).items()},
        expressions,
        allowed if isinstance(allowed, int) else 0,
        owners,
    )


@dataclass(frozen=True)
class Migration:
    """A ``VirtualMachineInstanceMigration`` this controller created (it carries the label)."""

    name: str
    namespace: str
    vmi: str
    node: str
    """The node it moves the VM off (its ``vgpu-state.io/node`` label)."""
    target: str | None
    resource: str | None
    phase: str
    created: dt.datetime | None
    uid: str = ""
    layout: str = ""

    @property
    def vm(self) -> str:
        return f"{self.namespace}/{self.vmi}"

    @property
    def done(self) -> bool:
        return self.phase in FINAL_PHASES


def read_migration(obj: Mapping[str, Any]) -> Migration:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    created = None
    stamp = meta.get("creationTimestamp")
    if isinstance(stamp, str):
        try:
            created = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        except ValueError:
            created = None
    selector = spec.get("addedNodeSelector") or {}
    return Migration(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        vmi=str(spec.get("vmiName") or ""),
        node=str((meta.get("labels") or {}).get(NODE_LABEL) or ""),
        target=selector.get(HOSTNAME_LABEL) if isinstance(selector, dict) else None,
        resource=(meta.get("annotations") or {}).get(RESOURCE_ANNOTATION),
        phase=str(status.get("phase") or ""),
        created=created,
        uid=str(meta.get("uid") or ""),
        layout=str((meta.get("annotations") or {}).get(LAYOUT_ANNOTATION) or ""),
    )


# the node's config (from the layouts document and the Node's labels) --------------------------
@dataclass(frozen=True)
class NodeConfig:
    evacuate: bool
    """The selected config has ``in-use: evacuate``."""
    limits: Evacuation
    fingerprint: str
    """Of the node's desired layout (its config's name and content): a pause lasts while it
    is unchanged."""


# decisions -------------------------------------------------------------------------------------
class Kind(StrEnum):
    MIGRATE = "migrate"
    RESTART = "restart"


@dataclass(frozen=True)
class Start:
    """A move to start now."""

    held: Held
    kind: Kind
    target: str
    """The node with room (a migration is steered there; a restart is placed by KubeVirt)."""
    vmi_uid: str


@dataclass(frozen=True)
class Impossible:
    vm: str
    node: str
    reason: str


@dataclass(frozen=True)
class Finished:
    migration: Migration
    ok: bool
    reason: str


@dataclass
class Decision:
    starts: list[Start] = field(default_factory=list)
    impossible: list[Impossible] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)
    """Migrations found Succeeded, Failed or timed out this pass (the loop names each once)."""
    pause: dict[str, str] = field(default_factory=dict)
    """Node → fingerprint to pause it under (a move off it failed)."""
    paused: list[str] = field(default_factory=list)
    """Nodes whose evacuation is paused (their layout unchanged since a failure)."""
    waiting: int = 0
    """Moves possible but past the budget (started on a later pass)."""
    in_flight: int = 0


def timed_out(m: Migration, timeout: int, now: dt.datetime) -> bool:
    return m.created is not None and now - m.created > dt.timedelta(seconds=timeout)


def candidates(
    nodes: Iterable[NodeStatus],
    configs: Mapping[str, NodeConfig],
    migrations: Iterable[Migration],
    restarting: Iterable[str] = (),
) -> list[Held]:
    """The held vGPUs whose VMs a move may be decided for: on nodes under ``evacuate``, not
    paused, not already moving (at most :data:`MAX_CANDIDATES`)."""
    moving = {m.vm for m in migrations if not m.done} | set(restarting)
    found: list[Held] = []
    seen: set[str] = set()
    for node in sorted(nodes, key=lambda n: n.name):
        config = configs.get(node.name)
        if config is None or not config.evacuate or node.paused == config.fingerprint:
            continue
        for held in node.held:
            if held.vm in moving or held.vm in seen:
                continue
            seen.add(held.vm)
            found.append(held)
            if len(found) >= MAX_CANDIDATES:
                return found
    return found


def decide(
    nodes: Iterable[NodeStatus],
    configs: Mapping[str, NodeConfig],
    top: Evacuation,
    migrations: Iterable[Migration],
    vmis: Mapping[str, Vmi | None],
    vms: Mapping[str, Vm | None],
    pdbs: Mapping[str, Iterable[Pdb]],
    now: dt.datetime,
    restarting: Mapping[str, str] | None = None,
) -> Decision:
    """This pass's moves.

    ``vmis``/``vms``: each candidate's VMI and VM (``None``: not found); ``pdbs``: each
    namespace's PodDisruptionBudgets; ``restarting``: VM → node of the restarts started and
    not yet running again (they count in the budget like migrations in flight)."""
    nodes = sorted(nodes, key=lambda n: n.name)
    by_name = {n.name: n for n in nodes}
    restarting = dict(restarting or {})
    migrations = list(migrations)
    out = Decision()
    in_flight: dict[str, int] = {}
    headed: dict[tuple[str, str], int] = {}
    for m in migrations:
        config = configs.get(m.node)
        timeout = (config.limits if config is not None else top).timeout_seconds
        current = config is not None and m.layout == config.fingerprint
        if m.phase == "Succeeded":
            out.finished.append(Finished(m, True, ""))
        elif not current:
            pass  # started under a layout the node no longer wants: its failure pauses nothing
        elif m.done:
            out.finished.append(Finished(m, False, "KubeVirt reports the migration Failed"))
        elif timed_out(m, timeout, now):
            out.finished.append(
                Finished(m, False, f"the migration did not finish within {timeout} s")
            )
        if m.done:
            continue
        # Still running in KubeVirt (timed out or not): it holds its budget.
        in_flight[m.node] = in_flight.get(m.node, 0) + 1
        if m.target and m.resource:
            headed[(m.target, m.resource)] = headed.get((m.target, m.resource), 0) + 1
    for left in restarting.values():
        in_flight[left] = in_flight.get(left, 0) + 1
    for f in out.finished:
        config, node_now = configs.get(f.migration.node), by_name.get(f.migration.node)
        if f.ok or config is None or not config.evacuate:
            continue
        if node_now is not None and node_now.paused == config.fingerprint:
            continue  # paused for it already (the annotation is written once)
        out.pause[f.migration.node] = config.fingerprint
    total = sum(in_flight.values())
    out.in_flight = total
    fleet_left = max(top.max_in_flight - total, 0)
    for node in nodes:
        config = configs.get(node.name)
        if config is None or not config.evacuate:
            continue
        if node.name in out.pause or node.paused == config.fingerprint:
            if node.held:
                out.paused.append(node.name)
            continue
        node_left = max(config.limits.max_per_node - in_flight.get(node.name, 0), 0)
        for held in node.held:
            if held.vm in restarting or any(m.vm == held.vm and not m.done for m in migrations):
                continue
            if held.vm not in vmis:
                continue  # not looked at this pass (past MAX_CANDIDATES)
            why, start = _one(held, by_name, config, vmis[held.vm], vms.get(held.vm),
                              pdbs.get(held.vm.split("/")[0], ()), headed)  # fmt: skip
            if why is not None:
                out.impossible.append(Impossible(held.vm, node.name, why))
                continue
            assert start is not None
            if fleet_left <= 0 or node_left <= 0:
                out.waiting += 1
                continue
            fleet_left -= 1
            node_left -= 1
            key = (start.target, held.resource)
            headed[key] = headed.get(key, 0) + 1
            out.starts.append(start)
    return out


def _one(
    held: Held,
    nodes: Mapping[str, NodeStatus],
    config: NodeConfig,
    vmi: Vmi | None,
    vm: Vm | None,
    pdbs: Iterable[Pdb],
    headed: Mapping[tuple[str, str], int],
) -> tuple[str | None, Start | None]:
    """Why ``held``'s VM cannot move now, or its move."""
    if vmi is None:
        return f"its VirtualMachineInstance {held.vm} does not exist", None
    if vmi.node != held.node:
        return (f"its VirtualMachineInstance says it runs on {vmi.node or 'no node'}, not on "
                f"{held.node}"), None  # fmt: skip
    if vmi.phase != "Running" or vmi.deleting:
        return f"its VirtualMachineInstance is {vmi.phase or 'in no phase'}, not Running", None
    if held.resource not in vmi.devices:
        return (f"its VirtualMachineInstance requests no GPU of {held.resource} (it requests "
                f"{', '.join(sorted(vmi.devices)) or 'none'})"), None  # fmt: skip
    if vmi.opted_out or (vm is not None and vm.opted_out):
        return f'it carries {OPT_OUT_ANNOTATION}: "never"', None
    target = _target(held, nodes, headed)
    if target is None:
        return f"no other node has a free {held.resource} (not withheld, no switch pending)", None
    for pdb in sorted(pdbs, key=lambda p: p.key):
        if vmi.uid and vmi.uid in pdb.owners:
            continue  # KubeVirt's own budget for its migration
        if pdb.selects(vmi.labels) and pdb.disruptions_allowed <= 0:
            return f"PodDisruptionBudget {pdb.key} allows no disruption", None
    if vmi.migratable:
        return None, Start(held, Kind.MIGRATE, target, vmi.uid)
    if not config.limits.restart:
        return (f"KubeVirt says it cannot live-migrate ({vmi.why_not}) and the policy does not "
                "allow a restart (evacuation.restart: false)"), None  # fmt: skip
    if vm is None:
        return (f"it cannot live-migrate ({vmi.why_not}) and has no VirtualMachine to start it "
                "again"), None  # fmt: skip
    if vm.run_strategy not in RESTARTABLE:
        return (f"it cannot live-migrate ({vmi.why_not}) and its VirtualMachine's runStrategy "
                f"{vm.run_strategy or 'unset'} would not start it again"), None  # fmt: skip
    return None, Start(held, Kind.RESTART, target, vmi.uid)


def _target(
    held: Held, nodes: Mapping[str, NodeStatus], headed: Mapping[tuple[str, str], int]
) -> str | None:
    """The other node with the most room for ``held``'s resource (ties: by name)."""
    best: tuple[int, str] | None = None
    for name, node in nodes.items():
        if name == held.node or held.resource in node.pending:
            continue
        room = node.room.get(held.resource, 0) - headed.get((name, held.resource), 0)
        if room <= 0:
            continue
        if best is None or (-room, name) < (-best[0], best[1]):
            best = (room, name)
    return best[1] if best is not None else None
