"""``plan(desired, snapshot, in_use, policy) -> Plan``: the minimal, safe, ordered diff."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from vgpu_state.catalog import (
    Catalog,
    GpuModel,
    VgpuType,
    parse_type_name,
    type_sort_key,
)
from vgpu_state.catalog.capacity import check_fit, size_key
from vgpu_state.catalog.capacity import remaining as room
from vgpu_state.catalog.mig import mig_slices
from vgpu_state.catalog.placement import free_run
from vgpu_state.model.desired import DesiredGpu, DesiredState
from vgpu_state.model.errors import BlockedReason, PlanningError
from vgpu_state.model.frozen import built
from vgpu_state.model.gpumode import GpuInstance, GpuMode, GpuModes
from vgpu_state.model.pci import PciAddress
from vgpu_state.model.plan import (
    MODE_KINDS,
    STEP_ORDER,
    Action,
    ActionKind,
    Blocked,
    DeferredSwitch,
    GpuPlan,
    Move,
    Plan,
    Selection,
    Summary,
    action_disruption,
)
from vgpu_state.model.policy import InUsePolicy, Policy, Publish, SriovPolicy
from vgpu_state.model.snapshot import (
    Gpu,
    NodeSnapshot,
    OfferedType,
    SharedParts,
    SysfsInterface,
    Vgpu,
)
from vgpu_state.planner.blast import _copy_with, with_blast_radius
from vgpu_state.planner.evacuation import held_moves
from vgpu_state.planner.identity import free_uuids
from vgpu_state.planner.modes import (
    MIG_RULE,
    MIXED_RULE,
    MODE_TEXT,
    NEEDS_NVIDIA_SMI,
    desired_mode,
    geometry_problem,
    mig_geometry,
    mixed_size_problem,
)
from vgpu_state.planner.support import host_modes, is_mig_backed


def vgpu_address(gpu: str, v: Vgpu) -> str:
    if v.kind == "vf":
        return f"gpu[{gpu}].vf[{v.parent}]"
    return f"gpu[{gpu}].vgpu[{v.uuid}]"


def describe(v: Vgpu) -> str:
    if v.type_name:
        return f"{v.key} ({v.type_name})"
    return f"{v.key} ({'type unknown' if v.type_id is None else f'type id {v.type_id}'})"


@dataclass
class _GpuWork:
    """Mutable scratch space while one GPU is planned; frozen values come out."""

    actions: list[Action] = field(default_factory=list)
    blocked: list[Blocked] = field(default_factory=list)
    in_the_way: list[Vgpu] = field(default_factory=list)
    """vGPUs that stay and block the creates (set when every create is blocked by them)."""
    replaced: bool = False
    """Mixed-size: free vGPUs are destroyed and made again to make room in the slots, so
    the creates' VFs are chosen after a re-scan."""


class _Lookups:
    """What the planner looks up in a GPU's lists (type descriptions, type ids, its VFs in
    order with the names each offers), remembered for every GPU with the same lists and
    model: across a fleet's nodes of one pool (see ``SharedParts``), else one node."""

    def __init__(self) -> None:
        self.info: dict[str | None, VgpuType | None] = {}
        self.type_ids: dict[tuple[str, str | None], int | None] = {}
        self.vfs_in_order: tuple[tuple[PciAddress, frozenset[str]], ...] | None = None


