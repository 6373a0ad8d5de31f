"""One reconcile of the agent's node, as the worker runs it for each batch of triggers.

It is :func:`vgpu_state.reconcile.reconcile_once` plus what only a long-running
agent needs:

* **A config error never causes a write.** When the newest config document
  does not load, the agent changes nothing on the host (not even to repair
  drift with the last good document) and reports the node ``Degraded`` with
  every located error (``file:line:column: message``).
* **Modes.** ``enforce`` applies, skipping blocked items (they are reported);
  ``plan-only`` plans and reports what it would do. ``--mode`` is the default;
  the node label ``vgpu-state.io/mode`` (``enforce`` or ``plan-only``), read
  every reconcile, overrides it for that node, so a node pool is promoted to
  enforce (or held in plan-only) by labelling its nodes.
* **Rollout safety.** A plan that destroys anything applies only once the
  rollout gate grants one of the cluster's slots; otherwise nothing changes
  and the reconcile is retried. The slot goes back when the node matches.
* **Shutdown.** When the agent is asked to stop during an apply, the step in
  progress finishes and the apply stops there (the journal lets the next
  start resume).
* **The GPU Operator's operands** (``--gpu-operator``). Before a plan changes the
  host, the operator's sandbox device plugin and validator are paused (their
  node labels, :mod:`vgpu_state.kube.gpuoperator`) and their pods awaited; right
  after the apply (or its failure) they are restored. The first reconcile
  restores what an earlier run left paused. A plan with nothing to do touches
  no label.
* **Metrics.** Duration, actions by kind and result, vGPUs by type and state,
  blocked items, last success, config generation, the node's reported state and
  since when each deferred layout switch waits (``docs/alerts.md`` alerts on them).
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from vgpu_state.agent.metrics import AgentMetrics
from vgpu_state.agent.queue import Batch
from vgpu_state.agent.triggers import Trigger
from vgpu_state.agent.worker import PassResult
from vgpu_state.config.document import ConfigDocument
from vgpu_state.executor import ApplyResult, StepResult
from vgpu_state.model.errors import (
    ConfigError,
    TransientError,
    UserError,
    VgpuStateError,
)
from vgpu_state.model.plan import Action, Plan
from vgpu_state.model.status import ConfigState
from vgpu_state.reconcile import (
    Mode,
    NoConfigSelectedError,
    Ports,
    QuietReporter,
    Report,
    Settings,
    publish,
    publish_failure,
    read_holders,
    reconcile_once,
    withhold,
)
from vgpu_state.reconcile import node_status as status_of
from vgpu_state.reconcile.status import degraded_status, unselected_status

log = logging.getLogger(__name__)


class AgentMode:
    ENFORCE = "enforce"
    PLAN_ONLY = "plan-only"
    ALL = (ENFORCE, PLAN_ONLY)
    DEFAULT = PLAN_ONLY
    """``--mode`` when not given: report only, as ``deploy/`` and the Helm chart install it."""


MODE_LABEL = "vgpu-state.io/mode"
"""Node label that sets this node's agent mode (``enforce`` / ``plan-only``), over ``--mode``."""


class RolloutGate(Protocol):
    """Grants the right to apply a disruptive plan (a slot), and takes it back."""

    def admit(self, plan: Plan) -> bool:
        """True when ``plan`` may apply now (it is not disruptive, or a slot was taken)."""
        ...

    def finished(self, converged: bool) -> None:
        """The apply ended: release the slot if ``converged``, else keep it until it expires."""
        ...


class Operands(Protocol):
    """The GPU Operator's operands that must not run while the host changes."""

    def pause(self, stopping: Callable[[], bool]) -> bool:
        """Stop them on this node (raises when they do not stop; nothing was changed);
        ``False`` when ``stopping()`` turned true first (nothing is left paused)."""
        ...

    def restore(self) -> bool:
        """Start again what :meth:`pause` stopped; ``True`` when anything was written."""
        ...

    def recover(self) -> bool:
        """At start: :meth:`restore` what an earlier run left stopped."""
        ...


class StopRequested(Exception):
    """Raised between two steps of an apply when the agent is stopping."""


