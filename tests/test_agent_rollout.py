"""The agent's rollout gate on Leases: disruptive plans wait for a slot, creates never do.

On the real API server (``tests/realcluster.py``), each node's gate with that
node's agent token under the shipped RBAC (Leases in the agent's namespace).
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

from tests.realcluster import AGENT_SA, NAMESPACE, ControlPlane
from tests.test_agent_reconciler import BATCH, Node
from vgpu_state.agent.rollout import LeaseRolloutGate, disruptive
from vgpu_state.catalog import default_catalog
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.rollout import RolloutSlots
from vgpu_state.model.plan import Plan
from vgpu_state.reconcile import Settings, gather, plan_inputs

CLOCK = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def gate(cluster: ControlPlane, holder: str) -> LeaseRolloutGate:
    """The gate of the agent on node ``holder``, as that agent (its ServiceAccount's token)."""
    api = KubeApi(cluster.api_client(cluster.agent_token(holder)), holder, (5.0, 30.0))
    slots = RolloutSlots(api, NAMESPACE, holder, clock=lambda: CLOCK)
    return LeaseRolloutGate(slots, renew_every=0.05)


def plan_of(node: Node) -> Plan:
    settings = Settings(catalog=default_catalog())
    return plan_inputs(gather(node.ports, settings), settings)


def test_two_nodes_with_a_disruptive_change_apply_one_after_the_other(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    a, b = Node(tmp_path / "a", "swap"), Node(tmp_path / "b", "swap")
    try:
        gate_a, gate_b = gate(cluster, "node-a"), gate(cluster, "node-b")
        plan_a = plan_of(a)
        assert disruptive(plan_a) and plan_a.policy.max_unavailable == 1
        assert gate_a.admit(plan_a), "the first node takes the only slot"
        # While node a applies, node b's reconcile changes nothing and waits.
        outcome = b.reconciler(gate=gate_b)(BATCH, threading.Event())  # type: ignore[arg-type]
        assert not outcome.ok and "waiting for a rollout slot" in outcome.summary
        assert b.host.changes == [] and gate_b.waiting
        gate_a.finished(converged=True)
        assert gate_b.slots.holders() == {"vgpu-state-rollout-0": None}
        outcome = b.reconciler(gate=gate_b)(BATCH, threading.Event())  # type: ignore[arg-type]
        assert outcome.ok and b.layout() == {"A2-4C": 1, "A2-4Q": 3}
        assert gate_b.slots.holders() == {"vgpu-state-rollout-0": None}, "released on success"
    finally:
        a.sim.close()
        b.sim.close()


def test_a_failed_apply_keeps_the_slot_until_it_expires(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    a = Node(tmp_path / "a", "swap")
    try:
        gate_a = gate(cluster, "node-a")
        assert gate_a.admit(plan_of(a))
        gate_a.finished(converged=False)
        assert gate_a.slots.holders() == {"vgpu-state-rollout-0": "node-a"}
    finally:
        a.sim.close()


def test_creates_pass_without_touching_the_leases(cluster: ControlPlane, tmp_path: Path) -> None:
    a = Node(tmp_path / "a", "grow")
    try:
        gate_a = gate(cluster, "node-a")
        mark = cluster.audit_mark()
        plan = plan_of(a)
        assert not disruptive(plan) and plan.actions
        assert gate_a.admit(plan)
        agent = f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}"
        asked = [e.get("objectRef", {}).get("resource") for e in cluster.audit(mark, agent)]
        assert "leases" not in asked
    finally:
        a.sim.close()
