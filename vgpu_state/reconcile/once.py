"""``reconcile_once(ports, settings)``: the one path from inputs to a plan and an apply."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from vgpu_state.config import resolve, select
from vgpu_state.config.document import ConfigDocument
from vgpu_state.executor import ApplyResult, StepResult, apply
from vgpu_state.model.desired import DesiredState
from vgpu_state.model.errors import (
    BlockedError,
    HostError,
    Reason,
    SelectionError,
    StalePlanError,
    VgpuStateError,
    require_readable,
)
from vgpu_state.model.inuse import InUse
from vgpu_state.model.plan import Action, Plan
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import NodeStatus
from vgpu_state.planner import differences, expected_snapshot
from vgpu_state.planner import plan as make_plan
from vgpu_state.planner.inuse import normalise_in_use
from vgpu_state.planner.saved import SavedPlan, check_saved_plan
from vgpu_state.ports import (
    ClusterPlanner,
    ClusterPort,
    ConfigSource,
    DevicePluginSink,
    HostPort,
    NoClusterPlan,
    NoDevicePlugin,
    NoProcesses,
    ProcessHolders,
)
from vgpu_state.ports.withheld import NoWithheldRecord, WithheldSink
from vgpu_state.reconcile.deferred import deferred_replanner
from vgpu_state.reconcile.report import Inputs, QuietReporter, Report, Reporter
from vgpu_state.reconcile.settings import Settings
from vgpu_state.reconcile.status import (
    applied_events,
    failed_event,
    failed_status,
    node_status,
    still_withheld,
    withheld_keys,
    withheld_vgpus,
)
from vgpu_state.statefiles import HostLock, Journal

log = logging.getLogger(__name__)


class Mode(StrEnum):
    PLAN = "plan"
    """Read and plan; change nothing."""
    APPLY = "apply"
    """Read, plan, and apply what the gate lets through; verify with a fresh scan."""


@dataclass(frozen=True)
class Ports:
    """The world one reconcile talks to."""

    host: HostPort
    cluster: ClusterPort
    config: ConfigSource
    device_plugin: DevicePluginSink = field(default_factory=NoDevicePlugin)
    dra: DevicePluginSink = field(default_factory=NoDevicePlugin)
    """Gets the vGPUs published through Dynamic Resource Allocation (never the plugin's)."""
    processes: ProcessHolders = field(default_factory=NoProcesses)
    """The node's processes holding a vGPU open (``/proc``), read on every reconcile."""
    kubevirt: ClusterPlanner = field(default_factory=NoClusterPlan)
    """The plan's cluster part: the KubeVirt CR entries it implies, and the CR's blockers."""
    withheld: WithheldSink = field(default_factory=NoWithheldRecord)
    """Records what the device plugin and DRA are told to withhold, with why (the
    agent's ``withheld.json``, which ``vgpu-state scan`` reads)."""


class NoConfigSelectedError(SelectionError):
    """Nothing selects a config for the node: no label, no matching node-selector, no default."""

    default_reason = Reason.NO_CONFIG_SELECTED


class NoGpusError(HostError):
    """The selected config lays out vGPUs, but the scan found no NVIDIA GPU: they fell
    off the bus, the driver did not bind, or this is not the host's sysfs. Never "the
    node matches": no entry applies to a GPU then, and nothing would differ."""

    default_reason = Reason.NO_GPUS

    def __init__(self, node: str, config: str, detail: str, sysfs_root: str) -> None:
        super().__init__(
            f"no NVIDIA GPUs found under {sysfs_root} on node {node}: "
            f'configuration "{config}" lays out vGPUs'
        )
        self.node = node
        self.config = config
        self.detail = detail
        """How the config was selected (:attr:`Inputs.detail`)."""
        self.sysfs_root = sysfs_root


def lays_out_vgpus(document: ConfigDocument, config: str | None) -> bool:
    """The config named ``config`` lays out at least one vGPU somewhere."""
    named = document.configs.get(config) if config else None
    return named is not None and any(
        count > 0 for e in named.entries for count in e.vgpu_devices.values()
    )


Gate = Callable[[Plan], bool]
"""Asked after planning, before any change: apply this plan? ``False`` changes nothing."""


def gather(
    ports: Ports,
    settings: Settings,
    config_name: str | None = None,
    document: ConfigDocument | None = None,
) -> Inputs:
    """Read the inputs of a plan: config, node labels, selection, a fresh scan, holders.

    ``config_name`` forces a config instead of selecting one by the node's labels;
    ``document`` is the config when the caller read it already.
    """
    if document is None:
        document = ports.config.document()
    node = ports.cluster.node_name()
    labels = dict(ports.cluster.labels())
    if config_name:
        chosen, source, detail = config_name, "flag", f"-c {config_name}"
    else:
        sel = select(document, node, labels, settings.label_key, settings.default_config)
        if sel.config is None:
            raise NoConfigSelectedError(
                f"no config selected for node {node}: {sel.detail}. Label the node "
                f"({settings.label_key}=NAME), add a node-selector or a default, or give "
                "--default-config NAME"
            )
        chosen, source, detail = sel.config, sel.source, sel.detail
    snapshot = ports.host.scan()
    require_readable(snapshot)
    if not snapshot.gpus and lays_out_vgpus(document, chosen):
        raise NoGpusError(node, chosen, detail, snapshot.sysfs_root)
    desired = resolve(
        document, chosen, snapshot.gpus, node, source, settings.catalog, strict=settings.strict
    )
    held, warnings = read_holders(ports, snapshot)
    prefixes = (f"vgpu-configs.{chosen}[", f"vgpu-configs.{chosen}.")
    warnings = [str(i) for i in document.warnings if i.path.startswith(prefixes)] + list(warnings)
    return Inputs(
        document,
        node,
        labels,
        chosen,
        source,
        detail,
        snapshot,
        InUse(held),
        desired,
        tuple(warnings),
    )


def holders(
    processes: ProcessHolders, cluster: ClusterPort, snapshot: NodeSnapshot
) -> tuple[dict[str, str], list[str]]:
    """Every holder of a vGPU of ``snapshot``: the node's processes (``/proc``), then the
    cluster's (the kubelet, claims, flags), which name the holder when both know it.

    ``/proc`` is read before the cluster is asked, so a VM the kubelet has
    forgotten is still seen; the warnings say what could not be read.
    """
    from_processes, proc_warnings = processes.holders(snapshot)
    merged = {**from_processes, **cluster.in_use()}
    held, warnings = normalise_in_use(InUse(merged), snapshot)
    return held, [*proc_warnings, *warnings]


def read_holders(ports: Ports, snapshot: NodeSnapshot) -> tuple[dict[str, str], list[str]]:
    """Who holds which vGPU of ``snapshot`` now (keys in the snapshot's form) and the
    warnings of reading them: the holders every plan is made with (:func:`holders`
    of the node's processes and the cluster).

    The agent reads them again with this, without a scan, while a layout switch
    waits for a holder (``docs/agent.md``, "What triggers a reconcile").
    """
    return holders(ports.processes, ports.cluster, snapshot)


def plan_inputs(inputs: Inputs, settings: Settings) -> Plan:
    """The plan of ``inputs`` (pure)."""
    return make_plan(inputs.desired, inputs.snapshot, inputs.in_use, catalog=settings.catalog)


def with_cluster_part(plan: Plan, inputs: Inputs, planner: ClusterPlanner, hear: Reporter) -> Plan:
    """``plan`` with its cluster part: the cluster actions and the cluster's blockers."""
    if isinstance(planner, NoClusterPlan):
        return plan  # no cluster to ask: the host's expected scan is not needed
    part = planner.cluster_plan(expected_snapshot(plan, inputs.snapshot), inputs.labels)
    for problem in part.problems:
        hear.warning(problem)
    if not part.actions and not part.blocked:
        return plan
    return plan.with_cluster(part.actions, part.blocked)


def read_and_plan(
    ports: Ports,
    settings: Settings,
    hear: Reporter,
    config_name: str | None = None,
    document: ConfigDocument | None = None,
) -> tuple[Inputs, Plan]:
    """The inputs (:func:`gather`) and the plan with its cluster part: what every
    reconcile computes before it applies anything (and all that a fleet plan asks of a
    node). ``hear`` gets the inputs' warnings and the plan."""
    inputs = gather(ports, settings, config_name, document)
    for message in inputs.warnings:
        hear.warning(message)
    plan = with_cluster_part(plan_inputs(inputs, settings), inputs, ports.kubevirt, hear)
    log.info(
        "node %s: configuration %r (%s): %d action(s), %d blocked",
        inputs.node,
        inputs.config,
        inputs.detail,
        len(plan.actions),
        len(plan.blocked),
    )
    hear.planned(plan)
    return inputs, plan


@contextmanager
def _host_lock(settings: Settings, hear: Reporter) -> Iterator[None]:
    if settings.lock_path is None:
        yield
        return

    def waiting(message: str) -> None:
        log.info("%s", message)
        hear.warning(message)

    with HostLock(
        settings.lock_path, settings.lock_timeout, "apply", settings.command, on_wait=waiting
    ):
        yield


def reconcile_once(
    ports: Ports,
    settings: Settings,
    *,
    mode: Mode = Mode.PLAN,
    config_name: str | None = None,
    skip_blocked: bool = False,
    gate: Gate | None = None,
    reporter: Reporter | None = None,
    document: ConfigDocument | None = None,
    report_failure: bool | None = None,
) -> Report:
    """Gather the inputs, select, plan, apply (in :attr:`Mode.APPLY`), verify, report.

    ``document``: the config the caller read and checked already (the source
    is then not read again, so what is applied is what was checked).
    ``report_failure``: tell the cluster port when the reconcile fails (a failed
    status and a Warning Event); by default only in :attr:`Mode.APPLY` (a plan by
    hand writes nothing), the agent asks for it in both modes.

    In :attr:`Mode.APPLY` the host lock is held from the first read to the
    last; ``gate`` sees the plan before any change (the CLI's confirmation);
    blocked items stop the apply unless ``skip_blocked``. A blocked item of the
    cluster (KubeVirt managing mdevs itself) stops every change: it raises
    :class:`BlockedError` without ``skip_blocked``, and with it the report
    says that nothing was applied and why. Every report ends
    with a fresh scan compared with the desired layout; the cluster port gets
    the status and Events, the device plugin the fresh snapshot.

    In :attr:`Mode.APPLY` the device plugin and DRA are told the vGPUs the plan
    withholds (:attr:`GpuPlan.withheld <vgpu_state.model.plan.GpuPlan.withheld>`, a
    pending switch's free vGPUs of departing types under ``in-use: evacuate``) as
    soon as it is made, before the gate is asked and before any change; a plan
    the gate declines still reports its status when it withholds anything.

    Raises the errors of :mod:`vgpu_state.model.errors` (after reporting a
    failed status to the cluster port when the node is known).
    """
    hear: Reporter = reporter or QuietReporter()
    lock = _host_lock(settings, hear) if mode is Mode.APPLY else nullcontext()
    inputs: Inputs | None = None
    try:
        # The config is read before the host lock is taken, so a config error leaves
        # nothing behind on the host, not even the lock file.
        if document is None:
            document = ports.config.document()
        with lock:
            inputs, plan = read_and_plan(ports, settings, hear, config_name, document)
            if mode is Mode.APPLY:
                withhold(ports, withheld_keys(plan), plan, inputs.snapshot)
            warning = str(ports.config.error) if ports.config.error else None
            if mode is Mode.PLAN:
                report = Report(
                    inputs,
                    plan,
                    inputs.snapshot,
                    differences(inputs.desired, inputs.snapshot),
                    config_warning=warning,
                )
                return report
            report = _apply(ports, settings, inputs, plan, skip_blocked, gate, hear, warning)
    except VgpuStateError as e:
        node = inputs.node if inputs is not None else ports.cluster.node_name()
        config = inputs.config if inputs is not None else None
        if isinstance(e, NoGpusError):
            config = e.config
        if report_failure is None:
            report_failure = mode is Mode.APPLY
        # A node nothing selects is left alone: an outcome the caller reports, not a failure.
        if report_failure and not isinstance(e, NoConfigSelectedError):
            publish_failure(ports.cluster, failed_status(node, config, e), e)
        raise
    if not report.declined:
        publish(ports, report)
        for event in applied_events(report):
            ports.cluster.emit_event(event)
    elif keys := withheld_keys(report.plan):
        # Waiting for a rollout slot with capacity withheld: the status says so meanwhile.
        ports.withheld.record(
            withheld_vgpus(report.plan, report.inputs.snapshot, keys, declined=True),
            report.plan.snapshot_fingerprint,
        )
        waiting = dataclasses.replace(
            report, differences=differences(report.inputs.desired, report.final)
        )
        ports.cluster.report_status(node_status(waiting))
    return report


def withhold(
    ports: Ports,
    keys: frozenset[str],
    plan: Plan | None = None,
    snapshot: NodeSnapshot | None = None,
) -> None:
    """The device plugin and DRA offer none of ``keys`` from now on (every other vGPU
    again); ``ports.withheld`` records them with why (from ``plan`` and the types in
    ``snapshot``; without a plan, nothing is withheld)."""
    ports.device_plugin.withhold(keys)
    ports.dra.withhold(keys)
    if plan is None or snapshot is None:
        ports.withheld.record((), None)
    else:
        ports.withheld.record(withheld_vgpus(plan, snapshot, keys), plan.snapshot_fingerprint)


def publish(ports: Ports, report: Report, *, enforcing: bool = True) -> None:
    """Tell what the node has now: the device plugin and DRA get the vGPUs of their
    channel, the cluster the node's status (:func:`~vgpu_state.reconcile.status.node_status`).

    ``enforcing``: the report's plan is to be carried out (an apply, not plan-only):
    the vGPUs its pending switches withhold (those still on the host as the plan saw
    them) stay withheld, and the status names the switches. Otherwise nothing is
    withheld.
    """
    ports.device_plugin.refresh(report.advertised)
    ports.dra.refresh(report.channels.dra)
    withheld = still_withheld(report) if enforcing else frozenset()
    withhold(ports, withheld, report.plan, report.final)
    ports.cluster.report_status(node_status(report, enforcing=enforcing))


def publish_failure(cluster: ClusterPort, status: NodeStatus, error: VgpuStateError) -> None:
    """Tell the cluster that a reconcile ended with ``error``: ``status`` (a failed or
    degraded one, :mod:`vgpu_state.reconcile.status`) and a Warning Event naming it."""
    cluster.report_status(status)
    cluster.emit_event(failed_event(error))


def _apply(
    ports: Ports,
    settings: Settings,
    inputs: Inputs,
    plan: Plan,
    skip_blocked: bool,
    gate: Gate | None,
    hear: Reporter,
    warning: str | None,
) -> Report:
    held_back = plan.cluster_blocked
    if held_back and plan.actions:
        # Another manager of this node's vGPUs (KubeVirt's virt-handler) would undo any
        # change and sweep what we create: nothing is applied, whatever is skipped.
        if not skip_blocked:
            raise BlockedError(
                f"{held_back[0].address}: {held_back[0].reason} Nothing was changed."
            )
        log.warning(
            "node %s: nothing applied: %s: %s",
            inputs.node,
            held_back[0].address,
            held_back[0].reason,
        )
        return _verified(ports, inputs, plan, None, warning)
    journal = Journal(settings.journal_path, settings.clock) if settings.journal_path else None
    nothing_to_run = not plan.actions and (skip_blocked or not plan.blocked)
    if nothing_to_run:
        result = None
        if journal is not None and journal.unfinished():
            # Nothing left to run: journal an empty apply so interrupted plans count as finished.
            result = apply(
                plan,
                ports.host,
                journal=journal,
                in_use=inputs.in_use,
                skip_blocked=True,
                snapshot=inputs.snapshot,
                clock=settings.clock,
                desired=inputs.desired,
            )
        return _verified(ports, inputs, plan, result, warning)
    if gate is not None and not gate(plan):
        return Report(inputs, plan, inputs.snapshot, (), declined=True, config_warning=warning)
    _refuse_blocked(plan, skip_blocked)
    result = _run(
        plan,
        ports.host,
        settings,
        journal,
        hear,
        in_use=inputs.in_use,
        skip_blocked=skip_blocked,
        snapshot=inputs.snapshot,
        desired=inputs.desired,
    )
    return _verified(ports, inputs, plan, result, warning)


def _refuse_blocked(plan: Plan, skip_blocked: bool) -> None:
    """Raise :class:`BlockedError` before any change when items are blocked and not skipped."""
    if plan.blocked and not skip_blocked:
        raise BlockedError(
            f"{len(plan.blocked)} item(s) are blocked; nothing was changed. Resolve them "
            "or allow applying the rest"
        )


def _run(
    plan: Plan,
    host: HostPort,
    settings: Settings,
    journal: Journal | None,
    hear: Reporter,
    *,
    in_use: InUse,
    skip_blocked: bool,
    snapshot: NodeSnapshot,
    desired: DesiredState,
) -> ApplyResult:
    """Run ``plan`` through the executor; ``hear`` is told as it starts, at each step and
    at the end."""
    hear.applying(plan)

    def progress(a: Action, r: StepResult) -> None:
        hear.step(a, r)

    result = apply(
        plan,
        host,
        journal=journal,
        in_use=in_use,
        skip_blocked=skip_blocked,
        progress=progress,
        snapshot=snapshot,
        clock=settings.clock,
        replan=deferred_replanner(settings.catalog),
        desired=desired,
    )
    hear.applied(plan, result)
    return result


def _verified(
    ports: Ports, inputs: Inputs, plan: Plan, result: ApplyResult | None, warning: str | None
) -> Report:
    """End with a fresh scan and the comparison ``assert`` makes.

    After an apply that is the apply's own final scan (taken after its last
    step), not a second read of the whole node.
    """
    final = result.snapshot if result is not None else inputs.snapshot
    require_readable(final)
    return Report(
        inputs, plan, final, differences(inputs.desired, final), result, config_warning=warning
    )


def stale_changes(saved: dict[str, Any], live: dict[str, Any]) -> tuple[str, ...]:
    """What moved between two :meth:`~vgpu_state.model.snapshot.NodeSnapshot.stable_view` s."""

    def index(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {g["address"]: g for g in view.get("gpus", [])}

    a, b = index(saved), index(live)
    lines: list[str] = []
    for address in sorted(set(a) | set(b)):
        old, new = a.get(address), b.get(address)
        if old is None or new is None:
            lines.append(f"gpu[{address}] {'appeared' if old is None else 'disappeared'}")
            continue
        if old["sriov_numvfs"] != new["sriov_numvfs"]:
            lines.append(
                f"gpu[{address}] sriov_numvfs {old['sriov_numvfs']} -> {new['sriov_numvfs']}"
            )
        before = {tuple(v) for v in old["vgpus"]}
        after = {tuple(v) for v in new["vgpus"]}
        for v in sorted(after - before):
            lines.append(f"gpu[{address}] + vGPU {v[2] or v[1]} ({v[4]}) appeared")
        for v in sorted(before - after):
            lines.append(f"gpu[{address}] - vGPU {v[2] or v[1]} ({v[4]}) disappeared")
    was, now = saved.get("modes", {}), live.get("modes", {})
    for address in sorted(set(was) | set(now)):
        if was.get(address) != now.get(address):
            lines.append(
                f"gpu[{address}] modes {_modes_text(was.get(address))} -> "
                f"{_modes_text(now.get(address))}"
            )
    return tuple(lines)


def _modes_text(view: list[Any] | None) -> str:
    """A GPU's modes from a stable view: ``MIG on, mixed-size off, GPU instances 1g.24gb×2``."""
    if view is None:
        return "not read"
    mig, het, gis = view
    names = sorted(str(gi[1]) for gi in gis) if isinstance(gis, list) else []
    counted = ", ".join(f"{n}×{names.count(n)}" for n in sorted(set(names)))

    def on(value: object) -> str:
        return "N/A" if value is None else ("on" if value else "off")

    return f"MIG {on(mig)}, mixed-size {on(het)}" + (
        f", GPU instances {counted}" if counted else ""
    )


def apply_saved(
    host: HostPort,
    cluster: ClusterPort,
    settings: Settings,
    saved: SavedPlan,
    *,
    skip_blocked: bool = False,
    reporter: Reporter | None = None,
    processes: ProcessHolders | None = None,
) -> tuple[Plan, ApplyResult | None]:
    """Apply a saved plan, under the host lock, if the host has not moved since it was made.

    Raises :class:`StalePlanError` (naming what moved since the scan the plan
    was made from) before any change when the host's fingerprint differs. The
    plan is then checked against the fresh scan and the live holders (a vGPU
    held since blocks it) by re-planning from its saved desired layout; what
    is applied is that checked plan. Raises :class:`BlockedError` when items
    are blocked and ``skip_blocked`` is false. The result is ``None`` when
    there is nothing to do. ``processes``: the node's processes holding vGPUs.
    """
    hear: Reporter = reporter or QuietReporter()
    with _host_lock(settings, hear):
        live = host.scan()
        require_readable(live)
        if live.fingerprint() != saved.plan.snapshot_fingerprint:
            raise StalePlanError(
                "saved plan is stale: the host changed after the plan was made; "
                "nothing was changed",
                stale_changes(saved.snapshot_view, live.stable_view()),
            )
        held, warnings = holders(processes or NoProcesses(), cluster, live)
        for message in warnings:
            hear.warning(message)
        plan = check_saved_plan(saved, live, held, settings.catalog)
        hear.planned(plan)
        if plan.is_converged:
            return plan, None
        _refuse_blocked(plan, skip_blocked)
        journal = Journal(settings.journal_path, settings.clock) if settings.journal_path else None
        result = _run(
            plan,
            host,
            settings,
            journal,
            hear,
            in_use=InUse({**saved.in_use, **held}),
            skip_blocked=skip_blocked,
            snapshot=live,
            desired=saved.desired,
        )
        return plan, result
