"""Saved plans (``plan --out``): the document, its strict parser and its check against a host.

A saved plan is untrusted input: whoever can edit the file could otherwise
steer writes anywhere under ``/sys``. So a saved plan is applied only when

1. it parses into the strict plan model (UUIDs are UUIDs, addresses are PCI
   addresses, type ids are numbers; ``address`` says what the step touches),
2. the fresh scan of the host has the fingerprint the plan was made against,
3. every action's GPU, parent, VF and vGPU exist in that scan and every type id
   is one the GPU offers, and
4. planning again from the saved inputs (the desired layout and the in-use
   vGPUs, with those held now added) gives exactly the saved actions.

The result of step 4 is what runs: a saved plan can only ever do what
``vgpu-state plan`` itself would do to this host now.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from vgpu_state.catalog import Catalog
from vgpu_state.model import bounded
from vgpu_state.model.desired import DesiredState
from vgpu_state.model.errors import Reason, UserError
from vgpu_state.model.ids import is_canonical_uuid, is_pci_address, is_type_id
from vgpu_state.model.plan import MODE_KINDS, PLAN_FORMAT_VERSION, Action, ActionKind, Plan
from vgpu_state.model.snapshot import Gpu, NodeSnapshot
from vgpu_state.planner.plan import plan as make_plan

SAVED_PLAN_KIND = "vgpu-state-saved-plan"
MAX_SAVED_PLAN_BYTES = 16 * 1024 * 1024
"""A saved plan of a node with 8 GPUs × 32 vGPUs is about 200 KiB."""


class SavedPlanError(UserError):
    """A saved plan is malformed, stale or was edited; nothing was changed. Exit code 1."""

    default_reason = Reason.PLAN_INVALID


@dataclass(frozen=True)
class SavedPlan:
    source: str
    plan: Plan
    desired: DesiredState
    in_use: dict[str, str]
    snapshot_view: dict[str, Any]
    sim: str | None
    sysfs_root: str | None


def saved_plan_document(
    p: Plan,
    desired: DesiredState,
    snapshot: NodeSnapshot,
    in_use: Mapping[str, str],
    sim: str | None,
    sysfs_root: str | None,
) -> dict[str, Any]:
    return {
        "kind": SAVED_PLAN_KIND,
        "plan": p.model_dump(mode="json"),
        "desired": desired.model_dump(mode="json"),
        "snapshot": snapshot.stable_view(),
        "in_use": dict(sorted(in_use.items())),
        "host": {"sim": sim, "sysfs_root": sysfs_root},
    }


# parsing ---------------------------------------------------------------------------


def _fail(source: str, message: str) -> SavedPlanError:
    return SavedPlanError(f"{source}: {message}; nothing was changed")


def _known_fields(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the keys ``model`` does not know (recursively, through tuples).

    A newer minor format version may add fields; consumers ignore them.
    """
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name not in data:
            continue
        value = data[name]
        inner = _model_of(info.annotation)
        if inner is not None:
            if isinstance(value, list):
                value = [_known_fields(inner, v) for v in value]
            else:
                value = _known_fields(inner, value)
        out[name] = value
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _location(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, str) and part.startswith(("function-", "literal[")):
            continue  # the member of a union (``gpu``: an address or empty), not a field
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _validated(source: str, model: type[BaseModel], data: Any, prefix: str) -> Any:
    try:
        return model.model_validate_json(json.dumps(data), strict=True)
    except ValidationError as e:
        err = e.errors()[0]
        where = _location(prefix, tuple(err["loc"]))
        found = "" if err["type"] == "missing" else f" (found {str(err['input'])[:80]!r})"
        more = f" and {e.error_count() - 1} more problem(s)" if e.error_count() > 1 else ""
        message = str(err["msg"]).removeprefix("Value error, ")
        raise _fail(source, f"{where}: {message}{found}{more}") from None


def _minor_newer(version: str) -> bool:
    ours = PLAN_FORMAT_VERSION.split(".")
    theirs = version.split(".")
    return len(theirs) > 1 and theirs[1].isdigit() and int(theirs[1]) > int(ours[1])


