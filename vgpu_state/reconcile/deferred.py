"""Creates that wait for SR-IOV: their parents are chosen once the virtual functions exist."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from vgpu_state.catalog import Catalog
from vgpu_state.model.desired import DesiredGpu, DesiredState
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
    """After SR-IOV is on, plan the creates whose parents the plan could not know yet.

    The GPU had its VFs off when the plan was made, so it held no vGPUs: the
    deferred creates are its whole layout. vGPUs already there (an earlier,
    interrupted run made them) count towards it, and nothing is destroyed.
    Creates this plan cannot place are its blocked items.
    """
    counts = Counter(a.type_name for a in deferred if a.type_name)
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