class _Planner:
    def __init__(
        self,
        desired: DesiredState,
        snapshot: NodeSnapshot,
        in_use: Mapping[str, str],
        policy: Policy,
        catalog: Catalog,
    ) -> None:
        self.desired = desired
        self.snapshot = snapshot
        self.in_use = in_use
        self.policy = policy
        self.catalog = catalog
        self.node = desired.node or snapshot.node
        self.errors: list[str] = []
        # By the GPU's id: the snapshot holds every GPU while it is planned.
        self._lookups: dict[int, _Lookups] = {}

    # lookups ------------------------------------------------------------
    def lookups(self, g: Gpu) -> _Lookups:
        """What is looked up in ``g``'s lists, remembered (see :class:`_Lookups`)."""
        found = self._lookups.get(id(g))
        if found is None:
            found = self._lookups[id(g)] = SharedParts.get(
                (g.vfs, g.pf_creatable, g.offered, self.catalog),
                ("lookups", g.model, g.sriov_totalvfs),
                _Lookups,
            )
        return found

    def info(self, g: Gpu, name: str | None) -> VgpuType | None:
        infos = self.lookups(g).info
        try:
            return infos[name]
        except KeyError:
            found = infos[name] = type_info(self.catalog, g, name)
            return found

    def size_of(self, g: Gpu, name: str | None) -> tuple[int, bool] | None:
        t = self.info(g, name)
        return size_key(t) if t else None

    def holder(self, v: Vgpu) -> str | None:
        if self.policy.in_use is InUsePolicy.IGNORE:
            return None
        return self.in_use.get(v.key)

    # feasibility ----------------------------------------------------------
    def check_mode(self, g: Gpu, dg: DesiredGpu) -> bool:
        """The layout's mode against the GPU's, before any other check.

        A layout in MIG or mixed-size mode needs the GPU's modes read (``nvidia-smi``);
        a GPU whose modes were not read but whose sysfs shows it in one of those modes
        is not laid out either. A mode the GPU does not have is refused.
        """
        want = desired_mode(dg)
        label = f"gpu[{g.address}] ({g.model or 'unknown model'})"
        if g.modes is None:
            if want is not GpuMode.TIME_SLICED:
                types = ", ".join(n for n, c in sorted(dg.types) if c > 0)
                # A scan with nvidia-smi that could not read this GPU says why.
                unread = next((p for p in g.problems if "cannot read the modes" in p), None)
                why = f"its modes could not be read: {unread}" if unread else NEEDS_NVIDIA_SMI
                self.errors.append(
                    f"{label}: the layout is {MODE_TEXT[want]} ({types}); {why} [{dg.entry}]"
                )
                return False
            problems = host_modes(g)
            self.errors.extend(f"{label}: {problem} [{dg.entry}]" for problem in problems)
            return not problems
        if want is GpuMode.MIG and g.modes.mig is None:
            self.errors.append(
                f"{label}: the layout is MIG-backed but the GPU has no MIG mode "
                f"(nvidia-smi reports none) [{dg.entry}]"
            )
            return False
        if want is GpuMode.MIXED_SIZE and g.modes.heterogeneous is None and not g.modes.mig:
            self.errors.append(
                f"{label}: the layout is mixed-size but the GPU has no mixed-size "
                f"(heterogeneous) vGPU mode (nvidia-smi reports none) [{dg.entry}]"
            )
            return False
        return True

    def check_mig(self, g: Gpu, dg: DesiredGpu) -> bool:
        """A MIG-backed layout: MIG-backed types only, a geometry that fits (inferred)."""
        label = f"gpu[{g.address}] ({g.model or 'unknown model'})"
        ok = True
        plain = [n for n, c in sorted(dg.types) if c > 0 and not is_mig_backed(n)]
        if plain:
            self.errors.append(
                f"{label}: {', '.join(plain)} {'is' if len(plain) == 1 else 'are'} not "
                f"MIG-backed; a GPU in MIG mode holds MIG-backed vGPUs only [{dg.entry}]"
            )
            ok = False
        model = self.catalog.model(g.model) if g.model else None
        problem = geometry_problem(model, mig_geometry(model, dg))
        if problem is not None:
            self.errors.append(
                f"{label}: the MIG geometry does not fit: {problem} (inferred) [{dg.entry}]"
            )
            ok = False
        return ok and self.check_vfs(g, dg)

    def check_mixed(self, g: Gpu, dg: DesiredGpu) -> bool:
        """A mixed-size layout: each type within its limit, all of them on one GPU
        (inferred placement rule)."""
        label = f"gpu[{g.address}] ({g.model or 'unknown model'})"
        target = {n: c for n, c in dg.types if c > 0}
        ok = True
        for name, count in sorted(target.items()):
            t = self.info(g, name)
            if t is not None and count > t.max_instances:
                self.errors.append(
                    f"{label}: {count} × {name} requested but one GPU holds at most "
                    f"{t.max_instances} [{dg.entry}]"
                )
                ok = False
        model = self.catalog.model(g.model) if g.model else None
        problem = mixed_size_problem(model, target)
        if problem is not None:
            self.errors.append(
                f"{label}: the mixed-size layout does not fit: {problem} (inferred) [{dg.entry}]"
            )
            ok = False
        return ok and self.check_vfs(g, dg)

    def check_vfs(self, g: Gpu, dg: DesiredGpu) -> bool:
        """One vGPU per virtual function: no more vGPUs than the GPU has VFs."""
        total = sum(c for _, c in dg.types if c > 0)
        if not g.sriov_capable:
            return True
        vfs = len(g.vfs) if g.vfs else (g.sriov_totalvfs or 0)
        if total > vfs:
            self.errors.append(
                f"gpu[{g.address}] ({g.model or 'unknown model'}): {total} vGPUs requested "
                f"but the GPU has {vfs} virtual functions (one vGPU per VF) [{dg.entry}]"
            )
            return False
        return True

    def check_fits(self, g: Gpu, dg: DesiredGpu) -> bool:
        target = {n: c for n, c in dg.types if c > 0}
        label = f"gpu[{g.address}] ({g.model or 'unknown model'})"
        infos = {n: self.info(g, n) for n in target}
        fit = check_fit([(infos[n], c) for n, c in sorted(target.items())])
        ok = fit.ok
        if fit.mixed_sizes:
            parts = ", ".join(
                f"{n} = {t.framebuffer_mib} MiB{' MIG-backed' if t.is_mig else ''}"
                for n, t in sorted(infos.items())
                if t
            )
            self.errors.append(
                f"{label}: the layout mixes framebuffer sizes ({parts}); the driver allows "
                "one framebuffer size per GPU in its equal-size mode (give the entry "
                f"mode: mixed-size where the model supports it) [{dg.entry}]"
            )
        for name, count in sorted(target.items()):
            t = infos[name]
            if t is not None and (t, count) in fit.over_type:
                self.errors.append(
                    f"{label}: {count} × {name} requested but one GPU holds at most "
                    f"{t.max_instances} [{dg.entry}]"
                )
        if fit.over_total is not None:
            wanted, cap, size = fit.over_total
            self.errors.append(
                f"{label}: {wanted} vGPUs of {size} MiB requested but "
                f"one GPU holds at most {cap} [{dg.entry}]"
            )
        total = sum(target.values())
        if g.sriov_capable:
            vfs = len(g.vfs) if g.vfs else (g.sriov_totalvfs or 0)
            if total > vfs:
                self.errors.append(
                    f"{label}: {total} vGPUs requested but the GPU has {vfs} virtual "
                    f"functions (one vGPU per VF) [{dg.entry}]"
                )
                ok = False
        return ok

    def checked(self, g: Gpu, dg: DesiredGpu) -> bool:
        """Can ``g`` be given ``dg``'s layout? When not, the errors say why.

        The checks read the GPU's fields and lists, the names of the types its vGPUs
        have and the layout, never the vGPUs' UUIDs or holders: the answer is the same
        for every GPU of a fleet's pool with the same layout (see ``SharedParts``).
        """

        def compute() -> tuple[bool, tuple[str, ...]]:
            before = len(self.errors)
            want = desired_mode(dg)
            # The driver's lists change with the mode: they say what it offers only
            # while the mode stays.
            # Under MIG they list what fits the GPU instances there now.
            same_mode = (g.modes is None or g.modes.mode is want) and want is not GpuMode.MIG
            ok = self.check_mode(g, dg) and (not same_mode or self.check_offered(g, dg))
            if ok and want is GpuMode.MIG:
                ok = self.check_mig(g, dg)
            elif ok and want is GpuMode.MIXED_SIZE:
                ok = self.check_mixed(g, dg)
            elif ok:
                ok = self.check_fits(g, dg)
            found = tuple(self.errors[before:])
            del self.errors[before:]
            return ok, found

        key = (
            "checked",
            g.address,
            g.model,
            g.layout,
            g.sriov_totalvfs,
            g.offered_complete,
            tuple(v.type_name for v in g.vgpus),
            g.modes,
        )
        ok, errors = SharedParts.get(
            (dg, self.catalog, g.vfs, g.pf_creatable, g.offered), key, compute
        )
        self.errors.extend(errors)
        return ok

    # one GPU --------------------------------------------------------------
    def planned_gpu(
        self, g: Gpu, dg: DesiredGpu
    ) -> tuple[GpuPlan, tuple[Action, ...], tuple[Blocked, ...]]:
        """``g``'s header, its steps in order (destroy, SR-IOV, create) and its blocked
        items (:meth:`plan_gpu`).

        A GPU whose vGPUs are its virtual functions (vendor-specific VFIO, VFs on)
        names them by their PCI addresses and creates none with a UUID: its plan
        does not depend on the node, only on the GPU, its vGPUs and their holders,
        the layout and the policy. Such plans are remembered (see ``SharedParts``):
        the GPUs of a fleet's pool at one address plan alike.
        """

        def compute() -> tuple[GpuPlan, tuple[Action, ...], tuple[Blocked, ...], tuple[str, ...]]:
            before = len(self.errors)
            header, work = self.plan_gpu(g, dg)
            steps = tuple(sorted(work.actions, key=lambda a: STEP_ORDER[a.kind]))
            found = tuple(self.errors[before:])
            del self.errors[before:]
            return header, steps, tuple(work.blocked), found

        if g.layout is not SysfsInterface.VENDOR_VFIO or not g.sriov_numvfs:
            header, steps, items, errors = compute()
        else:
            key = (
                "gpu-plan",
                g.address,
                g.index,
                g.model,
                g.sriov_totalvfs,
                g.sriov_numvfs,
                g.layout_reason,
                g.offered_complete,
                g.vgpus,
                tuple(self.in_use.get(v.key) for v in g.vgpus),
                g.modes,
            )
            parts = (dg, self.policy, self.catalog, g.vfs, g.pf_creatable, g.offered, g.problems)
            header, steps, items, errors = SharedParts.get(parts, key, compute)
        self.errors.extend(errors)
        return header, steps, items

    def plan_gpu(self, g: Gpu, dg: DesiredGpu) -> tuple[GpuPlan, _GpuWork]:
        want = desired_mode(dg)
        if g.modes is not None and (
            want is not GpuMode.TIME_SLICED or g.modes.mode is not GpuMode.TIME_SLICED
        ):
            return self.plan_mode_gpu(g, dg, want, g.modes)
        work = _GpuWork()
        target = {n: c for n, c in dg.types if c > 0}
        if _holds_exactly(g.vgpus, target):
            # The layout the GPU has (most GPUs of a fleet): every vGPU stays, nothing is
            # destroyed or created (what the steps below come to then).
            header = _gpu_plan(
                g.address,
                g.index,
                g.model,
                g.layout,
                True,
                dg.entry,
                len(g.vgpus),
                False,
                dg.publish,
                None,
            )
            return header, work
        kept, unwanted = self.split_existing(g, target)
        remaining = self.plan_destroys(g, unwanted, work)
        creates = [
            name
            for name in sorted(target)
            for _ in range(target[name] - sum(1 for v in kept if v.type_name == name))
        ]
        # Free vGPUs the switch destroys (or, deferred, keeps instead): not offered meanwhile.
        departing = self.withheld(work)
        deferred = False
        switch = None
        if creates:
            deferred = self.plan_creates(g, dg, creates, kept, remaining, work)
            switch = self.defer_switch(g, creates, work)
        header = _gpu_plan(
            g.address,
            g.index,
            g.model,
            g.layout,
            True,
            dg.entry,
            len(kept),
            deferred,
            dg.publish,
            switch,
            departing,
        )
        return header, work

    def plan_mode_gpu(
        self, g: Gpu, dg: DesiredGpu, want: GpuMode, modes: GpuModes
    ) -> tuple[GpuPlan, _GpuWork]:
        """A GPU whose modes were read, laid out in ``want`` mode (docs/plan.md, "GPU modes").

        A mode change (MIG mode, heterogeneous mode) runs only on a GPU that holds no
        vGPU after the plan's destroys: every vGPU goes first, and when one stays (a
        holder, ``prune: false``) the switch is deferred. MIG mode changes with the
        GPU's virtual functions off. Under MIG, GPU instances the layout's geometry
        still needs are kept (those holding vGPUs that stay first); only the others
        are destroyed. Creates that follow a mode, SR-IOV or GPU instance step wait
        for a re-scan to choose their VFs; mixed-size creates run largest first.
        """
        work = _GpuWork()
        target = {n: c for n, c in dg.types if c > 0}
        mig_change = (want is GpuMode.MIG) != bool(modes.mig)
        vfs_on = g.sriov_capable and g.sriov_numvfs > 0
        disable = mig_change and vfs_on
        enable = g.sriov_capable and (disable or g.sriov_numvfs == 0)
        # sriov-manage (disabling or enabling the VFs) clears heterogeneous mode and
        # destroys every GPU instance.
        het_after = bool(modes.heterogeneous) and not modes.mig and not enable
        het: bool | None = None
        if want is GpuMode.MIXED_SIZE and not het_after:
            het = True
        elif want is GpuMode.TIME_SLICED and het_after:
            het = False
        empty_first = mig_change or het is not None
        model = self.catalog.model(g.model) if g.model else None
        geometry = mig_geometry(model, dg) if want is GpuMode.MIG else ()
        gis = () if (mig_change or enable) else modes.gpu_instances
        if empty_first:
            kept: list[Vgpu] = []
            unwanted = sorted(g.vgpus, key=lambda v: v.key)
        else:
            kept, unwanted = self.split_existing(g, target)
            if want is GpuMode.MIXED_SIZE and model is not None:
                before = len(kept)
                kept, unwanted = self.room_in_slots(model, target, kept, unwanted)
                work.replaced = len(kept) < before
        slices = mig_slices(model) if model is not None else 0
        gone_gis, new_gis = _gi_diff(gis, geometry, kept, g.vgpus, slices)
        if gone_gis and not empty_first:
            # A wanted vGPU in a GPU instance that goes is destroyed and made again.
            gone_ids = {gi.id for gi in gone_gis}
            moving = [v for v in kept if v.gpu_instance_id is None or v.gpu_instance_id in gone_ids]
            kept = [v for v in kept if v not in moving]
            unwanted = sorted((*unwanted, *moving), key=lambda v: v.key)
        remaining = self.plan_destroys(g, unwanted, work)
        creates = [
            name
            for name in sorted(target)
            for _ in range(target[name] - sum(1 for v in kept if v.type_name == name))
        ]
        if want is GpuMode.MIXED_SIZE:
            creates.sort(key=lambda n: (-(self.size_of(g, n) or (0, False))[0], n))
        departing = self.withheld(work)
        in_the_way, why = self.mode_blockers(
            want, modes, empty_first, remaining, gone_gis, target, model
        )
        deferred = False
        switch = None
        if in_the_way:
            work.in_the_way = in_the_way
            self.block_all(g, creates, work, why, self.holder(in_the_way[0]))
            switch = self.defer_switch(g, creates, work)
        elif not self.sriov_refused(g, disable, bool(creates or new_gis), work, creates):
            self.mode_steps(
                g, want, modes, disable, enable, mig_change, het, gone_gis, new_gis, work
            )
            if creates:
                deferred = self.plan_mode_creates(g, dg, creates, kept, remaining, work)
        header = _gpu_plan(
            g.address,
            g.index,
            g.model,
            g.layout,
            True,
            dg.entry,
            len(kept),
            deferred,
            dg.publish,
            switch,
            departing,
            tuple(sorted(Counter(v.type_name for v in kept if v.type_name).items()))
            if deferred
            else (),
            _RULES[want] if work.actions or work.blocked else (),
        )
        return header, work

    def room_in_slots(
        self,
        model: GpuModel,
        target: Mapping[str, int],
        kept: list[Vgpu],
        unwanted: list[Vgpu],
    ) -> tuple[list[Vgpu], list[Vgpu]]:
        """Mixed-size mode: when the new vGPUs find no aligned slots beside the kept ones
        (where the driver placed them: ``placement_id``; inferred slot model), the kept
        vGPUs nobody holds are destroyed and made again, largest first, if that makes
        room. Unchanged when it does not, or a kept vGPU's placement is not known."""
        new = dict(target)
        for v in kept:
            if v.type_name is not None:
                new[v.type_name] = new.get(v.type_name, 0) - 1
        new = {n: c for n, c in new.items() if c > 0}
        placed = [(v.type_name, v.placement_id) for v in kept]
        existing = [(n, p) for n, p in placed if n is not None and p is not None]
        if not new or len(existing) != len(kept):
            return kept, unwanted
        if mixed_size_problem(model, new, existing) is None:
            return kept, unwanted
        held = [v for v in kept if self.holder(v) is not None]
        free = [v for v in kept if self.holder(v) is None]
        again = dict(new)
        for v in free:
            if v.type_name is not None:
                again[v.type_name] = again.get(v.type_name, 0) + 1
        stays = [(v.type_name or "", v.placement_id or 0) for v in held]
        if not free or mixed_size_problem(model, again, stays) is not None:
            return kept, unwanted
        return held, sorted((*unwanted, *free), key=lambda v: v.key)

    def mode_blockers(
        self,
        want: GpuMode,
        modes: GpuModes,
        empty_first: bool,
        remaining: list[Vgpu],
        gone_gis: list[GpuInstance],
        target: Mapping[str, int],
        model: GpuModel | None,
    ) -> tuple[list[Vgpu], str]:
        """The vGPUs that stay and keep the GPU from its new mode, geometry or mix, and why."""
        if not remaining:
            return [], ""
        stays = ", ".join(describe(v) for v in remaining)
        holder = self.holder(remaining[0])
        because = f"in use by {holder}" if holder else "kept"
        if empty_first:
            change = _mode_change_text(modes, want)
            return remaining, f"{change} needs a GPU without vGPUs, and {stays} stay(s) ({because})"
        if want is GpuMode.MIG and gone_gis:
            gone = {gi.id for gi in gone_gis}
            stuck = [v for v in remaining if v.gpu_instance_id is None or v.gpu_instance_id in gone]
            if stuck:
                names = ", ".join(f"{gi.profile} (id {gi.id})" for gi in gone_gis)
                return stuck, (
                    f"the GPU instances {names} leave the MIG geometry, and "
                    f"{', '.join(describe(v) for v in stuck)} stay(s) in them ({because})"
                )
        if want is GpuMode.MIXED_SIZE:
            counts = dict(target)
            for v in remaining:
                if v.type_name is not None:
                    counts[v.type_name] = counts.get(v.type_name, 0) + 1
            problem = mixed_size_problem(model, counts)
            if problem is not None:
                return remaining, f"no room while {stays} stay(s) on the GPU ({because}): {problem}"
        return [], ""

    def sriov_refused(
        self, g: Gpu, disable: bool, needed: bool, work: _GpuWork, creates: list[str]
    ) -> bool:
        """Block the creates when SR-IOV would have to be turned on and policy sriov is off."""
        if self.policy.sriov is not SriovPolicy.OFF or not g.sriov_capable:
            return False
        if not (disable or (g.sriov_numvfs == 0 and needed)):
            return False
        why = (
            "changing MIG mode turns the GPU's virtual functions off"
            if disable
            else "SR-IOV is off on this GPU"
        )
        self.block_all(
            g, creates, work, f"{why} and policy sriov is off", code=BlockedReason.SRIOV_OFF
        )
        return True

    def mode_steps(
        self,
        g: Gpu,
        want: GpuMode,
        modes: GpuModes,
        disable: bool,
        enable: bool,
        mig_change: bool,
        het: bool | None,
        gone_gis: list[GpuInstance],
        new_gis: list[str],
        work: _GpuWork,
    ) -> None:
        """The GPU-level steps: SR-IOV off, MIG mode, SR-IOV on, GPU instances,
        heterogeneous mode (sorted into :data:`STEP_ORDER` with the rest)."""
        at = f"gpu[{g.address}]"
        mig = want is GpuMode.MIG
        if disable:
            work.actions.append(
                _mode_action(
                    g,
                    ActionKind.DISABLE_SRIOV,
                    f"{at}.sriov",
                    "MIG mode changes only while the GPU's virtual functions are off",
                    before={"sriov_numvfs": g.sriov_numvfs},
                    after={"sriov_numvfs": 0},
                )
            )
        if mig_change:
            work.actions.append(
                _mode_action(
                    g,
                    ActionKind.SET_MIG_MODE,
                    f"{at}.mig-mode",
                    f"the layout is {MODE_TEXT[want]}",
                    before={"mig": bool(modes.mig)},
                    after={"mig": mig},
                    enabled=mig,
                )
            )
        if enable:
            work.actions.append(
                Action(
                    kind=ActionKind.ENABLE_SRIOV,
                    address=f"{at}.sriov",
                    gpu=g.address,
                    layout=g.layout,
                    before={"sriov_numvfs": 0},
                    after={"sriov_numvfs": g.sriov_totalvfs},
                    reason="vGPUs need virtual functions",
                )
            )
        for gi in gone_gis:
            work.actions.append(
                _mode_action(
                    g,
                    ActionKind.DESTROY_GPU_INSTANCE,
                    f"{at}.gi[{gi.id}]",
                    "not in the layout's MIG geometry",
                    before={"profile": gi.profile, "id": gi.id},
                    profile=gi.profile,
                    gi_id=gi.id,
                )
            )
        for n, profile in enumerate(new_gis, start=1):
            work.actions.append(
                _mode_action(
                    g,
                    ActionKind.CREATE_GPU_INSTANCE,
                    f"{at}.gi[new {n}]",
                    "wanted by the layout's MIG geometry",
                    after={"profile": profile},
                    profile=profile,
                )
            )
        if het is not None:
            work.actions.append(
                _mode_action(
                    g,
                    ActionKind.SET_HETEROGENEOUS_MODE,
                    f"{at}.heterogeneous-mode",
                    "the layout mixes framebuffer sizes"
                    if het
                    else "the layout has one framebuffer size",
                    before={"heterogeneous": not het},
                    after={"heterogeneous": het},
                    enabled=het,
                )
            )

    def plan_mode_creates(
        self,
        g: Gpu,
        dg: DesiredGpu,
        creates: list[str],
        kept: list[Vgpu],
        remaining: list[Vgpu],
        work: _GpuWork,
    ) -> bool:
        """The creates of a GPU in (or going to) MIG or mixed-size mode, in ``creates``'
        order; True when their VFs are chosen after a re-scan (a mode, SR-IOV or GPU
        instance step runs before them: the driver's lists change)."""
        if g.layout is SysfsInterface.UNAVAILABLE:
            self.block_all(
                g,
                creates,
                work,
                f"no vGPU manager on this GPU: {g.layout_reason}",
                code=BlockedReason.NO_VGPU_MANAGER,
            )
            return False
        uuids = free_uuids(self.node, g.address, {v.uuid for v in g.vgpus if v.uuid})
        if work.replaced or any(
            a.kind in MODE_KINDS or a.kind is ActionKind.ENABLE_SRIOV for a in work.actions
        ):
            vendor = g.layout is SysfsInterface.VENDOR_VFIO
            for slot, name in enumerate(creates, start=1):
                work.actions.append(
                    _create(
                        g,
                        name,
                        self.type_id(g, name, None),
                        uuid=None if vendor else next(uuids),
                        parent=None,
                        slot=slot,
                    )
                )
            return True
        occupied = {v.parent for v in (*kept, *remaining)}
        has_destroys = any(a.kind is ActionKind.DESTROY for a in work.actions)
        for name in creates:
            self.create_on_parent(g, dg, name, occupied, has_destroys, uuids, work)
        return False

    def withheld(self, work: _GpuWork) -> tuple[str, ...]:
        """Under ``in-use: evacuate``: the keys of the free vGPUs the GPU's switch destroys
        (its destroy steps so far; a held vGPU is never one), sorted; else none."""
        if self.policy.in_use is not InUsePolicy.EVACUATE:
            return ()
        return tuple(sorted(a.vgpu_key for a in work.actions if a.kind is ActionKind.DESTROY))

    def defer_switch(self, g: Gpu, creates: list[str], work: _GpuWork) -> DeferredSwitch | None:
        """Keep the GPU's layout when its destroys would buy nothing.

        A destroy makes room for the layout's creates. When not one of those can
        run in this plan (what stays in the way blocks them all: a held vGPU of
        another framebuffer size, say), the destroys would only lower capacity:
        they become blocked items too, and the GPU keeps its vGPUs until the
        switch can complete. A switch that a holder blocks is deferred even when
        there is nothing to keep, so the plan names whom it waits for.
        """
        if any(a.kind is not ActionKind.DESTROY for a in work.actions):
            return None  # a create (or SR-IOV) runs: the destroys make room for it
        destroys = list(work.actions)
        waits_for = sorted({h for h in map(self.holder, work.in_the_way) if h is not None})
        if not destroys and not waits_for:
            return None
        in_the_way = ", ".join(describe(v) for v in work.in_the_way)
        if waits_for:
            verb = "releases" if len(waits_for) == 1 else "release"
            until = f"until {' and '.join(waits_for)} {verb} {in_the_way}"
        elif in_the_way:
            until = f"while {in_the_way} stay(s) on the GPU"
        else:
            until = "while its creates are blocked"
        wants = f"{len(creates)} vGPU(s) the layout wants"
        keep = (
            f"switch deferred {until}: the {wants} cannot be created before then, so "
            "destroying this free vGPU now would only lower capacity"
        )
        deferred = [
            Blocked(
                address=a.address,
                gpu=g.address,
                kind=ActionKind.DESTROY,
                type_name=a.type_name,
                code=BlockedReason.SWITCH_DEFERRED,
                reason=keep,
            )
            for a in destroys
        ]
        blocked: list[Blocked] = []
        for b in work.blocked:
            if b.kind is ActionKind.CREATE:
                if deferred:
                    blocked += deferred
                    deferred = []
                waits = f"waits for {' and '.join(waits_for)}: " if waits_for else ""
                b = b.model_copy(
                    update={
                        "code": BlockedReason.SWITCH_DEFERRED,
                        "reason": f"switch deferred; {waits}{b.reason}",
                    }
                )
            blocked.append(b)
        work.blocked = blocked + deferred
        work.actions.clear()
        moves: tuple[Move, ...] = ()
        if self.policy.in_use is InUsePolicy.EVACUATE:
            moves = held_moves(self.snapshot, g, work.in_the_way, self.in_use)
        return DeferredSwitch(
            waits_for=tuple(waits_for),
            in_the_way=tuple(v.key for v in work.in_the_way),
            kept=len(destroys),
            creates=len(creates),
            moves=moves,
        )

    def split_existing(self, g: Gpu, target: Mapping[str, int]) -> tuple[list[Vgpu], list[Vgpu]]:
        """Keep existing vGPUs of wanted types up to the count (held ones first)."""
        kept: list[Vgpu] = []
        unwanted: list[Vgpu] = []
        by_type: dict[str | None, list[Vgpu]] = {}
        for v in sorted(g.vgpus, key=lambda v: v.key):
            by_type.setdefault(v.type_name, []).append(v)
        for name, group in by_type.items():
            want = target.get(name, 0) if name is not None else 0
            ordered = sorted(group, key=lambda v: (self.in_use.get(v.key) is None, v.key))
            kept.extend(ordered[:want])
            unwanted.extend(ordered[want:])
        kept.sort(key=lambda v: v.key)
        unwanted.sort(key=lambda v: v.key)
        return kept, unwanted

    def plan_destroys(self, g: Gpu, unwanted: list[Vgpu], work: _GpuWork) -> list[Vgpu]:
        """Destroy what the layout does not want; return the vGPUs that must stay."""
        remaining: list[Vgpu] = []
        for v in unwanted:
            address = vgpu_address(g.address, v)
            holder = self.holder(v)
            if v.type_id is None and v.type_name is None:
                problem = next((p for p in g.problems if v.key in p), "no type recorded")
                work.blocked.append(
                    Blocked(
                        address=address,
                        gpu=g.address,
                        kind=ActionKind.DESTROY,
                        holder=holder,
                        reason=f"its type cannot be read ({problem}); a vGPU of unknown "
                        "type is never destroyed",
                    )
                )
                remaining.append(v)
            elif holder is not None:
                work.blocked.append(
                    Blocked(
                        address=address,
                        gpu=g.address,
                        kind=ActionKind.DESTROY,
                        type_name=v.type_name,
                        holder=holder,
                        code=BlockedReason.IN_USE,
                        reason=f"in use by {holder} (policy in-use: {self.policy.in_use.value})",
                    )
                )
                remaining.append(v)
            elif not self.policy.prune:
                work.blocked.append(
                    Blocked(
                        address=address,
                        gpu=g.address,
                        kind=ActionKind.DESTROY,
                        type_name=v.type_name,
                        code=BlockedReason.PRUNE_DISABLED,
                        reason="not wanted by the layout, kept because policy prune is false",
                    )
                )
                remaining.append(v)
            else:
                # From the scan's validated values: not validated again (see _create).
                work.actions.append(
                    built(
                        Action,
                        kind=ActionKind.DESTROY,
                        address=address,
                        gpu=g.address,
                        layout=g.layout,
                        type_name=v.type_name,
                        type_id=v.type_id,
                        parent=v.parent,
                        uuid=v.uuid,
                        vf=v.parent if v.kind == "vf" else None,
                        before=_vgpu_view(v),
                        after=None,
                        reason="not wanted by the layout",
                        disruption=action_disruption(ActionKind.DESTROY),
                    )
                )
        return remaining

    def block_all(
        self,
        g: Gpu,
        creates: list[str],
        work: _GpuWork,
        reason: str,
        holder: str | None = None,
        code: BlockedReason = BlockedReason.NO_CAPACITY,
    ) -> None:
        for n, name in enumerate(creates):
            work.blocked.append(
                Blocked(
                    address=f"gpu[{g.address}].vgpu[new {n + 1}]",
                    gpu=g.address,
                    kind=ActionKind.CREATE,
                    type_name=name,
                    holder=holder,
                    code=code,
                    reason=reason,
                )
            )

    def plan_creates(
        self,
        g: Gpu,
        dg: DesiredGpu,
        creates: list[str],
        kept: list[Vgpu],
        remaining: list[Vgpu],
        work: _GpuWork,
    ) -> bool:
        """Add create (and SR-IOV) steps; return True when parents wait for SR-IOV."""
        if g.layout is SysfsInterface.UNAVAILABLE:
            self.block_all(
                g,
                creates,
                work,
                f"no vGPU manager on this GPU: {g.layout_reason}",
                code=BlockedReason.NO_VGPU_MANAGER,
            )
            return False
        target_size = self.size_of(g, creates[0])
        stuck = [v for v in remaining if self.size_of(g, v.type_name) != target_size]
        if stuck:
            work.in_the_way = stuck
            first = stuck[0]
            holder = self.holder(first)
            why = f"in use by {holder}" if holder else "kept (prune is false)"
            self.block_all(
                g,
                creates,
                work,
                f"the GPU still holds {len(stuck)} vGPU(s) of another framebuffer size "
                f"({', '.join(describe(v) for v in stuck)}; {why}); the driver allows one "
                "framebuffer size per GPU",
                holder,
            )
            return False
        # Same size: capacity left after what stays.
        infos = [t for t in (self.info(g, n) for n in set(creates)) if t]
        staying = [self.info(g, v.type_name) for v in (*kept, *remaining)]
        capacity = min(room(t, staying) for t in infos) if infos else len(creates)
        if remaining and capacity < len(creates):
            holders = ", ".join(describe(v) for v in remaining)
            self.block_all(
                g,
                creates[max(capacity, 0) :],
                work,
                f"no capacity left while {holders} stay on the GPU",
                self.holder(remaining[0]),
            )
            creates = creates[: max(capacity, 0)]
            if not creates:
                work.in_the_way = list(remaining)
                return False
        vfs_off = g.sriov_capable and g.sriov_numvfs == 0
        if vfs_off:
            if self.policy.sriov is SriovPolicy.OFF:
                self.block_all(
                    g,
                    creates,
                    work,
                    "SR-IOV is off on this GPU and policy sriov is off",
                    code=BlockedReason.SRIOV_OFF,
                )
                return False
            work.actions.append(
                Action(
                    kind=ActionKind.ENABLE_SRIOV,
                    address=f"gpu[{g.address}].sriov",
                    gpu=g.address,
                    layout=g.layout,
                    before={"sriov_numvfs": 0},
                    after={"sriov_numvfs": g.sriov_totalvfs},
                    reason=f"{len(creates)} vGPU(s) need virtual functions",
                )
            )
        taken = {v.uuid for v in g.vgpus if v.uuid}
        uuids = free_uuids(self.node, g.address, taken)
        occupied = {v.parent for v in (*kept, *remaining)}
        has_destroys = any(a.kind is ActionKind.DESTROY for a in work.actions)
        for slot, name in enumerate(creates, start=1):
            if vfs_off:
                u = next(uuids)
                work.actions.append(
                    _create(g, name, self.type_id(g, name, None), uuid=u, parent=None, slot=slot)
                )
                continue
            self.create_on_parent(g, dg, name, occupied, has_destroys, uuids, work)
        return vfs_off

    def create_on_parent(
        self,
        g: Gpu,
        dg: DesiredGpu,
        name: str,
        occupied: set[PciAddress],
        has_destroys: bool,
        uuids: Iterator[str],
        work: _GpuWork,
    ) -> None:
        """One create on a parent chosen now (a free VF, or the GPU itself), or blocked
        when none offers the type; the type id from the parent's list or the catalog."""
        parent = self.choose_parent(g, name, occupied, has_destroys)
        if parent is None:
            self.block_all(g, [name], work, "no free virtual function offers this type")
            return
        if g.sriov_capable:
            occupied.add(parent)
        type_id = self.type_id(g, name, parent)
        # A type the lists do not show while the GPU holds vGPUs of another size:
        # after the destroys before it, the driver lists it; the step reads its id then.
        if type_id is None and not (has_destroys and self.info(g, name) is not None):
            self.errors.append(
                f"gpu[{g.address}] ({g.model or 'unknown model'}): the type id of {name} "
                "is unknown: the GPU's driver does not list it now (its lists show only "
                "what is creatable while the GPU holds vGPUs) and the catalog does not "
                f"know it [{dg.entry}]"
            )
            return
        if g.layout is SysfsInterface.VENDOR_VFIO:
            work.actions.append(_create(g, name, type_id, vf=parent, parent=parent))
        else:
            work.actions.append(_create(g, name, type_id, uuid=next(uuids), parent=parent))

    def choose_parent(
        self, g: Gpu, name: str, occupied: set[PciAddress], has_destroys: bool
    ) -> PciAddress | None:
        """The PF (no SR-IOV), else the lowest free VF whose creatable set allows the type."""
        if not g.sriov_capable:
            return g.address
        lookups = self.lookups(g)
        vfs = lookups.vfs_in_order
        if vfs is None:
            vfs = lookups.vfs_in_order = tuple(
                (vf.address, frozenset(c.name for c in vf.creatable))
                for vf in sorted(g.vfs, key=lambda vf: vf.index)
            )
        for address, listed in vfs:
            if address in occupied:
                continue
            if name in listed or not listed or has_destroys:
                return address
        return None

    def type_id(self, g: Gpu, name: str, parent: str | None) -> int | None:
        """From the parent's list, else any list of the GPU's driver, else the catalog
        when it knows the real id. Never an id that neither gave."""
        ids = self.lookups(g).type_ids
        key = (name, parent)
        try:
            return ids[key]
        except KeyError:
            found = ids[key] = self._type_id(g, name, parent)
            return found

    def _type_id(self, g: Gpu, name: str, parent: str | None) -> int | None:
        if parent is not None:
            for vf in g.vfs:
                if vf.address == parent:
                    for c in vf.creatable:
                        if c.name == name:
                            return c.type_id
        for c in g.pf_creatable:
            if c.name == name:
                return c.type_id
        for vf in g.vfs:
            for c in vf.creatable:
                if c.name == name:
                    return c.type_id
        listed = g.offered_type(name)
        if listed is not None:
            return listed.type_id
        t = self.info(g, name)
        return t.type_id if t is not None and t.type_id_known else None

    def check_offered(self, g: Gpu, dg: DesiredGpu) -> bool:
        """The driver decides which types exist: a wanted type it does not list is an error."""
        if not g.offered_complete:
            return True
        present = {v.type_name for v in g.vgpus}
        missing = [
            n for n, c in dg.types if c > 0 and g.offered_type(n) is None and n not in present
        ]
        if not missing:
            return True
        offered = ", ".join(t.name for t in sorted(g.offered, key=lambda t: offered_sort_key(g, t)))
        self.errors.append(
            f"gpu[{g.address}] ({g.model or 'unknown model'}): the driver does not offer "
            f"{', '.join(missing)} [{dg.entry}]; it offers: {offered or 'no vGPU types'}"
        )
        return False

    # whole node -----------------------------------------------------------
    def run(self) -> Plan:
        """The node's plan.

        A node whose GPUs are all vendor-VFIO GPUs with their VFs on is planned
        without its name: its steps name VFs by their PCI addresses and create no
        mdev (no UUID derived from the node's name). Its plan is the same, but for
        ``node``, for every node with the same (shared) GPUs, layout, policy and
        holders: remembered (see ``SharedParts``), as each such GPU's plan is.
        """
        gpus = self.snapshot.gpus
        if not gpus or not all(
            g.layout is SysfsInterface.VENDOR_VFIO and g.sriov_numvfs for g in gpus
        ):
            return self._run()
        desired = self.desired
        parts = (self.catalog, self.policy, *desired.gpus, *gpus)
        key = (
            "node plan",
            len(desired.gpus),
            desired.config,
            desired.selection_source,
            desired.skipped,
            *self.in_use.items(),
        )
        found = SharedParts.get(parts, key, self._run)
        if found.node == self.node:
            return found
        return _copy_with(found, {"node": self.node})

    def _run(self) -> Plan:
        wanted = {dg.address: dg for dg in self.desired.gpus}
        for address in sorted(wanted):
            if self.snapshot.gpu(address) is None:
                self.errors.append(
                    f"gpu[{address}] is in the desired layout but not on node "
                    f"{self.node or '(unnamed)'}"
                )
        headers: list[GpuPlan] = []
        actions: list[Action] = []
        blocked: list[Blocked] = []
        for g in sorted(self.snapshot.gpus, key=lambda g: g.address):
            dg = wanted.get(g.address)
            if dg is None:
                headers.append(
                    _gpu_plan(
                        g.address,
                        g.index,
                        g.model,
                        g.layout,
                        False,
                        "",
                        len(g.vgpus),
                        False,
                        self.policy.publish,
                        None,
                    )
                )
                continue
            if not self.checked(g, dg):
                continue
            header, gpu_actions, gpu_blocked = self.planned_gpu(g, dg)
            headers.append(header)
            actions.extend(gpu_actions)
            blocked.extend(gpu_blocked)
        if self.errors:
            raise PlanningError("\n".join(self.errors))
        counts = Counter(a.kind for a in actions)
        # Every value below is the planner's own or taken from validated models: the plan
        # is built from them without validating them again (a fleet's plans are many).
        summary = _summary(
            counts[ActionKind.CREATE],
            counts[ActionKind.DESTROY],
            counts[ActionKind.ENABLE_SRIOV],
            len(blocked),
            sum(h.kept for h in headers if h.managed),
            sum(h.deferred_switch is not None for h in headers),
            counts[ActionKind.DISABLE_SRIOV],
            counts[ActionKind.SET_MIG_MODE] + counts[ActionKind.SET_HETEROGENEOUS_MODE],
            counts[ActionKind.CREATE_GPU_INSTANCE],
            counts[ActionKind.DESTROY_GPU_INSTANCE],
        )
        p = built(
            Plan,
            node=self.node,
            selection=_selection(self.desired.config, self.desired.selection_source),
            policy=self.policy,
            snapshot_fingerprint=self.snapshot.fingerprint(),
            gpus=tuple(headers),
            actions=tuple(actions),
            blocked=tuple(blocked),
            summary=summary,
            skipped=self.desired.skipped,
        )
        return with_blast_radius(p, self.snapshot, self.in_use)


