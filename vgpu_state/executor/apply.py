"""``apply(plan, host)``: run a plan's steps in order, idempotently, and verify."""

from __future__ import annotations

import logging
import time
import uuid as uuid_mod
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from vgpu_state.model.desired import DesiredState
from vgpu_state.model.errors import (
    BlockedError,
    DriverError,
    HostError,
    HostUnreadableError,
    PlanningError,
    Reason,
    TypeNotListedError,
)
from vgpu_state.model.plan import MODE_KINDS, Action, ActionKind, GpuPlan, Plan
from vgpu_state.model.snapshot import Gpu, NodeSnapshot
from vgpu_state.planner.compare import differences
from vgpu_state.planner.expected import expected_gpu, modes_view
from vgpu_state.ports.host import HostPort
from vgpu_state.statefiles.journal import Journal

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    """How one step ended (the journal records the value)."""

    OK = "ok"
    SKIPPED = "skipped"
    """The live state already was what the step makes it."""
    FAILED = "failed"


@dataclass(frozen=True)
class StepResult:
    address: str
    kind: str
    outcome: Outcome
    seconds: float
    message: str = ""


@dataclass(frozen=True)
class ApplyResult:
    plan_id: str
    steps: tuple[StepResult, ...]
    snapshot: NodeSnapshot
    """A fresh scan taken after the last step."""
    seconds: float
    notes: tuple[str, ...] = ()
    """Planned creates that did not happen, and why (e.g. blocked once SR-IOV came up)."""
    differences: tuple[str, ...] = ()
    """How the fresh scan differs from the desired layout (``apply(..., desired=)``)."""

    @property
    def converged(self) -> bool:
        """Everything planned happened and the fresh scan shows the desired layout."""
        return not self.notes and not self.differences

    @property
    def counts(self) -> Counter[str]:
        return Counter(s.outcome for s in self.steps)


class ApplyError(HostError):
    """A step failed; nothing after it ran. Names the step, the errno and what did not run.

    Its :attr:`reason` and :attr:`errno` are the failed driver call's.
    """

    def __init__(
        self,
        action: Action,
        cause: DriverError,
        not_run: tuple[Action, ...],
        steps: tuple[StepResult, ...],
    ) -> None:
        self.action = action
        self.cause = cause
        self.not_run = not_run
        self.steps = steps
        self.errno = cause.errno
        self._reason = cause.reason
        rest = f"{len(not_run)} step(s) not run" if not_run else "no steps left"
        super().__init__(f"{action.kind.value} {action.address} failed: {cause} ({rest})")


class VerificationError(HostError):
    """The re-scan after a GPU's steps does not show what the plan should produce."""

    default_reason = Reason.VERIFICATION_FAILED

    def __init__(self, gpu: str, missing: list[str], unexpected: list[str]) -> None:
        self.gpu = gpu
        self.missing = missing
        self.unexpected = unexpected
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if unexpected:
            parts.append("unexpected " + ", ".join(unexpected))
        super().__init__(f"gpu[{gpu}] does not match the plan after applying: {'; '.join(parts)}")


Progress = Callable[[Action, StepResult], None]

Replan = Callable[[Plan, GpuPlan, tuple[Action, ...], NodeSnapshot, Mapping[str, str]], Plan]
"""Plans the creates that waited for SR-IOV (or for a GPU's mode or GPU instances), once
they are there: ``replan(plan, gpu header, waiting creates, live snapshot, in use) ->
plan of that GPU``. The reconcile supplies it (:func:`vgpu_state.reconcile.replan_deferred`)."""


def _read_failures(g: Gpu | None) -> list[str]:
    """The scan problems of ``g`` that are failed reads (not facts about the host)."""
    if g is None:
        return []
    return [p for p in g.problems if p.startswith("cannot ") or " missing: " in p]


def _vgpu_set(g: Gpu | None) -> set[str]:
    """What verification compares: the vGPUs, and the modes where they were read."""
    if g is None:
        return set()
    return {f"{v.key} ({v.type_name})" for v in g.vgpus} | modes_view(g)


