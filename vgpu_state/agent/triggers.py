"""Why the agent reconciles: every trigger, one name each, registered in one place.

A trigger asks the :class:`~vgpu_state.agent.queue.WorkQueue` for a reconcile;
the queue folds a burst of them into one batch, and the reconcile counts each
under its name (the ``source`` label of ``vgpu_state_triggers_total``, whose
series exist from the start, one per member). The sources are wired in one
place, :meth:`vgpu_state.agent.run.Agent.run`: the agent's own (start,
config, resync, holders) and the :class:`TriggerSource` values the assembly
adds (the Node watch, the VGPUNodeState watch, the kubelet's restarts). The worker asks for
:attr:`Trigger.RETRY` itself after a failed reconcile.

Services that run beside the reconcile and never ask for one (the DRA plugin,
the allocatable monitor) are :data:`Service` values, not trigger sources.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum


class Trigger(StrEnum):
    """A reason to reconcile, named after its source."""

    START = "start"
    """The agent started: restore the layout (after a reboot, a crash, an upgrade)."""
    CONFIG = "config"
    """The ConfigMap volume changed (``agent.configwatch.ConfigDirWatcher``)."""
    NODE = "node"
    """The Node's labels or its UID (deleted and registered again) changed
    (``agent.run.node_watch_starter``)."""
    NODESTATE = "nodestate"
    """The node's ``VGPUNodeState`` was deleted: write it again
    (``agent.run.nodestate_watch_starter``)."""
    RESYNC = "resync"
    """The periodic resync (``agent.resync.Resync``)."""
    HOLDERS = "holders"
    """A holder a deferred switch waits for went away (``agent.holderwatch.HolderWatch``)."""
    KUBELET = "kubelet"
    """The kubelet restarted: a new ``kubelet.sock`` (the device plugin manager saw it)."""
    RETRY = "retry"
    """The worker's backoff after a failed reconcile (``agent.worker.Worker``)."""


Fire = Callable[[Trigger], None]
"""Ask for a reconcile: never blocks, safe from any thread."""
Stop = Callable[[], None]

TriggerSource = Callable[[Fire], Stop]
"""Started with the agent: calls ``fire`` when its trigger happens; returns its stop."""

Service = Callable[[], Stop]
"""Started with the agent, never asks for a reconcile; returns its stop."""
