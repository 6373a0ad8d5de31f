"""Creates that wait for SR-IOV: their parents are chosen once the virtual functions exist."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from vgpu_state.catalog import Catalog
from vgpu_state.model.desired import DesiredGpu, DesiredState
from vgpu_state.model.gpumode import GpuMode
from vgpu_state.model.plan import Action, GpuPlan, Plan
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.planner import plan as make_plan


def replan_deferred(
    plan: Plan,
    header: GpuPlan,
    deferred: tuple[Action, ...],
    live: NodeSnapshot,
    in_use: Mapping[str, str],
    *,
    catalog: Catalog,
) -> Plan:
    """After SR-IOV is on (or a GPU's mode or GPU instances changed), plan the creates
    whose parents the plan could not know yet.

    The deferred creates and the vGPUs the plan kept on the GPU
    (:attr:`GpuPlan.deferred_kept`) are its whole layout; vGPUs already there beyond
    those (an earlier, interrupted run made them) count towards it, and nothing is
    destroyed. The GPU's mode and
    GPU instances are taken as the fresh scan reads them (the plan's mode steps ran
    before). Creates this plan cannot place are its blocked items.
    """
    counts = Counter(a.type_name for a in deferred if a.type_name)
    counts.update(dict(header.deferred_kept))
    g = live.gpu(header.address)
    modes = g.modes if g is not None else None
    mode = modes.mode if modes is not None else GpuMode.TIME_SLICED
    geometry = tuple(sorted(modes.gi_counts().items())) if mode is GpuMode.MIG and modes else ()
    desired = DesiredState(
        node=plan.node,
        config=plan.selection.config,
        selection_source=plan.selection.source,
        policy=plan.policy.model_copy(update={"prune": False}),
        gpus=(
            DesiredGpu(
                address=header.address,
                index=header.index,
                model=header.model,
                types=tuple(sorted(counts.items())),
                entry=header.entry,
                mode=mode,
                mig_geometry=geometry,
            ),
        ),
    )
    return make_plan(desired, live, in_use, desired.policy, catalog=catalog)


def deferred_replanner(
    catalog: Catalog,
) -> Callable[[Plan, GpuPlan, tuple[Action, ...], NodeSnapshot, Mapping[str, str]], Plan]:
    """:func:`replan_deferred` with its catalog, as the executor's ``replan`` hook."""

    def replan(
        plan: Plan,
        header: GpuPlan,
        deferred: tuple[Action, ...],
        live: NodeSnapshot,
        in_use: Mapping[str, str],
    ) -> Plan:
        return replan_deferred(plan, header, deferred, live, in_use, catalog=catalog)

    return replan