@dataclass
class _Run:
    plan: Plan
    host: HostPort
    journal: Journal | None
    in_use: Mapping[str, str]
    progress: Progress | None
    replan: Replan | None
    plan_id: str
    clock: Callable[[], float] = time.time
    steps: list[StepResult] = field(default_factory=list)

    def record(self, event: str, **fields: object) -> None:
        if self.journal is not None:
            self.journal.append(
                {
                    "event": event,
                    "plan_id": self.plan_id,
                    "node": self.plan.node,
                    "config": self.plan.selection.config,
                    "selection": self.plan.selection.source,
                    **fields,
                }
            )

    def already_done(self, a: Action, live: Gpu | None) -> bool:
        """Idempotence: is the live state already what this step would make it?"""
        if live is None:
            return False
        if a.kind in MODE_KINDS:
            return _mode_done(a, live)
        by_key = {v.key: v for v in live.vgpus}
        if a.kind is ActionKind.ENABLE_SRIOV:
            return live.sriov_numvfs > 0
        key = a.vf if a.vf is not None else a.uuid
        if a.kind is ActionKind.DESTROY:
            return key not in by_key
        existing = by_key.get(key or "")
        return existing is not None and existing.type_name == a.type_name

    def perform(self, a: Action) -> None:
        h = self.host
        if a.kind is ActionKind.ENABLE_SRIOV:
            h.enable_sriov(a.gpu)
        elif a.kind is ActionKind.DISABLE_SRIOV:
            h.disable_sriov(a.gpu)
        elif a.kind is ActionKind.SET_MIG_MODE:
            h.set_mig_mode(a.gpu, bool(a.enabled))
        elif a.kind is ActionKind.SET_HETEROGENEOUS_MODE:
            h.set_heterogeneous_mode(a.gpu, bool(a.enabled))
        elif a.kind is ActionKind.DESTROY_GPU_INSTANCE:
            assert a.gi_id is not None
            h.destroy_gpu_instance(a.gpu, a.gi_id)
        elif a.kind is ActionKind.CREATE_GPU_INSTANCE:
            assert a.profile is not None
            h.create_gpu_instance(a.gpu, a.profile)
        elif a.kind is ActionKind.DESTROY:
            if a.vf is not None:
                h.clear_vf_type(a.vf)
            else:
                assert a.uuid is not None
                h.remove_mdev(a.uuid)
        else:
            assert a.parent is not None
            type_id = a.type_id if a.type_id is not None else self.listed_type_id(a)
            if a.vf is not None:
                h.set_vf_type(a.vf, type_id)
            else:
                assert a.uuid is not None
                h.create_mdev(a.parent, type_id, a.uuid)

    def listed_type_id(self, a: Action) -> int:
        """The id of a create's type from the driver's lists, read now (the plan could not
        know it while the GPU held vGPUs of another size)."""
        live = self.host.scan_gpu(a.gpu).gpu(a.gpu)
        parent = a.vf or a.parent
        lists = []
        if live is not None:
            lists = [vf.creatable for vf in live.vfs if vf.address == parent]
            lists += [live.pf_creatable] + [vf.creatable for vf in live.vfs]
        for creatable in lists:
            for c in creatable:
                if c.name == a.type_name:
                    return c.type_id
        listed = sorted({c.name for creatable in lists for c in creatable})
        raise TypeNotListedError(parent or a.gpu, a.type_name or "?", tuple(listed))

    def scan(self, why: str) -> NodeSnapshot:
        """A fresh scan; a host that cannot be read ends the apply as failed."""
        live = self.host.scan()
        if live.error is not None:
            self.record("plan-end", outcome="failed", failed=why)
            raise HostUnreadableError(f"{why}: {live.error}")
        return live

    def scan_gpu(self, live: NodeSnapshot, address: str) -> NodeSnapshot:
        """``live`` with a fresh read of the GPU at ``address``; an unreadable host fails."""
        part = self.host.scan_gpu(address)
        if part.error is not None:
            why = f"verify gpu[{address}]"
            self.record("plan-end", outcome="failed", failed=why)
            raise HostUnreadableError(f"{why}: {part.error}")
        return live.with_gpu_scan(address, part)

    def step(self, a: Action, live: Gpu | None, remaining: tuple[Action, ...]) -> None:
        """Run one step and journal it: one record per step, written when it ends."""
        wall = self.clock()
        started = time.perf_counter()
        error: DriverError | None = None
        if self.already_done(a, live):
            result = StepResult(a.address, a.kind.value, Outcome.SKIPPED, 0.0, "already done")
        else:
            try:
                self.perform(a)
                result = StepResult(
                    a.address, a.kind.value, Outcome.OK, time.perf_counter() - started
                )
            except DriverError as e:
                error = e
                seconds = time.perf_counter() - started
                result = StepResult(a.address, a.kind.value, Outcome.FAILED, seconds, str(e))
        self.steps.append(result)
        log.info(
            "%s %s%s: %s%s",
            a.kind.value,
            a.address,
            f" {a.type_name}" if a.type_name else "",
            result.outcome,
            f" ({error})" if error else "",
        )
        self.record(
            "action",
            address=a.address,
            kind=a.kind.value,
            type=a.type_name,
            started=round(wall, 6),
            ended=round(wall + result.seconds, 6),
            outcome=result.outcome,
            errno=error.errno if error else 0,
            **({"message": str(error)} if error else {}),
        )
        if self.progress:
            self.progress(a, result)
        if error is not None:
            self.record("plan-end", outcome="failed", failed=a.address, errno=error.errno)
            raise ApplyError(a, error, remaining, tuple(self.steps)) from error


