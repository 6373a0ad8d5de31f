"""The agent's rollout gate: a disruptive plan applies only while this node holds a slot.

The slots are Leases (:class:`vgpu_state.kube.rollout.RolloutSlots`); their
number is the plan's ``policy.max-unavailable``. A plan that only creates
passes at once. The slot is renewed while the apply runs, released when the
node matches its layout, and kept (unrenewed) after a failure, so the Lease
expires and a broken change does not spread faster than one node per
Lease duration.
"""

from __future__ import annotations

import contextlib
import logging

from vgpu_state.kube.errors import ClusterError, ClusterUnreachableError
from vgpu_state.kube.rollout import RolloutSlots, Slot
from vgpu_state.model.plan import Disruption, Plan, plan_disruption

log = logging.getLogger(__name__)


def disruptive(plan: Plan) -> bool:
    """The plan takes something away: a step above ``none`` (:class:`Disruption`).

    Today that is a plan that destroys a vGPU; anything else it does only adds.
    Computed from the steps themselves, not from the plan's stored summary.
    """
    return plan_disruption(plan.actions).level is not Disruption.NONE


class LeaseRolloutGate:
    """:class:`~vgpu_state.agent.reconciler.RolloutGate` on rollout-slot Leases."""

    def __init__(self, slots: RolloutSlots, renew_every: float | None = None) -> None:
        self.slots = slots
        self._renew_every = renew_every
        self._slot: Slot | None = None
        self._renewal: contextlib.ExitStack | None = None
        self.waiting = False

    def admit(self, plan: Plan) -> bool:
        if not disruptive(plan):
            self.waiting = False
            return True
        self.slots.slots = max(1, plan.policy.max_unavailable)
        try:
            slot = self.slots.acquire()
        except (ClusterError, ClusterUnreachableError) as e:
            log.warning("cannot take a rollout slot: %s; nothing is changed", e)
            self.waiting = True
            return False
        if slot is None:
            if not self.waiting:
                log.info(
                    "all %d rollout slot(s) are taken; the disruptive plan waits",
                    self.slots.slots,
                )
            self.waiting = True
            return False
        self.waiting = False
        self._slot = slot
        self._start_renewing(slot)
        return True

    def finished(self, converged: bool) -> None:
        self._stop_renewing()
        slot, self._slot = self._slot, None
        if slot is None:
            return
        if not converged:
            log.warning(
                "keeping rollout slot %s until it expires (the apply did not converge)", slot.name
            )
            return
        try:
            self.slots.release(slot)
        except (ClusterError, ClusterUnreachableError) as e:
            log.warning("cannot release rollout slot %s: %s (it expires)", slot.name, e)

    def _start_renewing(self, slot: Slot) -> None:
        self._renewal = contextlib.ExitStack()
        self._renewal.enter_context(self.slots.held(slot, every=self._renew_every))

    def _stop_renewing(self) -> None:
        if self._renewal is not None:
            self._renewal.close()
        self._renewal = None
