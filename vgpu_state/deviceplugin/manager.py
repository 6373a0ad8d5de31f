"""Run one device plugin server per vGPU resource and keep the kubelet's view current.

:meth:`DevicePluginManager.refresh` takes a fresh :class:`NodeSnapshot` (after
every apply) and, per resource, starts a server and registers it, pushes the
new full list to the open stream, or sends an empty list and stops the server.
A supervisor thread re-registers when the plugin's socket is deleted, when
``kubelet.sock`` is recreated (a kubelet restart) and when the kubelet ends the
``ListAndWatch`` stream; it retries a failed registration with backoff, and
marks a device Unhealthy when it disappears from sysfs between refreshes.

:meth:`DevicePluginManager.withhold` names the vGPUs not to offer while their
GPU's layout switch is pending (``in-use: evacuate``): they leave every list at
once (the kubelet drops them from the Node's allocatable) and ``Allocate``
refuses them; they come back when a later call no longer names them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from vgpu_state.background import BackgroundLoop, Backoff
from vgpu_state.deviceplugin import messages
from vgpu_state.deviceplugin.health import present_in_sysfs
from vgpu_state.deviceplugin.inventory import Device, ResourceInventory, inventory
from vgpu_state.deviceplugin.server import FileIdentity, ResourceServer, file_identity
from vgpu_state.model.errors import UserError
from vgpu_state.model.resources import DEFAULT_DOMAIN
from vgpu_state.model.snapshot import NodeSnapshot
from vgpu_state.wellknown import KUBELET_DEVICE_PLUGIN_DIR, KUBELET_DEVICE_PLUGIN_SOCKET

log = logging.getLogger("vgpu_state.deviceplugin")

DEFAULT_PLUGIN_DIR = KUBELET_DEVICE_PLUGIN_DIR
KUBELET_SOCKET = KUBELET_DEVICE_PLUGIN_SOCKET
SOCKET_PREFIX = "vgpu-state-"
REGISTER_BACKOFF = Backoff(1.0, 10.0, jitter=False)
"""Seconds between failed registrations: 1, 2, 4, 8, then every 10."""
QUICK_BACKOFF = Backoff(0.2, 0.8, jitter=False)
QUICK_RETRIES = 3
"""A new kubelet.sock gets retries after 0.2, 0.4 and 0.8 s before the backoff applies."""
STREAM_END_GRACE = 0.5
"""Seconds to wait after the kubelet ends a stream before re-registering (it may reconnect)."""
_SUN_PATH_MAX = 107


def socket_name(resource: str, plugin_dir: str) -> str:
    """``vgpu-state-<resource, / as _>.sock``; a hash of the resource if the path is too long."""
    name = f"{SOCKET_PREFIX}{resource.replace('/', '_')}.sock"
    if len(os.fsencode(os.path.join(plugin_dir, name))) > _SUN_PATH_MAX:
        name = f"{SOCKET_PREFIX}{hashlib.sha256(resource.encode()).hexdigest()[:16]}.sock"
    return name


@dataclass(frozen=True)
class ResourceStatus:
    resource: str
    socket: str
    registered: bool
    devices: tuple[str, ...]
    unhealthy: tuple[str, ...]
    registrations: int
    withheld: tuple[str, ...] = ()
    """Devices left out of the list while their GPU's layout switch is pending."""


class _Plugin:
    """A resource server plus its registration state (guarded by ``lock``)."""

    def __init__(self, server: ResourceServer) -> None:
        self.server = server
        self.lock = threading.Lock()
        self.registered_to: FileIdentity | None = None
        self.failures = 0
        self.next_attempt = 0.0
        self.failed_for: FileIdentity | None = None
        self.quick_retries = 0
        self.stream_ended_at: float | None = None
        self.streams_at_end = 0
        self.registrations = 0
        self.closed = False


