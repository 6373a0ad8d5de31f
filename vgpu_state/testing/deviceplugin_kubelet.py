"""A stand-in for the kubelet's device manager, on a real unix socket.

It serves ``Registration`` on ``<dir>/kubelet.sock`` and does what the kubelet
does with a registration: checks the version and the resource name, dials the
plugin's socket back, calls ``GetDevicePluginOptions`` before answering, then
opens ``ListAndWatch`` in the background and keeps the latest full list per
resource. :meth:`DevicePluginKubelet.restart` behaves like a kubelet restart: every
socket in the directory is removed and ``kubelet.sock`` is created anew;
:meth:`DevicePluginKubelet.forget` loses one resource's registration without telling
the plugin, as a confused kubelet can.

Used by the tests and benchmarks, and by ``vgpu-state deviceplugin
--fake-kubelet`` to try the plugin on a machine without a kubelet.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from vgpu_state.deviceplugin.v1beta1 import api_pb2 as pb
from vgpu_state.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from vgpu_state.model.resources import resource_name_problem
from vgpu_state.testing.grpc_unix import unix_server
from vgpu_state.wellknown import KUBELET_DEVICE_PLUGIN_SOCKET


@dataclass(frozen=True)
class SeenDevice:
    id: str
    health: str
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True)
class Registration:
    resource: str
    endpoint: str
    at: float
    options: pb.DevicePluginOptions


class _Endpoint:
    def __init__(self, resource: str, socket_path: str) -> None:
        self.resource = resource
        self.channel = grpc.insecure_channel(f"unix:{socket_path}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.stream: Any = None
        self.thread: threading.Thread | None = None

    def close(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
        self.channel.close()


class DevicePluginKubelet:
    """A fake kubelet serving ``Registration`` in ``plugin_dir``; :meth:`start` it first."""

    def __init__(
        self,
        plugin_dir: str,
        *,
        on_list: Callable[[str, tuple[SeenDevice, ...]], None] | None = None,
    ) -> None:
        self.plugin_dir = os.path.abspath(plugin_dir)
        self.socket_path = os.path.join(self.plugin_dir, KUBELET_DEVICE_PLUGIN_SOCKET)
        self.on_list = on_list
        self.registrations: list[Registration] = []
        self.reject_registrations = 0
        """Refuse this many registrations (UNAVAILABLE) before accepting again."""
        self._cond = threading.Condition()
        self._latest: dict[str, tuple[SeenDevice, ...]] = {}
        self._updates: dict[str, int] = {}
        self._streaming: dict[str, bool] = {}
        self._endpoints: dict[str, _Endpoint] = {}
        self._forgotten: list[_Endpoint] = []
        self._server: Any = None

    # lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        if os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)
        self._server = unix_server(
            self.socket_path,
            lambda server: pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server),
            name="fake-kubelet",
        )

    def stop(self) -> None:
        """Stop serving and drop every plugin connection (streams end)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None)
        with self._cond:
            endpoints = list(self._endpoints.values()) + self._forgotten
            self._endpoints.clear()
            self._forgotten = []
        for ep in endpoints:
            ep.close()
        for ep in endpoints:
            if ep.thread is not None and ep.thread.ident is not None:
                ep.thread.join(timeout=5)
        if os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)

    def restart(self) -> None:
        """Like a kubelet restart: stop, remove every socket in the directory, serve anew."""
        self.stop()
        with self._cond:
            self._latest.clear()
            self._streaming.clear()
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        self.start()

    def drop_stream(self, resource: str) -> None:
        """Cancel the ``ListAndWatch`` stream of ``resource`` and forget its endpoint."""
        with self._cond:
            ep = self._endpoints.pop(resource, None)
        if ep is not None:
            ep.close()
            if ep.thread is not None and ep.thread.ident is not None:
                ep.thread.join(timeout=5)

    def forget(self, resource: str) -> None:
        """Lose ``resource``'s registration silently: its endpoint and devices are dropped
        from the kubelet's table, but the plugin is not told (its ``ListAndWatch`` stream
        stays open and what it sends is ignored). Only a new registration brings the
        resource back."""
        with self._cond:
            ep = self._endpoints.pop(resource, None)
            self._latest.pop(resource, None)
            if ep is not None:
                self._forgotten.append(ep)
            self._cond.notify_all()

    def __enter__(self) -> DevicePluginKubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # what the kubelet saw ------------------------------------------------------
    def devices(self, resource: str) -> tuple[SeenDevice, ...] | None:
        """The latest list for ``resource`` (``None`` before its first list)."""
        with self._cond:
            return self._latest.get(resource)

    def resources(self) -> dict[str, tuple[SeenDevice, ...]]:
        with self._cond:
            return dict(self._latest)

    def streaming(self, resource: str) -> bool:
        with self._cond:
            return self._streaming.get(resource, False)

    def updates(self, resource: str) -> int:
        with self._cond:
            return self._updates.get(resource, 0)

    def wait_for(
        self,
        resource: str,
        predicate: Callable[[tuple[SeenDevice, ...]], bool],
        timeout: float = 5.0,
    ) -> tuple[SeenDevice, ...]:
        """Block until the latest list of ``resource`` satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                seen = self._latest.get(resource)
                if seen is not None and predicate(seen):
                    return seen
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{resource}: last list seen {seen}")
                self._cond.wait(left)

    def wait_registered(self, resource: str, count: int = 1, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(r.resource == resource for r in self.registrations) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{resource} registered fewer than {count} time(s)")
                self._cond.wait(left)

    # calls the kubelet makes ---------------------------------------------------
    def _stub(self, resource: str) -> Any:
        with self._cond:
            ep = self._endpoints.get(resource)
        if ep is None:
            raise LookupError(f"{resource} is not registered")
        return ep.stub

    def allocate(self, resource: str, *containers: Sequence[str]) -> pb.AllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[
                pb.ContainerAllocateRequest(devices_ids=list(c)) for c in containers
            ]
        )
        response: pb.AllocateResponse = self._stub(resource).Allocate(request, timeout=5)
        return response

    def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = self._stub(resource).GetPreferredAllocation(request, timeout=5)
        return list(response.container_responses[0].deviceIDs)

    # registration --------------------------------------------------------------
    def _register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        if request.version != "v1beta1":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}"
            )
        problem = resource_name_problem(request.resource_name)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{request.resource_name}: {problem}")
        with self._cond:
            if self.reject_registrations > 0:
                self.reject_registrations -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "the fake kubelet refuses for now")
        ep = _Endpoint(request.resource_name, os.path.join(self.plugin_dir, request.endpoint))
        try:
            options = ep.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        except grpc.RpcError as e:
            ep.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot dial {request.endpoint}: {e}")
        with self._cond:
            old = self._endpoints.get(request.resource_name)
            self._endpoints[request.resource_name] = ep
            self.registrations.append(
                Registration(request.resource_name, request.endpoint, time.monotonic(), options)
            )
            self._cond.notify_all()
        if old is not None:
            old.close()
        ep.thread = threading.Thread(
            target=self._watch, args=(ep,), name=f"fake-kubelet-{ep.resource}", daemon=True
        )
        ep.thread.start()
        return pb.Empty()

    def _watch(self, ep: _Endpoint) -> None:
        try:
            ep.stream = ep.stub.ListAndWatch(pb.Empty())
            with self._cond:
                current = self._endpoints.get(ep.resource) is ep
                if current:
                    self._streaming[ep.resource] = True
            for message in ep.stream:
                seen = tuple(
                    SeenDevice(
                        d.ID,
                        d.health,
                        tuple(n.ID for n in d.topology.nodes) if d.HasField("topology") else (),
                    )
                    for d in message.devices
                )
                with self._cond:
                    if self._endpoints.get(ep.resource) is not ep:
                        continue
                    self._latest[ep.resource] = seen
                    self._updates[ep.resource] = self._updates.get(ep.resource, 0) + 1
                    self._cond.notify_all()
                if self.on_list is not None:
                    self.on_list(ep.resource, seen)
        except (grpc.RpcError, ValueError):  # ValueError: the channel was closed first
            pass
        finally:
            with self._cond:
                if self._endpoints.get(ep.resource) is ep or ep.resource not in self._endpoints:
                    self._streaming[ep.resource] = False
                self._cond.notify_all()


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: DevicePluginKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        return self.kubelet._register(request, context)