@functools.lru_cache(maxsize=1024)
def _summary(
    create: int,
    destroy: int,
    sriov: int,
    blocked: int,
    kept: int,
    switches_deferred: int,
    sriov_disable: int = 0,
    modes: int = 0,
    gi_create: int = 0,
    gi_destroy: int = 0,
) -> Summary:
    """A plan's counts: one frozen value for equal ones (a fleet's plans share theirs)."""
    return built(
        Summary,
        create=create,
        destroy=destroy,
        sriov=sriov,
        blocked=blocked,
        kept=kept,
        switches_deferred=switches_deferred,
        sriov_disable=sriov_disable,
        modes=modes,
        gi_create=gi_create,
        gi_destroy=gi_destroy,
    )


@functools.lru_cache(maxsize=1024)
def _selection(config: str, source: str) -> Selection:
    return built(Selection, config=config, source=source)


def _holds_exactly(vgpus: tuple[Vgpu, ...], target: Mapping[str, int]) -> bool:
    """The vGPUs are of the wanted types, as many of each as wanted (none of unknown
    type): :meth:`_Planner.split_existing` would keep them all, and no create is left."""
    counts: dict[str, int] = {}
    for v in vgpus:
        name = v.type_name
        if name is None:
            return False
        counts[name] = counts.get(name, 0) + 1
    return counts == target


