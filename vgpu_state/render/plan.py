"""A plan in words: Terraform-style text and versioned JSON. Pure functions of a Plan."""

from __future__ import annotations

import json

from vgpu_state.model.errors import BlockedReason
from vgpu_state.model.plan import (
    EXPERIMENTAL,
    MODE_KINDS,
    Action,
    ActionKind,
    Blocked,
    Capacity,
    ClusterAction,
    DeferredSwitch,
    Disruption,
    GpuPlan,
    Holder,
    Move,
    Plan,
)
from vgpu_state.model.policy import InUsePolicy, Publish

SYMBOLS = {
    ActionKind.CREATE: ("+", "create"),
    ActionKind.DESTROY: ("-", "destroy"),
    ActionKind.ENABLE_SRIOV: ("~", "enable SR-IOV (virtual functions)"),
    ActionKind.DISABLE_SRIOV: ("~", "disable SR-IOV (virtual functions)"),
    ActionKind.SET_MIG_MODE: ("~", "change a GPU's mode (MIG, heterogeneous)"),
    ActionKind.SET_HETEROGENEOUS_MODE: ("~", "change a GPU's mode (MIG, heterogeneous)"),
    ActionKind.DESTROY_GPU_INSTANCE: ("-", "destroy a MIG GPU instance"),
    ActionKind.CREATE_GPU_INSTANCE: ("+", "create a MIG GPU instance"),
}
BLOCKED_SYMBOL = ("!", "blocked: will not be done, see the reason")
CLUSTER_SYMBOLS = {
    "add": ("+", "add to a cluster object"),
    "update": ("~", "update in a cluster object"),
    "remove": ("-", "remove from a cluster object"),
}
CLUSTER = ""
"""The ``gpu`` of blocked items that concern the cluster, not one GPU."""

SOURCE_TEXT = {
    "label": "by node label",
    "default": "as the config's default",
    "flag": "on the command line",
    "default-config": "by --default-config (the node has no label)",
}


def _source(source: str) -> str:
    if source.startswith("node-selector"):
        return f"by {source}"
    return SOURCE_TEXT.get(source, source)


def _model(g: GpuPlan) -> str:
    return g.model or "unknown model"


def _on_off(value: object) -> str:
    return "on" if value else "off"


def mode_step_text(a: Action) -> str:
    """A mode step in words: ``MIG mode: off → on (GPU reset; no vGPU on it)``,
    ``create GPU instance 1g.24gb``, ``heterogeneous mode: off → on``."""
    if a.kind is ActionKind.DISABLE_SRIOV:
        return f"disable SR-IOV: {(a.before or {}).get('sriov_numvfs')} → 0 virtual functions"
    if a.kind is ActionKind.SET_MIG_MODE:
        change = f"{_on_off(not a.enabled)} → {_on_off(a.enabled)}"
        return f"MIG mode: {change} (GPU reset; no vGPU on it)"
    if a.kind is ActionKind.SET_HETEROGENEOUS_MODE:
        return f"heterogeneous mode: {_on_off(not a.enabled)} → {_on_off(a.enabled)}"
    if a.kind is ActionKind.DESTROY_GPU_INSTANCE:
        return f"destroy GPU instance {a.profile} (id {a.gi_id})"
    return f"create GPU instance {a.profile}"


def _action_lines(a: Action, after_modes: bool = False) -> list[str]:
    """A step's lines; ``after_modes``: the GPU's mode steps run before its creates."""
    if a.kind in MODE_KINDS:
        mark = SYMBOLS[a.kind][0]
        return [f"  {mark} gpu[{a.gpu}] {mode_step_text(a)}", f"      ({a.reason})"]
    if a.kind is ActionKind.ENABLE_SRIOV:
        after = (a.after or {}).get("sriov_numvfs")
        return [
            f"  ~ {a.address} will be enabled",
            f"      sriov_numvfs: 0 -> {after}   ({a.reason})",
        ]
    if a.kind is ActionKind.DESTROY:
        return [
            f"  - {a.address} will be destroyed",
            f"      type: {a.type_name or f'id {a.type_id}'}   parent: {a.parent}",
        ]
    parent = a.parent or (
        "(chosen after the mode steps, from a fresh read)"
        if after_modes
        else "(chosen after SR-IOV is enabled)"
    )
    where = f"vf: {a.vf}" if a.vf else f"parent: {parent}"
    type_id = f" (id {a.type_id})" if a.type_id is not None else ""
    return [
        f"  + {a.address} will be created",
        f"      type: {a.type_name}{type_id}   {where}",
    ]


