"""The agent's Dynamic Resource Allocation side: one object that owns every DRA part.

:class:`DraNode` is fed the DRA channel of each reconcile (``Ports.dra``, a
``DevicePluginSink``): it rebuilds the node's pool, publishes the
ResourceSlices and hands the same devices to the kubelet plugin, which
prepares only what is published. vGPUs withheld while their GPU's layout
switch is pending (:meth:`DraNode.withhold`) are left out of the slices (so
no claim is allocated them) until they are no longer withheld. A kubelet
(re-)registration triggers an immediate resync, so slices the kubelet wiped
at its start come back at once; a periodic resync catches the rest.
:class:`ClaimsHoldVgpus` wraps the cluster port so that vGPUs allocated to
ResourceClaims count as held.

Stopping leaves the slices in place, as the kubelet's contract for DRA drivers
expects: a restart or a rollout of the agent is a short absence, and the
kubelet itself deletes a driver's slices when the driver stays away (30 s after
its plugin's registration goes). Deleting them is for an uninstall only
(``vgpu-state dra-remove-slices``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from vgpu_state.agent.triggers import Service, Stop
from vgpu_state.catalog import Catalog
from vgpu_state.dra.plugin import DraPlugin
from vgpu_state.dra.prepare import DraPaths, Preparer
from vgpu_state.dra.slices import DRIVER, DraDevice, PoolSpec, build_pool
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.dra import (
    KubeClaims,
    SlicePublisher,
    SliceResync,
    claims_in_use,
)
from vgpu_state.kube.errors import ClusterError
from vgpu_state.model.errors import TransientError
from vgpu_state.model.inuse import InUse
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.model.status import NodeEvent, NodeStatus
from vgpu_state.ports import ClusterPort

log = logging.getLogger(__name__)


class DraNode:
    """Publishes the node's DRA vGPUs and serves the kubelet plugin until :meth:`stop`."""

    def __init__(
        self,
        api: KubeApi,
        node: str,
        paths: DraPaths,
        *,
        catalog: Catalog,
        driver: str = DRIVER,
        resync_seconds: float = 10.0,
        version: str | None = None,
    ) -> None:
        self.node = node
        self.catalog = catalog
        self.driver = driver
        self.publisher = SlicePublisher(api, node, driver=driver, version=version)
        self.claims = KubeClaims(api, version=self.publisher.version)
        self._pool: PoolSpec | None = None
        self._snapshot: NodeSnapshot | None = None
        self._withheld: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self.preparer = Preparer(
            node=node, claims=self.claims, inventory=self.devices, paths=paths, driver=driver
        )
        self.plugin = DraPlugin(self.preparer, paths, driver)
        self.resync = SliceResync(self.publisher, interval=resync_seconds)
        self.plugin.on_registered = self.resync.wake

    def devices(self) -> Mapping[str, DraDevice]:
        with self._lock:
            return self._pool.devices if self._pool is not None else {}

    def refresh(self, snapshot: NodeSnapshot) -> None:
        """The DRA side of a fresh scan: rebuild the pool and publish it."""
        with self._lock:
            self._snapshot = snapshot
            withheld = self._withheld
        self._publish(snapshot, withheld)

    def withhold(self, keys: frozenset[str]) -> None:
        """Publish none of ``keys`` (their GPU's layout switch is pending), and every other
        vGPU of the last scan; the set replaces the previous one."""
        keys = frozenset(keys)
        with self._lock:
            if keys == self._withheld:
                return
            self._withheld = keys
            snapshot = self._snapshot
        if snapshot is not None:
            self._publish(snapshot, keys)

    def _publish(self, snapshot: NodeSnapshot, withheld: frozenset[str]) -> None:
        pool = build_pool(
            snapshot,
            node=self.node,
            driver=self.driver,
            catalog=self.catalog,
            selected=lambda g, v: v.key not in withheld,
        )
        for problem in pool.problems:
            log.warning("%s", problem)
        with self._lock:
            self._pool = pool
        try:
            self.publisher.publish(pool)
        except (ClusterError, TransientError) as e:  # the resync publishes this pool later
            log.warning("ResourceSlices not published yet: %s", e)

    def holders(self) -> dict[str, str]:
        """vGPUs allocated to claims in this node's pool: key -> claim and pods."""
        return claims_in_use(self.claims, self.node, self.driver)

    def start(self) -> DraNode:
        self.plugin.start()
        self.resync.start()
        return self

    def service(self) -> Service:
        """A service of the agent (it asks for no reconcile): start serving, and stop
        (keeping slices) at exit."""

        def start() -> Stop:
            self.start()
            return self.stop

        return start

    def stop(self, remove_slices: bool = False) -> None:
        """Stop serving; the slices stay unless ``remove_slices`` (an uninstall)."""
        self.resync.stop()
        self.plugin.stop()
        if remove_slices:
            self.publisher.remove_all()


class ClaimsHoldVgpus:
    """A :class:`ClusterPort` whose ``in_use()`` adds the vGPUs held by ResourceClaims."""

    def __init__(self, cluster: ClusterPort, dra: DraNode) -> None:
        self._cluster = cluster
        self._dra = dra

    def node_name(self) -> str:
        return self._cluster.node_name()

    def labels(self) -> Mapping[str, str]:
        return self._cluster.labels()

    def in_use(self) -> InUse:
        held = dict(self._cluster.in_use())
        try:
            claimed = self._dra.holders()
        except Exception:
            self._reported(None)  # holders unknown: the status must not say "none held"
            raise
        for key, holder in claimed.items():
            held.setdefault(key, holder)
        merged = InUse(held)
        self._reported(merged)
        return merged

    def _reported(self, held: InUse | None) -> None:
        """The holders the status reports are the ones the plan used, claims included."""
        if hasattr(self._cluster, "last_in_use"):
            self._cluster.last_in_use = held

    def report_status(self, status: NodeStatus) -> None:
        self._cluster.report_status(status)

    def emit_event(self, event: NodeEvent) -> None:
        self._cluster.emit_event(event)