@functools.lru_cache(maxsize=4096, typed=True)
def _gpu_plan(
    address: PciAddress,
    index: int,
    model: str | None,
    layout: SysfsInterface,
    managed: bool,
    entry: str,
    kept: int,
    deferred: bool,
    publish: Publish,
    switch: DeferredSwitch | None,
    withheld: tuple[str, ...] = (),
    deferred_kept: tuple[tuple[str, int], ...] = (),
    experimental: tuple[str, ...] = (),
) -> GpuPlan:
    """A GPU's header: one frozen value for equal ones (the GPUs of a fleet's pool have
    equal headers, so a fleet plan makes each once)."""
    return GpuPlan(
        address=address,
        index=index,
        model=model,
        layout=layout,
        managed=managed,
        entry=entry,
        kept=kept,
        deferred=deferred,
        publish=publish,
        deferred_switch=switch,
        withheld=withheld,
        deferred_kept=deferred_kept,
        experimental=experimental,
    )


def type_info(catalog: Catalog, g: Gpu, name: str | None) -> VgpuType | None:
    """What is known of a type on this GPU: the catalog's entry for the GPU's model,
    else what the GPU's driver lists, else (GPU of unknown model) the catalog's.
    On a model whose catalog rows are inferred, what the driver lists comes first."""
    if name is None:
        return None
    model = catalog.model(g.model) if g.model else None
    found = model.type(name) if model else None
    listed = g.offered_type(name)
    if found is not None and (listed is None or not catalog_is_advisory(model)):
        return found
    if listed is not None:
        return driver_type(g, model, listed)
    # A GPU of unknown model: the catalog's type when only one model has that name.
    return catalog.type(name) if model is None else None