def _blocked_lines(items: tuple[Blocked, ...]) -> list[str]:
    """Blocked items; creates with the same type and reason collapse into one line."""
    lines: list[str] = []
    i = 0
    while i < len(items):
        b = items[i]
        if b.kind is ActionKind.DESTROY and b.code is BlockedReason.SWITCH_DEFERRED:
            n = 1
            while i + n < len(items) and (items[i + n].code, items[i + n].reason) == (
                b.code,
                b.reason,
            ):
                n += 1
            for kept in items[i : i + n]:
                type_part = f" {kept.type_name}" if kept.type_name else ""
                lines.append(f"  ! {kept.address}{type_part} kept (destroy deferred)")
            lines.append(f"      {b.reason}")
            i += n
            continue
        if b.kind is ActionKind.DESTROY:
            type_part = f" {b.type_name}" if b.type_name else ""
            lines += [f"  ! {b.address}{type_part} cannot be destroyed", f"      {b.reason}"]
            i += 1
            continue
        n = 1
        while (
            i + n < len(items)
            and items[i + n].kind is ActionKind.CREATE
            and (items[i + n].type_name, items[i + n].reason) == (b.type_name, b.reason)
        ):
            n += 1
        lines += [
            f"  ! gpu[{b.gpu}]: {n} × {b.type_name} cannot be created",
            f"      {b.reason}",
        ]
        i += n
    return lines


def render_text(plan: Plan) -> str:
    """The plan as an operator reads it; colour is added by the CLI on a TTY."""
    lines: list[str] = []
    sel = plan.selection
    lines.append(
        f'Node {plan.node or "(unnamed)"}: configuration "{sel.config}" '
        f"(selected {_source(sel.source)})"
    )
    lines.extend(f"  {e.message}" for e in plan.skipped)
    if plan.is_converged:
        lines.append("")
        for g in plan.gpus:
            lines.append(_gpu_header(g))
        lines.append("")
        lines.append(summary_line(plan))
        return "\n".join(lines) + "\n"

    kinds = {a.kind for a in plan.actions}
    legend = list(dict.fromkeys(f"  {s} {t}" for k, (s, t) in SYMBOLS.items() if k in kinds))
    ops = {c.op for c in plan.cluster_actions}
    legend += [f"  {s} {t}" for k, (s, t) in CLUSTER_SYMBOLS.items() if k in ops]
    if plan.blocked:
        legend.append(f"  {BLOCKED_SYMBOL[0]} {BLOCKED_SYMBOL[1]}")
    lines += ["", "Actions are indicated with the following symbols:", *legend, ""]
    lines.append("vgpu-state will perform the following actions:")
    for g in plan.gpus:
        lines.append("")
        lines.append(_gpu_header(g))
        if g.deferred_switch is not None:
            lines.append(_deferred_line(g.deferred_switch))
            lines.extend(move_line(g.address, m) for m in g.deferred_switch.moves)
        steps = plan.gpu_actions(g.address)
        after_modes = any(a.kind in MODE_KINDS for a in steps)
        for a in steps:
            lines.extend(_action_lines(a, after_modes))
        lines.extend(_blocked_lines(plan.gpu_blocked(g.address)))
    cluster_blocked = plan.gpu_blocked(CLUSTER)
    if plan.cluster_actions or cluster_blocked:
        lines.append("")
        lines.append("  # cluster (after the host's actions)")
        lines.extend(_cluster_lines(c) for c in plan.cluster_actions)
        for b in cluster_blocked:
            lines += [f"  ! {b.address} blocks vGPU changes on this node", f"      {b.reason}"]
    if plan.capacity:
        lines += ["", "Capacity (vGPUs per resource, now → after this plan):"]
        lines.extend(capacity_lines(plan.capacity))
    lines.append("")
    lines.extend(blast_lines(plan))
    if plan.experimental:
        lines.append(f"{EXPERIMENTAL}: {'; '.join(plan.experimental)}")
    lines.append(summary_line(plan))
    return "\n".join(lines) + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def before_after(before: int, after: int) -> str:
    """``2 → 4 (+2)``; ``1 → 1`` when nothing changes."""
    return f"{before} → {after}" + (f" ({after - before:+d})" if after != before else "")