def parse_saved_plan(data: bytes, source: str) -> SavedPlan:
    """Parse and check a saved plan's bytes; raise :class:`SavedPlanError` naming the field."""
    if len(data) > MAX_SAVED_PLAN_BYTES:
        raise _fail(source, f"larger than {MAX_SAVED_PLAN_BYTES // 2**20} MiB: not a saved plan")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(source, f"not UTF-8 text (byte {e.start}): not a saved plan") from None
    try:
        doc = bounded.loads(text, source)
    except json.JSONDecodeError as e:
        raise _fail(source, f"{e.lineno}:{e.colno}: not a saved plan: {e.msg}") from None
    except bounded.InputShapeError as e:
        raise _fail(source, f"{e.line}:{e.column}: not a saved plan: {e.message}") from None
    if not isinstance(doc, dict) or doc.get("kind") != SAVED_PLAN_KIND:
        raise _fail(source, "not a saved plan (write one with `vgpu-state plan --out FILE`)")
    for key in ("plan", "desired", "snapshot", "in_use", "host"):
        if key not in doc:
            hint = " (made by an older vgpu-state: plan again)" if key == "desired" else ""
            raise _fail(source, f"missing {key!r}{hint}")
    raw_plan = doc["plan"]
    if not isinstance(raw_plan, dict):
        raise _fail(source, "plan: expected an object")
    version = raw_plan.get("format_version")
    if not isinstance(version, str) or version.split(".")[0] != PLAN_FORMAT_VERSION.split(".")[0]:
        raise _fail(source, f"plan format {version!r} is not supported by this version")
    newer = _minor_newer(version)
    if newer:
        raw_plan = {**_known_fields(Plan, raw_plan), "format_version": PLAN_FORMAT_VERSION}
    p: Plan = _validated(source, Plan, raw_plan, "plan")
    raw_desired = _known_fields(DesiredState, doc["desired"]) if newer else doc["desired"]
    desired: DesiredState = _validated(source, DesiredState, raw_desired, "desired")
    in_use, host, view = doc["in_use"], doc["host"], doc["snapshot"]
    if not isinstance(in_use, dict) or not all(isinstance(v, str) for v in in_use.values()):
        raise _fail(source, "in_use: expected an object of strings")
    if not isinstance(view, dict):
        raise _fail(source, "snapshot: expected an object")
    if not isinstance(host, dict):
        raise _fail(source, "host: expected an object")
    sim, root = host.get("sim"), host.get("sysfs_root")
    for name, value in (("host.sim", sim), ("host.sysfs_root", root)):
        if value is not None and not isinstance(value, str):
            raise _fail(source, f"{name}: expected a path or null")
    for i, a in enumerate(p.actions):
        problem = action_form_problem(a)
        if problem:
            raise _fail(source, f"plan.actions[{i}] ({a.kind.value} {a.address}): {problem}")
    return SavedPlan(source, p, desired, dict(in_use), view, sim, root)


_DEFERRED = re.compile(r"gpu\[[^\]]+\]\.vf\[new [1-9][0-9]{0,4}\]")
_GI_PROFILE = re.compile(r"[1-9][0-9]?g\.[1-9][0-9]{0,3}gb(\+me)?")
_MODE_ADDRESS = {
    ActionKind.DISABLE_SRIOV: "sriov",
    ActionKind.SET_MIG_MODE: "mig-mode",
    ActionKind.SET_HETEROGENEOUS_MODE: "heterogeneous-mode",
}