def apply(
    plan: Plan,
    host: HostPort,
    *,
    journal: Journal | None = None,
    in_use: Mapping[str, str] | None = None,
    skip_blocked: bool = False,
    progress: Progress | None = None,
    snapshot: NodeSnapshot | None = None,
    clock: Callable[[], float] = time.time,
    replan: Replan | None = None,
    desired: DesiredState | None = None,
) -> ApplyResult:
    """Run the plan's steps in order; stop at the first failure; verify every GPU.

    Raises :class:`BlockedError` when the plan has blocked items and
    ``skip_blocked`` is false, :class:`ApplyError` when a step fails (no further
    step runs), :class:`VerificationError` when a re-scan disagrees with the plan.

    Every apply ends with a fresh scan; with ``desired`` it is compared with the
    layout as ``assert`` compares it. The journal's ``plan-end`` says ``converged``
    only when every planned step happened, nothing was blocked and that comparison
    finds no difference; otherwise ``partial``, with the notes and differences.
    """
    if plan.blocked and not skip_blocked:
        raise BlockedError(
            f"the plan has {len(plan.blocked)} blocked item(s); resolve them or allow "
            "applying the rest"
        )
    if replan is None and any(
        a.kind is ActionKind.CREATE and a.parent is None for a in plan.actions
    ):
        raise PlanningError(
            "the plan has creates that wait for SR-IOV; applying it needs a replan function"
        )
    run = _Run(
        plan, host, journal, in_use or {}, progress, replan, uuid_mod.uuid4().hex[:12], clock
    )
    try:
        return _execute(run, snapshot, desired)
    finally:
        if journal is not None:
            journal.close()


