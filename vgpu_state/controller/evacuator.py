"""The leader's evacuation step: read the cluster, decide (:mod:`.evacuation`), write.

Run once per pass by the leader only, after its KubeVirt CR write, and only when the
layouts document has a config with ``in-use: evacuate`` (otherwise it sends no request).
One step takes every node's status as the pass read it (its list, or the watched
cache; each bounded by :func:`~vgpu_state.controller.evacuation.read_node`, the scan
dropped), lists every Node's labels (metadata only: they select each node's config) and
the controller's migrations (by label); it reads the VMI and the VM of each VM that may
move (at most :data:`~vgpu_state.controller.evacuation.MAX_CANDIDATES`) and the
PodDisruptionBudgets of their namespaces. Before it writes, the Lease is renewed (the
caller's ``confirm``): a replica that lost its term writes nothing. Every migration
carries the writer term's token.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from vgpu_state.config.document import ConfigDocument
from vgpu_state.config.selection import select
from vgpu_state.controller import evacuation as ev
from vgpu_state.controller.metrics import ControllerMetrics
from vgpu_state.kube import events, nodestate
from vgpu_state.kube.api import ConflictError, JsonObject, KubeApi, path_of
from vgpu_state.kube.errors import ClusterError, NotFoundError
from vgpu_state.kube.fencing import WRITER_TERM_ANNOTATION
from vgpu_state.kube.fleet import METADATA_ONLY
from vgpu_state.kube.liststream import stream_pages
from vgpu_state.kube.node import labels_of
from vgpu_state.model.errors import SelectionError, TransientError
from vgpu_state.model.policy import InUsePolicy, Policy
from vgpu_state.model.status import EventType

log = logging.getLogger(__name__)

KUBEVIRT = ("kubevirt.io", "v1")
MIGRATIONS = "virtualmachineinstancemigrations"
COMPONENT = "vgpu-state-controller"
MAX_EVENTS = 50
"""Events one step writes at most (the rest on later steps)."""
NODES = path_of("", "v1", "nodes")
T = TypeVar("T")


def top_policy(document: ConfigDocument) -> Policy:
    return document.spec.policy.apply_to(Policy()) if document.spec.policy else Policy()


def evacuating(document: ConfigDocument) -> bool:
    """Whether some config of ``document`` has ``in-use: evacuate``."""
    return any(
        document.policy_for(name).in_use == InUsePolicy.EVACUATE for name in document.config_names
    )


def fingerprint(document: ConfigDocument, config: str) -> str:
    """Of a node's desired layout: its config's name and content."""
    body = document.configs[config].model_dump(mode="json")
    text = json.dumps({"config": config, "body": body}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def migration_name(vmi: str, uid: str, node: str, print_: str, before: int) -> str:
    """The same for every replica deciding the same move (a second create is refused, 409),
    another for the VMI's next move (``before``: its migrations in the cluster)."""
    digest = hashlib.sha256(f"{uid}/{node}/{print_}/{before}".encode()).hexdigest()[:8]
    return f"vgpu-state-{vmi}"[:52].rstrip("-.") + f"-{digest}"