def _mode_form_problem(a: Action) -> str | None:
    """What is wrong with the form of a mode step (SR-IOV off, MIG or heterogeneous
    mode, GPU instance), or ``None``."""
    if a.type_name is not None or a.type_id is not None or a.uuid is not None:
        return "a mode step names no vGPU type or uuid"
    if a.vf is not None or a.parent is not None:
        return "a mode step names no vf or parent"
    if a.kind in _MODE_ADDRESS:
        expected = f"gpu[{a.gpu}].{_MODE_ADDRESS[a.kind]}"
        if a.kind is not ActionKind.DISABLE_SRIOV and a.enabled is None:
            return "enabled: missing"
    elif a.kind is ActionKind.DESTROY_GPU_INSTANCE:
        if a.gi_id is None:
            return "gi_id: missing"
        expected = f"gpu[{a.gpu}].gi[{a.gi_id}]"
    else:
        prefix = f"gpu[{a.gpu}].gi[new "
        tail = a.address.removeprefix(prefix)
        number = tail.removesuffix("]")
        if not (a.address.startswith(prefix) and tail.endswith("]") and number.isdigit()):
            return f"address {a.address!r} does not name its step (gpu[{a.gpu}].gi[new N])"
        expected = a.address
    if a.profile is not None and _GI_PROFILE.fullmatch(a.profile) is None:
        return f"profile {a.profile!r} is not a GPU instance profile"
    if a.kind is ActionKind.CREATE_GPU_INSTANCE and a.profile is None:
        return "profile: missing"
    if a.address != expected:
        return f"address {a.address!r} does not name its step ({expected})"
    return None


def action_form_problem(a: Action) -> str | None:
    """What is wrong with the form of one action's fields, or ``None``."""
    if not is_pci_address(a.gpu):
        return f"gpu {a.gpu!r} is not a PCI address"
    for name in ("parent", "vf"):
        value = getattr(a, name)
        if value is not None and not is_pci_address(value):
            return f"{name} {value!r} is not a PCI address"
    if a.uuid is not None and not is_canonical_uuid(a.uuid):
        return f"uuid {a.uuid!r} is not an mdev UUID"
    if a.type_id is not None and not is_type_id(a.type_id):
        return f"type_id {a.type_id!r} is not a vGPU type id"
    if a.kind in MODE_KINDS:
        return _mode_form_problem(a)
    if a.kind is ActionKind.ENABLE_SRIOV:
        expected = f"gpu[{a.gpu}].sriov"
    elif a.vf is not None:
        expected = f"gpu[{a.gpu}].vf[{a.vf}]"
    elif a.kind is ActionKind.CREATE and a.parent is None:
        if _DEFERRED.fullmatch(a.address) is None or not a.address.startswith(f"gpu[{a.gpu}]."):
            return f"address {a.address!r} does not name its step (gpu[{a.gpu}].vf[new N])"
        expected = a.address
    elif a.uuid is not None:
        expected = f"gpu[{a.gpu}].vgpu[{a.uuid}]"
    else:
        return "uuid: a vGPU step needs a uuid or a vf"
    if a.address != expected:
        return f"address {a.address!r} does not name its step ({expected})"
    if a.vf is not None and a.kind is ActionKind.CREATE and a.parent != a.vf:
        return f"parent {a.parent!r} is not the step's VF {a.vf}"
    return None


# checking against the host ----------------------------------------------------------


def _offered_ids(g: Gpu, catalog: Catalog) -> set[int]:
    ids = {t.type_id for t in g.pf_creatable}
    for vf in g.vfs:
        ids.update(t.type_id for t in vf.creatable)
    ids.update(v.type_id for v in g.vgpus if v.type_id is not None)
    model = catalog.model(g.model) if g.model else None
    if model is not None:
        ids.update(t.type_id for t in model.types)
    return ids


