"""One reconcile of one node, as plain functions over the ports.

``reconcile_once(ports, settings)`` gathers the inputs (config, labels,
selection, a fresh scan, held vGPUs), plans, applies when asked, verifies
with a fresh scan and reports to the cluster and the device plugin. The CLI
and the agent both call it; neither holds its own copy of this path.
"""

from vgpu_state.reconcile.deferred import deferred_replanner, replan_deferred
from vgpu_state.reconcile.once import (
    Gate,
    Mode,
    NoConfigSelectedError,
    NoGpusError,
    Ports,
    apply_saved,
    gather,
    plan_inputs,
    publish,
    publish_failure,
    read_holders,
    reconcile_once,
    stale_changes,
    withhold,
)
from vgpu_state.reconcile.report import Inputs, QuietReporter, Report, Reporter
from vgpu_state.reconcile.settings import Settings
from vgpu_state.reconcile.status import node_status, pending_switches, withheld_keys

__all__ = [
    "Gate",
    "Inputs",
    "Mode",
    "NoConfigSelectedError",
    "NoGpusError",
    "Ports",
    "QuietReporter",
    "Report",
    "Reporter",
    "Settings",
    "apply_saved",
    "deferred_replanner",
    "gather",
    "node_status",
    "pending_switches",
    "plan_inputs",
    "publish",
    "publish_failure",
    "read_holders",
    "reconcile_once",
    "replan_deferred",
    "stale_changes",
    "withheld_keys",
    "withhold",
]