class DevicePluginManager:
    """The device plugins of one node. Public API: :meth:`refresh`, :meth:`stop`.

    ``plugin_dir``: the kubelet's device-plugins directory (it holds
    ``kubelet.sock`` and our sockets). ``iommufd``: whether ``/dev/iommu``
    exists (detected when ``None``). ``present``: the health probe (default:
    sysfs). ``backoff``: seconds between failed registrations.
    """

    def __init__(
        self,
        plugin_dir: str = DEFAULT_PLUGIN_DIR,
        *,
        domain: str = DEFAULT_DOMAIN,
        iommufd: bool | None = None,
        present: Callable[[Device], bool] = present_in_sysfs,
        backoff: Backoff = REGISTER_BACKOFF,
        poll_interval: float = 0.1,
        health_interval: float = 2.0,
        register_timeout: float = 5.0,
    ) -> None:
        self.plugin_dir = os.path.abspath(plugin_dir)
        # The longest socket name is a hashed one: vgpu-state-<16 hex digits>.sock.
        room = _SUN_PATH_MAX - len(SOCKET_PREFIX) - 16 - len(".sock") - 1
        if len(os.fsencode(self.plugin_dir)) > room:
            raise UserError(
                f"device plugin directory {self.plugin_dir}: too long for the unix sockets "
                f"served in it (at most {room} bytes)"
            )
        self.kubelet_socket = os.path.join(self.plugin_dir, KUBELET_SOCKET)
        self.domain = domain
        self.iommufd = os.path.exists("/dev/iommu") if iommufd is None else iommufd
        self.present = present
        self.backoff = backoff
        self.poll_interval = poll_interval
        self.health_interval = health_interval
        self.register_timeout = register_timeout
        self.problems: tuple[str, ...] = ()
        self._lock = threading.RLock()
        self._plugins: dict[str, _Plugin] = {}
        self._withheld: frozenset[str] = frozenset()
        self._supervisor = _Supervisor(self)
        self._next_health = time.monotonic() + health_interval
        self._kubelet_seen: FileIdentity | None = None
        self.on_kubelet_restart: Callable[[], None] | None = None
        """Called (from the supervisor thread) when a new ``kubelet.sock`` appears after
        the first: the kubelet restarted, and the caller may want to re-read the node."""
        self.on_change: Callable[[], None] | None = None
        """Called after the kubelet was sent a new list or a registration succeeded (from
        the caller of :meth:`refresh` or the supervisor thread); see :meth:`advertised`."""

    # public API ----------------------------------------------------------------
    def refresh(self, snapshot: NodeSnapshot) -> None:
        """Advertise exactly the vGPUs of ``snapshot`` (a fresh scan, e.g. after an apply)."""
        inv = inventory(snapshot, self.domain)
        for problem in inv.problems:
            if problem not in self.problems:
                log.warning("%s", problem)
        with self._lock:
            if self._supervisor.stopping.is_set():
                raise RuntimeError("the device plugin manager is stopped")
            self.problems = inv.problems
            gone = [name for name in self._plugins if name not in inv.resources]
            for name in gone:
                self._close(self._plugins.pop(name), "no vGPU of this type is left")
            for name, res in inv.resources.items():
                plugin = self._plugins.get(name)
                if plugin is None:
                    self._plugins[name] = self._open(res)
                elif plugin.server.update(res, withheld=self._withheld):
                    log.info("%s: advertising %d device(s)", name, plugin.server.offered)
            self._supervisor.start()
        self._supervisor.wake()
        self._changed()

    def withhold(self, keys: frozenset[str]) -> None:
        """Offer none of ``keys`` (mdev UUIDs, VF addresses) from now on, and every other
        device again: the set replaces the previous one. The open streams get the new
        lists at once; a key of no advertised device is remembered for the next
        :meth:`refresh`."""
        keys = frozenset(keys)
        changed = False
        with self._lock:
            if keys == self._withheld:
                return
            self._withheld = keys
            for name, plugin in sorted(self._plugins.items()):
                if plugin.closed:
                    continue
                before = plugin.server.withheld
                if plugin.server.set_withheld(keys):
                    changed = True
                    now = plugin.server.withheld
                    if now - before:
                        log.info(
                            "%s: withholding %s while the GPU's layout switch is pending",
                            name,
                            ", ".join(sorted(now - before)),
                        )
                    if before - now:
                        log.info("%s: offering %s again", name, ", ".join(sorted(before - now)))
        if changed:
            self._changed()

    @property
    def withheld(self) -> frozenset[str]:
        """The keys :meth:`withhold` was last given."""
        with self._lock:
            return self._withheld

    def advertised(self) -> dict[str, int]:
        """Healthy devices per resource, as the kubelet was last told them (withheld ones
        are not told)."""
        with self._lock:
            plugins = [p for p in self._plugins.values() if not p.closed]
        return {p.server.resource: p.server.offered for p in plugins}

    def registrations(self) -> dict[str, int]:
        """Successful registrations with the kubelet per resource served now."""
        with self._lock:
            return {p.server.resource: p.registrations for p in self._plugins.values()}

    def reregister(self, resource: str) -> bool:
        """Register ``resource`` with the kubelet again (the kubelet seems to have lost it).

        The supervisor registers it on its next round, through the same path as
        after a kubelet restart (with its backoff if the kubelet refuses).
        ``False`` when the resource is not served.
        """
        with self._lock:
            plugin = self._plugins.get(resource)
        if plugin is None:
            return False
        with plugin.lock:
            if plugin.closed:
                return False
            log.warning("%s: registering with the kubelet again", resource)
            self._unregistered(plugin, time.monotonic())
        self._supervisor.wake()
        return True

    def _changed(self) -> None:
        hook = self.on_change
        if hook is not None:
            try:
                hook()
            except Exception:  # the plugin keeps serving whatever the hook does
                log.exception("the device-plugin change hook failed")

    def stop(self) -> None:
        """Send every resource an empty list, stop the servers and the supervisor."""
        with self._lock:
            self._supervisor.stopping.set()
            plugins = list(self._plugins.values())
            self._plugins.clear()
        self._supervisor.stop(timeout=None)
        for plugin in plugins:
            self._close(plugin, "shutting down")

    def status(self) -> dict[str, ResourceStatus]:
        with self._lock:
            plugins = dict(self._plugins)
        return {
            name: ResourceStatus(
                resource=name,
                socket=p.server.socket_path,
                registered=p.registered_to is not None,
                devices=tuple(d.id for d in p.server.inventory.devices),
                unhealthy=tuple(sorted(p.server.unhealthy)),
                registrations=p.registrations,
                withheld=tuple(sorted(p.server.withheld)),
            )
            for name, p in sorted(plugins.items())
        }

    # servers -------------------------------------------------------------------
    def _open(self, res: ResourceInventory) -> _Plugin:
        os.makedirs(self.plugin_dir, exist_ok=True)
        path = os.path.join(self.plugin_dir, socket_name(res.resource, self.plugin_dir))
        server = ResourceServer(
            res,
            path,
            iommufd=self.iommufd,
            on_stream_end=self._stream_ended,
            withheld=self._withheld,
        )
        server.start()
        log.info("%s: serving %d device(s) on %s", res.resource, server.offered, path)
        return _Plugin(server)

    def _close(self, plugin: _Plugin, why: str) -> None:
        with plugin.lock:
            plugin.closed = True
            plugin.server.stop(send_empty=True)
        log.info("%s: sent an empty list and stopped (%s)", plugin.server.resource, why)

    def _stream_ended(self, server: ResourceServer) -> None:
        with self._lock:
            plugin = self._plugins.get(server.resource)
        if plugin is None or plugin.server is not server:
            return
        plugin.stream_ended_at = time.monotonic()
        plugin.streams_at_end = server.streams_opened
        self._supervisor.wake()

    # supervisor ----------------------------------------------------------------
    def _supervise(self) -> float:
        """One round of the supervisor: every ``poll_interval`` and on every change."""
        with self._lock:
            plugins = list(self._plugins.values())
        kubelet = file_identity(self.kubelet_socket)
        self._notice_kubelet(kubelet)
        for plugin in plugins:
            try:
                self._check(plugin, kubelet)
            except Exception:  # keep supervising the other resources
                log.exception("%s: supervision failed", plugin.server.resource)
        if time.monotonic() >= self._next_health:
            self._next_health = time.monotonic() + self.health_interval
            for plugin in plugins:
                self._check_health(plugin)
        return self.poll_interval

    def _notice_kubelet(self, kubelet: FileIdentity | None) -> None:
        if kubelet is None or kubelet == self._kubelet_seen:
            return
        restarted = self._kubelet_seen is not None
        self._kubelet_seen = kubelet
        hook = self.on_kubelet_restart
        if restarted and hook is not None:
            try:
                hook()
            except Exception:  # the supervisor keeps going whatever the hook does
                log.exception("the kubelet-restart hook failed")

    def _check(self, plugin: _Plugin, kubelet: FileIdentity | None) -> None:
        with plugin.lock:
            if plugin.closed:
                return
            server = plugin.server
            now = time.monotonic()
            if file_identity(server.socket_path) != server.identity:
                log.info(
                    "%s: socket %s was removed; serving anew", server.resource, server.socket_path
                )
                server.stop(send_empty=False)
                server.start()
                self._unregistered(plugin, now)
            if plugin.registered_to is not None and kubelet != plugin.registered_to:
                log.info("%s: kubelet.sock was recreated (kubelet restart)", server.resource)
                self._unregistered(plugin, now)
            if (
                plugin.stream_ended_at is not None
                and now - plugin.stream_ended_at >= STREAM_END_GRACE
            ):
                if server.streams_opened == plugin.streams_at_end:
                    self._unregistered(plugin, now)
                plugin.stream_ended_at = None
            if (
                plugin.registered_to is None
                and kubelet is not None
                and (now >= plugin.next_attempt or kubelet != plugin.failed_for)
            ):
                self._register(plugin, kubelet)

    def _unregistered(self, plugin: _Plugin, now: float) -> None:
        plugin.registered_to = None
        plugin.failures = 0
        plugin.failed_for = None
        plugin.next_attempt = now

    def _register(self, plugin: _Plugin, kubelet: FileIdentity) -> None:
        server = plugin.server
        endpoint = os.path.basename(server.socket_path)
        request = messages.register_request(
            endpoint,
            server.resource,
            messages.options(pre_start_required=False, get_preferred_allocation_available=True),
        )
        try:
            with grpc.insecure_channel(f"unix:{self.kubelet_socket}") as channel:
                channel.unary_unary(messages.REGISTER)(request, timeout=self.register_timeout)
        except grpc.RpcError as e:
            if kubelet != plugin.failed_for:
                plugin.quick_retries = 0
            if plugin.quick_retries < QUICK_RETRIES:
                # A kubelet.sock that just appeared may not accept connections yet.
                plugin.quick_retries += 1
                delay = QUICK_BACKOFF.delay(plugin.quick_retries)
            else:
                plugin.failures += 1
                delay = self.backoff.delay(plugin.failures)
            plugin.failed_for = kubelet
            plugin.next_attempt = time.monotonic() + delay
            log.warning(
                "%s: registration with the kubelet failed (%s: %s); retrying in %.1f s",
                server.resource,
                e.code().name if hasattr(e, "code") else "error",
                e.details() if hasattr(e, "details") else e,
                delay,
            )
            return
        plugin.registered_to = kubelet
        plugin.failures = 0
        plugin.registrations += 1
        log.info("%s: registered with the kubelet as %s", server.resource, endpoint)
        self._changed()

    def _check_health(self, plugin: _Plugin) -> None:
        with plugin.lock:
            if plugin.closed:
                return
            server = plugin.server
            gone = frozenset(d.id for d in server.inventory.devices if not self.present(d))
            before = server.unhealthy
            changed = server.set_unhealthy(gone)
            if changed:
                for d in sorted(gone - before):
                    log.warning("%s: %s vanished from sysfs; marked Unhealthy", server.resource, d)
                for d in sorted(before - gone):
                    log.info("%s: %s is back; marked Healthy", server.resource, d)
        if changed:
            self._changed()


if TYPE_CHECKING:
    from vgpu_state.ports.deviceplugin import DevicePluginSink

    # The reconcile service feeds the manager through this port.
    _conforms: DevicePluginSink = DevicePluginManager()


class _Supervisor(BackgroundLoop):
    """The manager's thread: registers, re-serves and health-checks its plugins."""

    def __init__(self, manager: DevicePluginManager) -> None:
        super().__init__("vgpu-deviceplugin", first=manager.poll_interval)
        self._manager = manager

    def step(self) -> float:
        return self._manager._supervise()