class _Hearing(QuietReporter):
    """Counts actions for the metrics; stops the apply between steps when asked."""

    def __init__(
        self,
        metrics: AgentMetrics,
        stopping: threading.Event,
        after_apply: Callable[[], None] | None = None,
    ) -> None:
        self._metrics = metrics
        self._stopping = stopping
        self._after_apply = after_apply

    def step(self, action: Action, result: StepResult) -> None:
        self._metrics.actions.labels(kind=str(action.kind), result=str(result.outcome)).inc()
        if self._stopping.is_set():
            raise StopRequested(f"stopped after {action.kind} {action.address}")

    def applied(self, plan: Plan, result: ApplyResult) -> None:
        if self._after_apply is not None:
            self._after_apply()


SLOT_POLL = 10.0
"""Seconds between a waiting node's attempts to take a rollout slot (jittered down
to half): a freed slot is taken within this, while each waiting node costs the API
server only a Lease read or two per attempt."""


class NodeReconciler:
    """The worker's reconcile callable for one node."""

    def __init__(
        self,
        ports: Ports,
        settings: Settings,
        metrics: AgentMetrics,
        mode: str = AgentMode.DEFAULT,
        rollout: RolloutGate | None = None,
        clock: Callable[[], float] = time.time,
        slot_poll: float = SLOT_POLL,
        rng: random.Random | None = None,
        on_mode: Callable[[str], None] | None = None,
        operands: Operands | None = None,
    ) -> None:
        if mode not in AgentMode.ALL:
            raise ValueError(f"mode must be one of {', '.join(AgentMode.ALL)}, got {mode!r}")
        self.ports = ports
        self.settings = settings
        self.metrics = metrics
        self.mode = mode
        """The default mode (``--mode``)."""
        self._on_mode = on_mode
        """Told the mode of each reconcile before it runs (the status shows it)."""
        self._current_mode = mode
        if on_mode is not None:
            on_mode(mode)
        self._bad_mode_label: str | None = None
        self.rollout = rollout
        self._clock = clock
        self._slot_poll = slot_poll
        self._rng = rng or random.Random()
        self._config_hash: str | None = None
        self._generation = 0
        self.last_report: Report | None = None
        self._busy = threading.Lock()
        self._asked: tuple[int, frozenset[str]] | None = None
        self.operands = operands
        """``--gpu-operator``: paused around every apply that changes the host."""
        self._operands_recovered = False
        self._operands_paused = False

    @property
    def current_mode(self) -> str:
        """The mode of the last reconcile: the node's ``vgpu-state.io/mode`` label, else
        :attr:`mode`."""
        return self._current_mode

    @current_mode.setter
    def current_mode(self, mode: str) -> None:
        self._current_mode = mode
        if self._on_mode is not None:
            self._on_mode(mode)

    def __call__(self, batch: Batch, stopping: threading.Event) -> PassResult:
        started = time.monotonic()
        with self._busy:
            try:
                outcome, result = self._reconcile(stopping)
            finally:
                # An apply that raised (or was stopped) never reached its restore.
                self._restore_operands()
        self.metrics.reconcile_duration.labels(mode=self.current_mode, result=result).observe(
            time.monotonic() - started
        )
        self.metrics.reconciles.labels(result=result).inc()
        for reason in batch.reasons:
            self.metrics.triggers.labels(source=Trigger(reason).value).inc()
        return outcome

    # one reconcile -----------------------------------------------------------------
    def _reconcile(self, stopping: threading.Event) -> tuple[PassResult, str]:
        try:
            # Before anything else (a config that does not load too): what an earlier
            # run left paused runs again.
            self._recover_operands()
        except TransientError as e:
            return PassResult(False, f"will retry: {e}", failed=True), "failed"
        except VgpuStateError as e:
            return PassResult(False, f"failed: {e}", failed=True), "failed"
        document, error = self._read_config()
        if error is not None:
            self._degraded(error)
            self.metrics.set_node_state(ConfigState.FAILED, self.current_mode)
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            return PassResult(True, f"degraded: config invalid: {first}", failed=True), "degraded"
        try:
            self._set_mode(self.ports.cluster.labels().get(MODE_LABEL))
        except TransientError as e:
            return PassResult(False, f"will retry: {e}", failed=True), "failed"
        except VgpuStateError as e:
            return PassResult(False, f"failed: {e}", failed=True), "failed"
        mode = Mode.APPLY if self.current_mode == AgentMode.ENFORCE else Mode.PLAN
        gate: Callable[[Plan], bool] | None = (
            self.rollout.admit if self.rollout is not None and mode is Mode.APPLY else None
        )
        if self.operands is not None and mode is Mode.APPLY:
            gate = self._pausing(gate, stopping)
        try:
            report = reconcile_once(
                self.ports,
                self.settings,
                mode=mode,
                skip_blocked=True,
                gate=gate,
                reporter=_Hearing(self.metrics, stopping, self._restore_operands),
                document=document,
                report_failure=True,
            )
        except StopRequested as stop:
            return PassResult(True, str(stop)), "stopped"
        except NoConfigSelectedError as e:
            try:
                self._unselected(e)
            except TransientError as failed:
                return PassResult(False, f"will retry: {failed}", failed=True), "failed"
            except VgpuStateError as failed:
                return PassResult(False, f"failed: {failed}", failed=True), "failed"
            self.metrics.set_node_state(None, self.current_mode)
            self.metrics.set_switches_deferred((), self._clock())
            return PassResult(True, f"left alone: {e}"), "unselected"
        except TransientError as e:
            self._failed_reported()
            return PassResult(False, f"will retry: {e}", failed=True), "failed"
        except UserError as e:
            # Reported as a failed status already; retrying will not help until an input changes.
            self._failed_reported()
            self._finished(converged=False)
            return PassResult(True, f"failed: {e}", failed=True), "failed"
        except VgpuStateError as e:
            self._failed_reported()
            self._finished(converged=False)
            return PassResult(False, f"failed: {e}", failed=True), "failed"
        self.last_report = report
        if report.declined:
            # Asked again every few seconds (jittered, so waiting nodes do not ask in
            # step), not with the failures' backoff: a slot freed by another node is
            # taken promptly, so a rollout has no idle gaps of minutes between nodes.
            retry = self._slot_poll * self._rng.uniform(0.5, 1.0)
            return (
                PassResult(False, "waiting for a rollout slot; nothing changed", retry_in=retry),
                "waiting",
            )
        if mode is Mode.PLAN:
            self._report_plan_only(report)
        self._observe(report)
        converged = report.converged
        if mode is Mode.APPLY:
            self._finished(converged=report.matches)
        if converged:
            self.metrics.last_success.set(self._clock())
            return PassResult(True, self._summary(report)), "success"
        result = "blocked" if report.plan.blocked and report.matches else "pending"
        return PassResult(True, self._summary(report)), result

    def holders_changed(self) -> bool:
        """True when a switch of the last plan is deferred and the held vGPUs are not
        the ones that plan was made with (read now, without a scan).

        ``False`` while a reconcile runs (it reads the holders itself), and once
        per change: a reconcile that fails to run is retried by the worker's
        backoff, not asked for again at every tick.
        """
        report = self.last_report
        if report is None or not report.plan.summary.switches_deferred:
            return False
        if not self._busy.acquire(blocking=False):
            return False
        try:
            held, _ = read_holders(self.ports, report.inputs.snapshot)
        finally:
            self._busy.release()
        now = frozenset(held)
        if now == frozenset(report.inputs.in_use):
            return False
        asked = (id(report), now)
        if asked == self._asked:
            return False
        self._asked = asked
        return True

    # the GPU Operator's operands ----------------------------------------------------
    def _recover_operands(self) -> None:
        """Once, before the first plan: restore what an earlier run left paused."""
        if self.operands is None or self._operands_recovered:
            return
        self.operands.recover()
        self._operands_recovered = True

    def _pausing(
        self, admit: Callable[[Plan], bool] | None, stopping: threading.Event
    ) -> Callable[[Plan], bool]:
        """The gate that pauses the operands once ``admit`` lets a plan that changes the
        host through (every step does: the operands learn the vGPUs only as they start)."""
        operands = self.operands
        assert operands is not None

        def gate(plan: Plan) -> bool:
            if admit is not None and not admit(plan):
                return False
            if plan.actions:
                self._operands_paused = True
                if not operands.pause(stopping.is_set):
                    raise StopRequested("stopped while the GPU Operator's operands were leaving")
            return True

        return gate

    def _restore_operands(self) -> None:
        """After an apply: start the operands again; a failure is retried next reconcile."""
        if self.operands is None or not self._operands_paused:
            return
        try:
            self.operands.restore()
        except VgpuStateError as e:
            log.error("the GPU Operator's operands stay paused for now: %s", e)
            self._operands_recovered = False
        self._operands_paused = False

    def _failed_reported(self) -> None:
        """A reconcile that raised has reported the node failed (in either mode)."""
        self.metrics.set_node_state(ConfigState.FAILED, self.current_mode)

    def _finished(self, converged: bool) -> None:
        if self.rollout is not None and self.current_mode == AgentMode.ENFORCE:
            self.rollout.finished(converged)

    def _set_mode(self, label: str | None) -> None:
        """This reconcile's mode: the node's mode label when it names one, else ``--mode``."""
        if label is not None and label not in AgentMode.ALL:
            if self._bad_mode_label != label:
                log.warning(
                    "node label %s=%r is neither %s; using --mode %s",
                    MODE_LABEL,
                    label,
                    " nor ".join(AgentMode.ALL),
                    self.mode,
                )
                self._bad_mode_label = label
            label = None
        mode = label or self.mode
        if mode != self.current_mode:
            source = f"node label {MODE_LABEL}" if label else "--mode"
            log.info("mode %s (from %s)", mode, source)
        self.current_mode = mode

    # config ------------------------------------------------------------------------
    def _read_config(self) -> tuple[ConfigDocument | None, ConfigError | None]:
        """Read the config once: the document this reconcile applies, or why it is invalid."""
        source = self.ports.config
        try:
            document = source.document()
        except ConfigError as e:
            return None, e
        if source.error is not None:
            return None, source.error
        digest = hashlib.sha256(document.spec.model_dump_json().encode()).hexdigest()
        if digest != self._config_hash:
            self._config_hash = digest
            self._generation += 1
            self.metrics.config_generation.set(self._generation)
            if self._generation > 1:
                log.info("config changed (generation %d)", self._generation)
        return document, None

    def _degraded(self, error: ConfigError) -> None:
        message = str(error)
        log.error("config invalid; nothing is changed on the host:\n%s", message)
        cluster = self.ports.cluster
        publish_failure(cluster, degraded_status(cluster.node_name(), error), error)

    # reporting ---------------------------------------------------------------------
    def _unselected(self, error: NoConfigSelectedError) -> None:
        """No config selects the node (a fresh install, before an operator labels it): it
        is left alone. Its scan still goes to the status (``fleet plan`` plans it from
        there) and the vGPUs that exist are advertised, as plan-only does; no state label."""
        snapshot = self.ports.host.scan()
        self.ports.device_plugin.refresh(snapshot)
        withhold(self.ports, frozenset())  # no plan: nothing is pending
        cluster = self.ports.cluster
        cluster.report_status(unselected_status(cluster.node_name(), error))

    def _report_plan_only(self, report: Report) -> None:
        """Plan-only mode: the status says what enforce would do; the plugin gets the scan,
        and nothing is withheld (no switch runs)."""
        publish(self.ports, report, enforcing=False)

    def _observe(self, report: Report) -> None:
        held = report.inputs.in_use
        counts: Counter[tuple[str, str]] = Counter()
        for gpu in report.final.gpus:
            for v in gpu.vgpus:
                name = v.type_label
                counts[(name, "in_use" if v.key in held else "free")] += 1
        self.metrics.set_vgpus(counts)
        self.metrics.blocked_items.set(len(report.plan.blocked))
        # The state the node's status got (reconcile_once's, or _report_plan_only's).
        self.metrics.set_node_state(status_of(report).state, self.current_mode)
        # Only an enforcing agent waits for a holder; in plan-only mode nothing runs anyway.
        deferred = [str(g.address) for g in report.plan.gpus if g.deferred_switch is not None]
        enforcing = self.current_mode == AgentMode.ENFORCE
        self.metrics.set_switches_deferred(deferred if enforcing else (), self._clock())
        # What the node has that the KubeVirt CR does not permit yet (the controller's
        # to write); a plan-only node creates nothing, so its plan's entries are not due.
        missing = len(report.plan.cluster_actions) if enforcing else 0
        self.metrics.kubevirt_entries_missing.set(missing)

    def _summary(self, report: Report) -> str:
        vgpus = sum(n for _, n in report.live_layout())
        applied = report.applied
        changed = applied.counts["ok"] if applied is not None else 0
        parts = [f"config {report.inputs.config!r}", f"{vgpus} vGPU(s)"]
        if changed:
            parts.append(f"{changed} change(s) made")
        if report.plan.blocked:
            parts.append(f"{len(report.plan.blocked)} blocked")
        parts.extend(e.message for e in report.plan.skipped)
        if self.current_mode == AgentMode.PLAN_ONLY and report.plan.actions:
            parts.append(f"{len(report.plan.actions)} change(s) planned, not applied (plan-only)")
        elif not report.matches:
            parts.append("not converged: " + "; ".join(report.differences[:3]))
        else:
            parts.append("converged")
        return ", ".join(parts)