def action_host_problem(
    a: Action, snapshot: NodeSnapshot, catalog: Catalog, mode_gpus: frozenset[str] = frozenset()
) -> str | None:
    """Why ``a`` does not fit the scanned host (its GPU, parent, VF, vGPU, type, GPU
    instance), or ``None``. ``mode_gpus``: the GPUs whose mode or GPU instances the plan
    changes (their creates wait for a re-scan even with SR-IOV on)."""
    g = snapshot.gpu(a.gpu)
    if g is None:
        return f"gpu {a.gpu} is not on this host"
    if a.kind in MODE_KINDS:
        if g.modes is None:
            return f"the modes of gpu {a.gpu} were not read (nvidia-smi)"
        if a.kind is ActionKind.DESTROY_GPU_INSTANCE and all(
            gi.id != a.gi_id for gi in g.modes.gpu_instances
        ):
            return f"gi_id {a.gi_id} is not a GPU instance of gpu {a.gpu}"
        return None
    vfs = {vf.address for vf in g.vfs}
    if a.kind is ActionKind.DESTROY:
        keys = {v.key for v in g.vgpus}
        key = a.vf if a.vf is not None else a.uuid
        if key not in keys:
            field = "vf" if a.vf is not None else "uuid"
            return f"{field} {key} is not a vGPU of gpu {a.gpu}"
    if a.vf is not None and a.vf not in vfs:
        return f"vf {a.vf} is not a virtual function of gpu {a.gpu}"
    if a.parent is not None and a.parent != g.address and a.parent not in vfs:
        return f"parent {a.parent} is neither gpu {a.gpu} nor one of its virtual functions"
    if a.kind is ActionKind.CREATE:
        waits = (g.sriov_capable and g.sriov_numvfs == 0) or a.gpu in mode_gpus
        if a.parent is None and not waits:
            return "parent: missing, but SR-IOV is already on"
        if a.uuid is not None and any(v.uuid == a.uuid for v in snapshot_vgpus(snapshot)):
            return f"uuid {a.uuid} already exists on this host"
        if a.type_id is not None and a.type_id not in _offered_ids(g, catalog):
            return f"type_id {a.type_id} is not a vGPU type gpu {a.gpu} offers"
    return None


def snapshot_vgpus(snapshot: NodeSnapshot) -> list[Any]:
    return [v for g in snapshot.gpus for v in g.vgpus]


def check_saved_plan(
    saved: SavedPlan, snapshot: NodeSnapshot, in_use: Mapping[str, str], catalog: Catalog
) -> Plan:
    """The plan to run: ``saved.plan`` re-derived against ``snapshot`` and the in-use set.

    ``snapshot`` must already have the saved plan's fingerprint (the caller shows
    what moved otherwise). ``in_use`` is held now; the saved in-use set is added.
    """
    p = saved.plan
    mode_gpus = frozenset(a.gpu for a in p.actions if a.kind in MODE_KINDS)
    for i, a in enumerate(p.actions):
        problem = action_host_problem(a, snapshot, catalog, mode_gpus)
        if problem:
            raise _fail(saved.source, f"plan.actions[{i}] ({a.kind.value} {a.address}): {problem}")
    for i, a in enumerate(p.actions):
        key = a.vgpu_key
        if a.kind is ActionKind.DESTROY and key in in_use and key not in saved.in_use:
            raise _fail(
                saved.source,
                f"plan.actions[{i}] ({a.kind.value} {a.address}): the vGPU is now held by "
                f"{in_use[key]}; the saved plan is stale, run `vgpu-state plan` again",
            )
    held = {**saved.in_use, **in_use}
    fresh = make_plan(saved.desired, snapshot, held, catalog=catalog)
    if fresh.node != p.node or fresh.selection != p.selection or fresh.policy != p.policy:
        raise _fail(saved.source, "plan: node, selection or policy differ from its desired layout")
    if fresh.actions != p.actions or fresh.blocked != p.blocked or fresh.gpus != p.gpus:
        detail = _first_difference(p, fresh)
        raise _fail(
            saved.source,
            f"the saved actions are not what its desired layout gives on this host now "
            f"({detail}); run `vgpu-state plan` again",
        )
    return fresh


def _first_difference(saved: Plan, fresh: Plan) -> str:
    for i, (a, b) in enumerate(zip(saved.actions, fresh.actions, strict=False)):
        if a != b:
            fields = [name for name in Action.model_fields if getattr(a, name) != getattr(b, name)]
            return f"plan.actions[{i}] ({a.kind.value} {a.address}): {', '.join(fields)} differ"
    if len(saved.actions) != len(fresh.actions):
        return f"{len(saved.actions)} action(s) saved, {len(fresh.actions)} planned now"
    if saved.blocked != fresh.blocked:
        return "the blocked items differ"
    return "the GPU headers differ"