def capacity_lines(capacity: tuple[Capacity, ...]) -> list[str]:
    """One line per resource: ``nvidia.com/NVIDIA_A2-4Q  2 → 4 (+2)``, aligned."""
    names = [c.resource or f"{c.type_name} (resource name not known yet)" for c in capacity]
    width = max(len(n) for n in names)
    counts = [before_after(c.before, c.after) for c in capacity]
    count_width = max(len(n) for n in counts)
    lines = []
    for c, name, count in zip(capacity, names, counts, strict=True):
        notes = []
        if c.publish is Publish.DRA:
            notes.append("DRA")
        if c.held:
            notes.append(f"{c.held} held")
        if c.withheld:
            notes.append(f"{c.withheld} withheld: switch pending")
        if c.after == 0 and c.before > 0:
            notes.append("none left: VMs asking for it cannot start here")
        if c.blocked:
            notes.append(_blocked_note(c))
        if c.kubevirt == "remove":
            notes.append("removed from the KubeVirt CR")
        elif c.kubevirt == "add":
            notes.append("added to the KubeVirt CR")
        tail = f"  [{'; '.join(notes)}]" if notes else ""
        lines.append(f"  {name:<{width}}  {count:<{count_width}}{tail}".rstrip())
    return lines


BLOCKED_NOTES = {
    BlockedReason.SWITCH_DEFERRED: "switch deferred",
    BlockedReason.NO_CAPACITY: "no room on the GPU",
    BlockedReason.PRUNE_DISABLED: "kept vGPUs in the way (policy prune: false)",
    BlockedReason.NO_VGPU_MANAGER: "no vGPU manager on the GPU",
    BlockedReason.SRIOV_OFF: "SR-IOV is off (policy sriov: off)",
}


def _blocked_note(c: Capacity) -> str:
    """``8 more wanted, not created: switch deferred, waits for vm default/win-1``."""
    why = BLOCKED_NOTES.get(c.blocked_code, "blocked") if c.blocked_code else "blocked"
    waits = f", waits for {', '.join(c.waits_for)}" if c.waits_for else ""
    return f"{c.blocked} more wanted, not created: {why}{waits}"


def _holders(items: tuple[Holder, ...]) -> str:
    return ", ".join(f"{h.holder} ({_plural(h.vgpus, 'vGPU')})" for h in items)


def blast_lines(plan: Plan) -> list[str]:
    """``Disruption:`` and, when a holder is concerned, ``Affected:`` or ``Protected:``."""
    d = plan.disruption
    if d.level is Disruption.NONE:
        what = "creates only" if plan.summary.create else "nothing is destroyed"
        if plan.summary.sriov:
            what = "nothing is destroyed; enabling SR-IOV adds virtual functions"
        lines = [f"Disruption: none ({what})"]
    else:
        free = d.destroyed - d.held
        parts = []
        if free:
            parts.append(f"{_plural(free, 'free vGPU')}")
        if d.held:
            parts.append(f"{_plural(d.held, 'held vGPU')}")
        if plan.summary.gi_destroy:
            parts.append(f"{_plural(plan.summary.gi_destroy, 'GPU instance')}")
        what = f"{' and '.join(parts)} destroyed" if parts else "nothing destroyed"
        then = ""
        if d.level is Disruption.GPU:
            then = "; then SR-IOV is disabled or MIG mode changed (a GPU reset), no vGPU left"
        lines = [f"Disruption: {d.level.value} ({what} on {_plural(d.gpus, 'GPU')}{then})"]
    if plan.affected:
        lines.append(
            f"Affected (policy in-use: ignore, their vGPUs are destroyed): "
            f"{_holders(plan.affected)}"
        )
    if plan.protected:
        policy = plan.policy.in_use
        name = policy.value if policy is not InUsePolicy.IGNORE else InUsePolicy.PROTECT.value
        lines.append(f"Protected (policy in-use: {name}): {_holders(plan.protected)}")
    lines.extend(_moves_lines(plan))
    return lines