def _execute(run: _Run, snapshot: NodeSnapshot | None, desired: DesiredState | None) -> ApplyResult:
    plan = run.plan
    started = time.perf_counter()
    run.record(
        "plan-start",
        fingerprint=plan.snapshot_fingerprint,
        actions=len(plan.actions),
        blocked=len(plan.blocked),
    )
    live = snapshot if snapshot is not None else run.scan("before applying")
    all_actions = plan.actions
    by_gpu: dict[str, list[Action]] = {}
    for a in all_actions:
        by_gpu.setdefault(a.gpu, []).append(a)
    position = 0
    late_blocked = 0
    notes: list[str] = []
    # While it works, the apply reads back only the GPU it just changed; the one
    # full scan of the node is the final verification below.
    for header in plan.gpus:
        actions = tuple(by_gpu.get(header.address, ()))
        if not actions:
            continue
        before = live
        immediate = [a for a in actions if not (a.kind is ActionKind.CREATE and a.parent is None)]
        deferred = [a for a in actions if a.kind is ActionKind.CREATE and a.parent is None]
        current = live.gpu(header.address)  # the same for every step of this GPU
        # ... but for a GPU whose mode changes: its later steps see what the earlier
        # ones made (SR-IOV is enabled again after it was disabled).
        evolves = any(a.kind in MODE_KINDS for a in actions)
        for a in immediate:
            position += 1
            run.step(a, current, all_actions[position:])
            if evolves and current is not None:
                current = expected_gpu(current, (a,))
        expected = _expected(before, header.address, actions)
        live = run.scan_gpu(live, header.address)
        if deferred:
            assert run.replan is not None
            made = _expected(before, header.address, tuple(immediate))
            want_modes, got_modes = modes_view(made), modes_view(live.gpu(header.address))
            if want_modes != got_modes:
                run.record("plan-end", outcome="failed", failed=f"verify gpu[{header.address}]")
                raise VerificationError(
                    header.address,
                    sorted(want_modes - got_modes),
                    sorted(got_modes - want_modes),
                )
            try:
                sub = run.replan(plan, header, tuple(deferred), live, run.in_use)
            except PlanningError as e:
                # Nothing of the waiting creates can be made: say so, keep what ran.
                notes.extend(
                    f"{len(deferred)} planned create(s) on gpu[{header.address}] not made "
                    f"after SR-IOV was enabled: {line}"
                    for line in str(e).splitlines()
                )
                position += len(deferred)
                sub = None
            if sub is None:
                want = _vgpu_set(_expected(before, header.address, tuple(immediate)))
                got = _vgpu_set(live.gpu(header.address))
                if want != got:
                    run.record("plan-end", outcome="failed", failed=f"verify gpu[{header.address}]")
                    raise VerificationError(header.address, sorted(want - got), sorted(got - want))
                continue
            late_blocked += len(sub.blocked)
            notes.extend(
                f"{b.type_name} on gpu[{header.address}] not created after SR-IOV was "
                f"enabled: {b.reason}"
                for b in sub.blocked
            )
            sub_actions = sub.gpu_actions(header.address)
            before = live
            current = live.gpu(header.address)
            for a in sub_actions:
                run.step(a, current, all_actions[position + len(deferred) :])
            position += len(deferred)
            expected = _expected(before, header.address, sub_actions)
            live = run.scan_gpu(live, header.address)
        want = _vgpu_set(expected)
        got = _vgpu_set(live.gpu(header.address))
        if want != got:
            unread = _read_failures(live.gpu(header.address))
            if unread:
                run.record("plan-end", outcome="failed", failed=f"verify gpu[{header.address}]")
                raise HostUnreadableError(
                    f"gpu[{header.address}] could not be verified after applying: "
                    + "; ".join(unread)
                )
            run.record("plan-end", outcome="failed", failed=f"verify gpu[{header.address}]")
            raise VerificationError(header.address, sorted(want - got), sorted(got - want))
    final = run.scan("verify the node")
    found = differences(desired, final) if desired is not None else ()
    seconds = time.perf_counter() - started
    blocked = len(plan.blocked) + late_blocked
    outcome = "partial" if (blocked or notes or found) else "converged"
    extra: dict[str, object] = {}
    if notes or found:
        extra["differences"] = [*notes, *found]
    run.record("plan-end", outcome=outcome, blocked=blocked, seconds=round(seconds, 6), **extra)
    return ApplyResult(run.plan_id, tuple(run.steps), final, seconds, tuple(notes), found)


def _mode_done(a: Action, live: Gpu) -> bool:
    """Idempotence of a mode step: is the GPU (as last read, or as the steps before
    left it) already so? Unknown modes (not read) are never taken as done."""
    if a.kind is ActionKind.DISABLE_SRIOV:
        return live.sriov_numvfs == 0
    modes = live.modes
    if modes is None or a.kind is ActionKind.CREATE_GPU_INSTANCE:
        return False
    if a.kind is ActionKind.SET_MIG_MODE:
        return modes.mig is a.enabled and modes.mig_pending is None
    if a.kind is ActionKind.SET_HETEROGENEOUS_MODE:
        return modes.heterogeneous is a.enabled
    return all(gi.id != a.gi_id for gi in modes.gpu_instances)


def _expected(before: NodeSnapshot, address: str, actions: tuple[Action, ...]) -> Gpu | None:
    """The GPU at ``address`` as ``actions`` (its steps) should leave it."""
    g = before.gpu(address)
    return expected_gpu(g, actions) if g is not None and actions else g