@dataclass
class Evacuator:
    api: KubeApi
    identity: str
    metrics: ControllerMetrics
    label_key: str
    default_config: str | None = None
    _named: set[tuple[str, str]] = field(default_factory=set)
    """(VM, reason) already named in an Event (each once, not every pass)."""
    _finished: set[str] = field(default_factory=set)
    """Migrations (uids) whose end was named."""
    _paused_named: set[tuple[str, str]] = field(default_factory=set)
    _restarting: dict[str, tuple[str, dt.datetime]] = field(default_factory=dict)
    """VM → (node it left, when) of the restarts started and not running again."""
    _migrations: list[ev.Migration] = field(default_factory=list)
    """The controller's migrations as this step listed them."""
    active: bool = False
    """The last step found moves in flight or waiting: the loop passes again soon."""

    def step(
        self,
        document: ConfigDocument,
        now: dt.datetime,
        confirm: Callable[[], None],
        token: str,
        statuses: Mapping[str, ev.NodeStatus] | None = None,
    ) -> ev.Decision | None:
        """One evacuation step (``None``: no config evacuates; nothing was read).
        ``statuses``: every node's, as the pass read them (listed, or the watched cache);
        ``None``: listed here."""
        if not evacuating(document):
            self.active = False
            return None
        nodes = list(statuses.values()) if statuses is not None else self._nodes()
        labels = self._labels()
        configs = self._configs(document, nodes, labels)
        migrations = [
            ev.read_migration(m)
            for m in self.api.list(
                path_of(*KUBEVIRT, MIGRATIONS), label_selector=f"{ev.EVACUATION_LABEL}=true"
            )
        ]
        self._migrations = migrations
        self._forget_restarts(now, configs)
        restarting = {vm: node for vm, (node, _) in self._restarting.items()}
        top = top_policy(document).evacuation
        moving = sum(not m.done for m in migrations) + len(restarting)
        # With the fleet's budget spent nothing can start: no VM is read (a pass every
        # interval while migrations run costs two lists, not a read per waiting VM).
        full = moving >= top.max_in_flight
        wanted = [] if full else ev.candidates(nodes, configs, migrations, restarting)
        vmis: dict[str, ev.Vmi | None] = {}
        vms: dict[str, ev.Vm | None] = {}
        pdbs: dict[str, list[ev.Pdb]] = {}
        for held in wanted:
            namespace, name = held.vm.split("/")
            vmis[held.vm] = self._read(namespace, "virtualmachineinstances", name, ev.read_vmi)
            vms[held.vm] = self._read(namespace, "virtualmachines", name, ev.read_vm)
            if namespace not in pdbs:
                pdbs[namespace] = [
                    ev.read_pdb(p)
                    for p in self.api.list(
                        path_of("policy", "v1", "poddisruptionbudgets", None, namespace)
                    )
                ]
        decision = ev.decide(nodes, configs, top, migrations, vmis, vms, pdbs, now, restarting)
        by_name = {n.name: n for n in nodes}
        if decision.starts or decision.pause:
            confirm()
        self._write(decision, by_name, configs, token, now, evaluated=not full)
        self.active = bool(decision.in_flight or decision.waiting or decision.starts
                           or self._restarting)  # fmt: skip
        m = self.metrics
        m.evacuation_in_flight.set(decision.in_flight + len(decision.starts))
        if not full:
            m.evacuation_impossible.set(len(decision.impossible))
        m.evacuation_paused.set(len(decision.paused) + len(decision.pause))
        return decision

    # reads ---------------------------------------------------------------------------------
    def _nodes(self) -> list[ev.NodeStatus]:
        found: list[ev.NodeStatus] = []
        for page in nodestate.list_pages(self.api, ev.read_node):
            found.extend(page)
        return found

    def _labels(self) -> dict[str, dict[str, str]]:
        labels: dict[str, dict[str, str]] = {}
        for page in stream_pages(
            self.api,
            NODES,
            500,
            lambda n: (str((n.get("metadata") or {}).get("name") or ""), labels_of(n)),
            accept=METADATA_ONLY,
        ):
            labels.update(page)
        return labels

    def _configs(
        self,
        document: ConfigDocument,
        nodes: list[ev.NodeStatus],
        labels: dict[str, dict[str, str]],
    ) -> dict[str, ev.NodeConfig]:
        """Each node's config as its Node's labels select it from ``document`` (a node
        without a Node, or whose label names no config, gets none: nothing moves off it)."""
        configs: dict[str, ev.NodeConfig] = {}
        for node in nodes:
            if node.name not in labels:
                continue
            try:
                choice = select(
                    document, node.name, labels[node.name], self.label_key, self.default_config
                )
            except SelectionError:
                continue
            if choice.config is None:
                continue
            policy = document.policy_for(choice.config)
            configs[node.name] = ev.NodeConfig(
                policy.in_use == InUsePolicy.EVACUATE,
                policy.evacuation,
                fingerprint(document, choice.config),
            )
        return configs

    def _read(
        self, namespace: str, plural: str, name: str, read: Callable[[JsonObject], T]
    ) -> T | None:
        try:
            return read(self.api.get(path_of(*KUBEVIRT, plural, name, namespace)))
        except NotFoundError:
            return None

    def _forget_restarts(self, now: dt.datetime, configs: dict[str, ev.NodeConfig]) -> None:
        """A restart is in flight until its VMI runs again (on any node) or its timeout."""
        for vm, (node, since) in list(self._restarting.items()):
            config = configs.get(node)
            timeout = config.limits.timeout_seconds if config else 600
            namespace, name = vm.split("/")
            vmi = self._read(namespace, "virtualmachineinstances", name, ev.read_vmi)
            running = vmi is not None and vmi.phase == "Running" and not vmi.deleting
            if running or now - since > dt.timedelta(seconds=timeout):
                del self._restarting[vm]

    # writes --------------------------------------------------------------------------------
    def _write(
        self,
        decision: ev.Decision,
        nodes: dict[str, ev.NodeStatus],
        configs: dict[str, ev.NodeConfig],
        token: str,
        now: dt.datetime,
        evaluated: bool = True,
    ) -> None:
        """``evaluated``: this step looked at the VMs (the budget was not spent), so the
        moves it found impossible are all there are."""
        budget = [MAX_EVENTS]
        for node, print_ in sorted(decision.pause.items()):
            self._pause(node, print_)
        for f in decision.finished:
            key = f.migration.uid or f.migration.name
            if key in self._finished:
                continue
            self._finished.add(key)
            mig = f.migration
            config = configs.get(mig.node)
            limit = dt.timedelta(seconds=2 * (config.limits.timeout_seconds if config else 600))
            if mig.created is not None and now - mig.created > limit:
                continue  # named long ago (by this term or an earlier one)
            node_now = nodes.get(mig.node)
            if not f.ok and config and node_now and node_now.paused == config.fingerprint:
                continue  # named when the node was paused for it
            kind = "succeeded" if f.ok else "failed"
            self.metrics.evacuation_moves.labels("migrate", kind).inc()
            if f.ok:
                text = (f"{mig.vm} left node {mig.node} for {mig.target or 'another node'} "
                        f"(migration {mig.name} Succeeded)")  # fmt: skip
                self._events(mig.vm, mig.node, nodes, "EvacuationSucceeded", text,
                              EventType.NORMAL, now, budget)  # fmt: skip
            else:
                text = (f"{mig.vm} did not leave node {mig.node}: {f.reason} (migration "
                        f"{mig.name}); evacuation of node {mig.node} is paused until its "
                        "layout changes")  # fmt: skip
                log.warning("evacuation failed: %s", text)
                self._events(mig.vm, mig.node, nodes, "EvacuationFailed", text,
                             EventType.WARNING, now, budget)  # fmt: skip
        for node in decision.paused:
            config = configs.get(node)
            named = (node, config.fingerprint if config else "")
            if named in self._paused_named:
                continue
            self._paused_named.add(named)
            text = (f"evacuation of node {node} is paused: a move off it failed under its "
                    "current layout; it resumes when the node's layout changes")  # fmt: skip
            self._event_on_node(node, node, nodes, "EvacuationPaused", text,
                                EventType.WARNING, now, budget)  # fmt: skip
        for start in decision.starts:
            self._start(start, configs, token, now, nodes, budget)
        # What is no longer found is forgotten: memory follows the cluster, and a reason
        # that comes back is named again.
        if evaluated:
            self._named &= {(i.vm, i.reason) for i in decision.impossible}
        self._finished &= {f.migration.uid or f.migration.name for f in decision.finished}
        for imp in decision.impossible:
            if (imp.vm, imp.reason) in self._named:
                continue
            self._named.add((imp.vm, imp.reason))
            text = f"{imp.vm} cannot leave node {imp.node}: {imp.reason}"
            log.info("%s", text)
            self._events(imp.vm, imp.node, nodes, "EvacuationImpossible", text,
                         EventType.WARNING, now, budget)  # fmt: skip

    def _start(
        self,
        start: ev.Start,
        configs: dict[str, ev.NodeConfig],
        token: str,
        now: dt.datetime,
        nodes: dict[str, ev.NodeStatus],
        budget: list[int],
    ) -> None:
        held = start.held
        namespace, name = held.vm.split("/")
        if start.kind is ev.Kind.MIGRATE:
            config = configs[held.node]
            body: JsonObject = {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstanceMigration",
                "metadata": {
                    "name": migration_name(
                        name,
                        start.vmi_uid,
                        held.node,
                        config.fingerprint,
                        sum(m.vm == held.vm for m in self._migrations),
                    ),
                    "namespace": namespace,
                    "labels": {ev.EVACUATION_LABEL: "true", ev.NODE_LABEL: held.node},
                    "annotations": {
                        ev.RESOURCE_ANNOTATION: held.resource,
                        ev.LAYOUT_ANNOTATION: config.fingerprint,
                        WRITER_TERM_ANNOTATION: token,
                    },
                },
                "spec": {
                    "vmiName": name,
                    "addedNodeSelector": {ev.HOSTNAME_LABEL: start.target},
                },
            }
            try:
                self.api.create(path_of(*KUBEVIRT, MIGRATIONS, None, namespace), body)
            except ConflictError:
                return  # already there (another term's): it is in flight
            text = (f"{held.vm} leaves node {held.node} for {start.target} (live migration "
                    f"{body['metadata']['name']}, {held.resource} free there): the switch of "
                    f"GPU {held.gpu} waits for it")  # fmt: skip
        else:
            path = path_of(*KUBEVIRT, "virtualmachineinstances", name, namespace)
            options = {"apiVersion": "v1", "kind": "DeleteOptions",
                       "preconditions": {"uid": start.vmi_uid}}  # fmt: skip
            try:
                self.api.request("DELETE", path, options)
            except (NotFoundError, ConflictError):
                return
            self._restarting[held.vm] = (held.node, now)
            text = (f"{held.vm} is restarted off node {held.node} (it cannot live-migrate; "
                    f"{held.resource} is free on {start.target}): the switch of GPU "
                    f"{held.gpu} waits for it")  # fmt: skip
        self.metrics.evacuation_moves.labels(start.kind.value, "started").inc()
        log.info("%s", text)
        self._events(held.vm, held.node, nodes, "EvacuationStarted", text, EventType.NORMAL,
                     now, budget)  # fmt: skip

    def _pause(self, node: str, print_: str) -> None:
        patch = {"metadata": {"annotations": {ev.PAUSE_ANNOTATION: print_}}}
        with contextlib.suppress(NotFoundError):
            self.api.patch(nodestate.object_path(node), patch, "merge")

    def _events(
        self,
        vm: str,
        node: str,
        nodes: dict[str, ev.NodeStatus],
        reason: str,
        text: str,
        kind: EventType,
        now: dt.datetime,
        budget: list[int],
    ) -> None:
        """``text`` on the VMI and on the node's ``VGPUNodeState``."""
        namespace, name = vm.split("/")
        self._event(name, reason, text, kind, now, budget, namespace, {
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "name": name, "namespace": namespace,
        })  # fmt: skip
        self._event_on_node(f"{node}.{namespace}.{name}", node, nodes, reason, text, kind,
                            now, budget)  # fmt: skip

    def _event_on_node(
        self,
        key: str,
        node: str,
        nodes: dict[str, ev.NodeStatus],
        reason: str,
        text: str,
        kind: EventType,
        now: dt.datetime,
        budget: list[int],
    ) -> None:
        involved: JsonObject = {"apiVersion": nodestate.API_VERSION, "kind": nodestate.KIND,
                                "name": node}  # fmt: skip
        uid = nodes[node].uid if node in nodes else ""
        if uid:
            involved["uid"] = uid
        self._event(key, reason, text, kind, now, budget, events.EVENT_NAMESPACE, involved)

    def _event(
        self,
        key: str,
        reason: str,
        text: str,
        kind: EventType,
        now: dt.datetime,
        budget: list[int],
        namespace: str,
        involved: JsonObject,
    ) -> None:
        if budget[0] <= 0:
            return
        budget[0] -= 1
        try:
            events.record(self.api, key, reason, text[:1024], kind, involved=involved,
                          instance=self.identity, component=COMPONENT, now=now,
                          namespace=namespace)  # fmt: skip
        except (ClusterError, TransientError) as e:
            log.warning("Event %s on %s not written: %s", reason, involved.get("name"), e)