def driver_type(g: Gpu, model: GpuModel | None, listed: OfferedType) -> VgpuType:
    """A type the catalog lacks, described by what the GPU's driver lists.

    The framebuffer is the driver's (mdev ``description``), else the size in the name;
    the most instances the driver's, else how many fit the GPU's framebuffer (capped at
    its virtual functions), else no limit the planner can check (the driver decides).
    """
    parsed = parse_type_name(listed.name)
    fb = listed.framebuffer_mib
    if fb is None and parsed is not None:
        fb = parsed.framebuffer_gb * 1024 or 512
    most = listed.max_instances
    if most is None and fb and model is not None:
        most = max(model.framebuffer_mib // fb, 1)
        if g.sriov_totalvfs:
            most = min(most, g.sriov_totalvfs)
    return VgpuType(
        name=listed.name,
        model=model.name if model is not None else (g.model or ""),
        series=parsed.series if parsed is not None else "",
        framebuffer_mib=fb or 0,
        max_instances=most if most is not None else UNCHECKED_INSTANCES,
        type_id=listed.type_id,
        type_id_known=True,
        mig_slices=parsed.mig_slices if parsed is not None else None,
    )


def catalog_is_advisory(model: GpuModel | None) -> bool:
    """The catalog's rows for this model were inferred: the driver's lists decide."""
    return model is not None and model.inferred


UNCHECKED_INSTANCES = 1 << 16
"""``max_instances`` of a driver type whose limit nobody states: the driver decides."""


def offered_sort_key(g: Gpu, t: OfferedType) -> tuple[int, str]:
    """Types in lists: by framebuffer size, then by name (``L40S-1A`` before ``L40S-12A``)."""
    return type_sort_key(t.name, t.framebuffer_mib)


def deferred_address(gpu: str, slot: int) -> str:
    """The address of the ``slot``-th create that waits for SR-IOV on ``gpu``."""
    return f"gpu[{gpu}].vf[new {slot}]"


def _gi_diff(
    gis: tuple[GpuInstance, ...],
    geometry: tuple[tuple[str, int], ...],
    kept: list[Vgpu],
    vgpus: tuple[Vgpu, ...],
    slices: int = 0,
) -> tuple[list[GpuInstance], list[str]]:
    """GPU instances to destroy, and the profiles to create, for ``geometry``.

    Of each profile, those holding the most kept vGPUs (then any vGPU, then the
    lowest id) are kept, as many as the geometry has; the rest are destroyed. The
    largest profiles are created first (most compute slices), so they find room
    before smaller ones split the GPU up. When the new instances would find no room
    beside the kept ones where ``nvidia-smi`` placed them (``slices``: the GPU's
    compute slices; inferred: an instance takes a run of its slices aligned to its
    size), the kept instances that hold no vGPU that stays are destroyed and made
    again too, largest first; when that is not enough, every instance (the vGPUs
    that stay in them are made again; a held one defers the switch).
    """
    kept_in = Counter(v.gpu_instance_id for v in kept)
    any_in = Counter(v.gpu_instance_id for v in vgpus)
    keep: set[int] = set()
    create: list[str] = []
    for profile, count in geometry:
        same = sorted(
            (gi for gi in gis if gi.profile == profile),
            key=lambda gi: (-kept_in[gi.id], -any_in[gi.id], gi.id),
        )
        keep.update(gi.id for gi in same[:count])
        create += [profile] * max(count - len(same), 0)
    create.sort(key=lambda p: (-_gi_slices(p), p))
    staying = [gi for gi in gis if gi.id in keep]
    if create and slices and not _gis_fit(staying, create, slices):
        # First the kept instances no vGPU stays in; then every instance (the vGPUs in
        # them are made again, and a held one defers the switch).
        for release in (
            [gi for gi in staying if not kept_in[gi.id]],
            [gi for gi in staying if kept_in[gi.id]],
        ):
            keep -= {gi.id for gi in release}
            create += [gi.profile for gi in release]
            create.sort(key=lambda p: (-_gi_slices(p), p))
            staying = [gi for gi in gis if gi.id in keep]
            if _gis_fit(staying, create, slices):
                break
    gone = sorted((gi for gi in gis if gi.id not in keep), key=lambda gi: gi.id)
    return gone, create


def _gis_fit(staying: list[GpuInstance], create: list[str], slices: int) -> bool:
    """Whether ``create`` (largest first) finds aligned runs of compute slices beside the
    ``staying`` instances; True when a staying instance's placement is not known."""
    used = [False] * slices
    for gi in staying:
        if gi.placement_start is None:
            return True
        size = gi.placement_size or _gi_slices(gi.profile)
        for k in range(gi.placement_start, min(gi.placement_start + size, slices)):
            used[k] = True
    for profile in create:
        size = _gi_slices(profile)
        if size < 1:
            return True
        start = free_run(used, size)
        if start is None:
            return False
        used[start : start + size] = [True] * size
    return True


def _gi_slices(profile: str) -> int:
    """A GPU instance profile's compute slices (``3g.20gb`` → 3; 0 when unreadable)."""
    head = profile.partition("g.")[0]
    return int(head) if head.isdigit() else 0


_RULES: dict[GpuMode, tuple[str, ...]] = {
    GpuMode.MIG: (MIG_RULE,),
    GpuMode.MIXED_SIZE: (MIXED_RULE,),
    GpuMode.TIME_SLICED: (),
}
"""The inferred rules a GPU's plan in each mode relies on."""


def _mode_change_text(modes: GpuModes, want: GpuMode) -> str:
    """``the switch from time-sliced to MIG-backed mode``."""
    return f"the switch from {MODE_TEXT[modes.mode]} to {MODE_TEXT[want]} mode"


def _mode_action(
    g: Gpu,
    kind: ActionKind,
    address: str,
    reason: str,
    *,
    before: dict[str, object] | None = None,
    after: dict[str, object] | None = None,
    profile: str | None = None,
    gi_id: int | None = None,
    enabled: bool | None = None,
) -> Action:
    """A GPU-level step (mode, SR-IOV off, GPU instance)."""
    return Action(
        kind=kind,
        address=address,
        gpu=g.address,
        layout=g.layout,
        before=before,
        after=after,
        reason=reason,
        profile=profile,
        gi_id=gi_id,
        enabled=enabled,
    )


def _create(
    g: Gpu,
    name: str,
    type_id: int | None,
    *,
    parent: PciAddress | None,
    uuid: str | None = None,
    vf: PciAddress | None = None,
    slot: int = 0,
) -> Action:
    """A create step: on a VF (vendor-VFIO), or an mdev (parent ``None`` until SR-IOV is on).

    A create that waits for SR-IOV takes a virtual function in either layout; it is
    addressed ``gpu[…].vf[new N]`` until the VFs exist and the reconcile places it.
    """
    after: dict[str, object] = {"type": name, "type_id": type_id}
    if vf is not None:
        address, after["vf"] = f"gpu[{g.address}].vf[{vf}]", vf
    elif parent is None:
        address = deferred_address(g.address, slot)
        after.update(uuid=uuid, parent=None)
    else:
        address = f"gpu[{g.address}].vgpu[{uuid}]"
        after.update(uuid=uuid, parent=parent)
    reason = "wanted by the layout"
    if parent is None:
        reason += "; parent chosen once SR-IOV is enabled"
    # Every field from values of their type already (the GPU's, the planner's): built
    # without validating them again, the most frequent step of a fleet's plans.
    return built(
        Action,
        kind=ActionKind.CREATE,
        address=address,
        gpu=g.address,
        layout=g.layout,
        type_name=name,
        type_id=type_id,
        parent=parent,
        uuid=uuid,
        vf=vf,
        before=None,
        after=after,
        reason=reason,
        disruption=action_disruption(ActionKind.CREATE),
    )


def _vgpu_view(v: Vgpu) -> dict[str, object]:
    view: dict[str, object] = {"type": v.type_name, "type_id": v.type_id, "parent": v.parent}
    if v.uuid:
        view["uuid"] = v.uuid
    return view


def plan(
    desired: DesiredState,
    snapshot: NodeSnapshot,
    in_use: Mapping[str, str] | None = None,
    policy: Policy | None = None,
    *,
    catalog: Catalog,
) -> Plan:
    """Compute the plan. Pure and deterministic: same inputs, same plan.

    ``in_use`` maps a vGPU key (mdev UUID or VF address) to its holder, e.g.
    ``pod default/virt-launcher-vm1``. ``policy`` defaults to ``desired.policy``.
    ``catalog`` advises on types the GPU's driver does not describe.
    Raises :class:`PlanningError` when a layout cannot fit, stating the numbers.
    """
    return _Planner(
        desired,
        snapshot,
        in_use or {},
        policy if policy is not None else desired.policy,
        catalog,
    ).run()