def move_line(gpu: str, m: Move) -> str:
    """``# vms/win-7 would move off GPU … (in-use: evacuate): it holds A2-4Q, …``; a holder
    that is not a VM is named as one that cannot be moved."""
    held = m.type_name or "a vGPU of unknown type"
    if m.vm is not None:
        return (
            f"  # {m.vm} would move off GPU {gpu} (in-use: evacuate): it holds {held}, "
            "which the new layout drops"
        )
    return (
        f"  # {m.holder} cannot be moved off GPU {gpu} (in-use: evacuate): it is not a "
        f"KubeVirt VM; the switch waits until it releases {held}"
    )


def _moves_lines(plan: Plan) -> list[str]:
    """``Would move (policy in-use: evacuate): vms/win-7 (1 vGPU)`` and the holders that
    cannot be moved; nothing without moves."""
    vms: list[str] = []
    others: list[str] = []
    for g in plan.gpus:
        for m in g.deferred_switch.moves if g.deferred_switch is not None else ():
            if m.vm is not None:
                vms.append(m.vm)
            else:
                others.append(m.holder)
    lines = []
    if vms:
        lines.append(f"Would move (policy in-use: evacuate): {_counted(vms)}")
    if others:
        lines.append(f"Cannot be moved (not a KubeVirt VM): {_counted(others)}")
    return lines


def _counted(names: list[str]) -> str:
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{n} ({_plural(k, 'vGPU')})" for n, k in sorted(counts.items()))


def _cluster_lines(c: ClusterAction) -> str:
    verb = {"add": "will be added", "update": "will be updated", "remove": "will be removed"}
    return f"  {CLUSTER_SYMBOLS[c.op][0]} {c.address} {verb[c.op]}   resource: {c.resource}"


def _gpu_header(g: GpuPlan) -> str:
    head = f"  # gpu[{g.address}] {_model(g)} (index {g.index}, {g.layout.value})"
    if g.publish is Publish.DRA:
        head += " [published through DRA]"
    if not g.managed:
        return f"{head}: not managed by this configuration, {g.kept} vGPU(s) left untouched"
    return f"{head}: {g.kept} vGPU(s) unchanged"


def _deferred_line(d: DeferredSwitch) -> str:
    """``# switch deferred: waits for vm default/win-1; 2 free vGPUs kept, 8 to create then``."""
    if d.waits_for:
        waits = f"waits for {', '.join(d.waits_for)}"
    else:
        n = len(d.in_the_way)
        waits = f"waits while {_plural(n, 'vGPU')} {'stays' if n == 1 else 'stay'} in the way"
    kept = f"; {_plural(d.kept, 'free vGPU')} kept" if d.kept else ""
    return f"  # switch deferred: {waits}{kept}; {d.creates} to create then"


def summary_line(plan: Plan) -> str:
    s = plan.summary
    if plan.is_converged:
        return f'No changes. The node matches configuration "{plan.selection.config}".'
    sriov = f", {s.sriov} SR-IOV to enable" if s.sriov else ""
    if s.sriov_disable:
        sriov += f", {s.sriov_disable} SR-IOV to disable"
    if s.modes:
        sriov += f", {s.modes} mode change(s)"
    if s.gi_destroy or s.gi_create:
        sriov += f", GPU instances: {s.gi_create} to create, {s.gi_destroy} to destroy"
    cluster = f", {s.cluster} cluster change(s)" if s.cluster else ""
    deferred = (
        f" ({_plural(s.switches_deferred, 'GPU')} waiting to switch)" if s.switches_deferred else ""
    )
    return (
        f"Plan: {s.create} to create, {s.destroy} to destroy{sriov}{cluster}, "
        f"{s.blocked} blocked{deferred}."
    )


def render_json(plan: Plan) -> str:
    """Stable JSON (sorted keys, fixed indentation): equal plans give equal bytes."""
    return json.dumps(plan.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
