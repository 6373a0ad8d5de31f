"""One resource's ``DevicePlugin`` gRPC server on its own unix socket.

The device list lives here; ``ListAndWatch`` streams the whole list at once and
again after every change. Each server has its own small thread pool: one worker
per open ``ListAndWatch`` stream (a newer stream ends the older ones, so there
is at most one besides a short overlap while the kubelet reconnects) and the
rest for ``GetDevicePluginOptions``, ``GetPreferredAllocation`` and
``Allocate``, which therefore never wait behind a stream.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import grpc

from vgpu_state.deviceplugin import messages as m
from vgpu_state.deviceplugin.allocation import (
    AllocationError,
    UnknownDevicesError,
    allocate,
    preferred,
)
from vgpu_state.deviceplugin.inventory import HEALTHY, UNHEALTHY, ResourceInventory
from vgpu_state.protowire import WireError

log = logging.getLogger("vgpu_state.deviceplugin")

WORKERS = 4
"""Threads per resource server: one open stream, a reconnecting one, two unary calls."""
STREAM_POLL = 0.5
"""Seconds a stream waits for a change before checking that the kubelet is still there."""
SHUTDOWN_FLUSH = 1.0
"""Seconds ``shutdown`` waits for open streams to send the empty list."""


FileIdentity = tuple[int, int, int]


def file_identity(path: str) -> FileIdentity | None:
    """Device, inode and change time: a file recreated under the same name differs."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def device_list(
    inv: ResourceInventory, unhealthy: frozenset[str], withheld: frozenset[str] = frozenset()
) -> bytes:
    """The ``ListAndWatchResponse`` of every device of ``inv`` but the ``withheld`` ones,
    each Healthy or Unhealthy."""
    return m.list_and_watch_response(
        [
            m.Device(d.id, UNHEALTHY if d.id in unhealthy else HEALTHY, d.numa_node)
            for d in inv.devices
            if d.id not in withheld
        ]
    )


class ResourceServer:
    """Serves one resource; ``update``, ``set_unhealthy`` and ``set_withheld`` push a new
    list to open streams.

    A withheld device (its GPU's layout switch is pending) stays in the inventory but
    is left out of the list, and ``Allocate`` refuses it, naming why.
    """

    def __init__(
        self,
        inv: ResourceInventory,
        socket_path: str,
        *,
        iommufd: bool,
        on_stream_end: Callable[[ResourceServer], None],
        withheld: frozenset[str] = frozenset(),
    ) -> None:
        self.resource = inv.resource
        self.socket_path = socket_path
        self.iommufd = iommufd
        self._on_stream_end = on_stream_end
        self._cond = threading.Condition()
        self._inv = inv
        self._unhealthy: frozenset[str] = frozenset()
        self._withheld: frozenset[str] = withheld & inv.by_id.keys()
        self._version = 0
        self._sent: dict[int, int] = {}
        self._stream_seq = 0
        self._newest_stream = 0
        self._closing = False
        self._send_empty = False
        self._server: Any = None
        self.identity: FileIdentity | None = None
        self.streams_opened = 0

    # state ---------------------------------------------------------------------
    @property
    def inventory(self) -> ResourceInventory:
        with self._cond:
            return self._inv

    @property
    def unhealthy(self) -> frozenset[str]:
        with self._cond:
            return self._unhealthy

    @property
    def withheld(self) -> frozenset[str]:
        with self._cond:
            return self._withheld

    @property
    def offered(self) -> int:
        """Healthy devices in the list the kubelet gets (withheld ones are not in it)."""
        with self._cond:
            shown = self._inv.by_id.keys() - self._withheld
            return len(shown - self._unhealthy)

    def update(
        self,
        inv: ResourceInventory,
        unhealthy: frozenset[str] = frozenset(),
        withheld: frozenset[str] | None = None,
    ) -> bool:
        """Replace the device list (``withheld``: ``None`` keeps the current set); push it
        when it changed. True when it changed."""
        with self._cond:
            unhealthy = unhealthy & inv.by_id.keys()
            withheld = (self._withheld if withheld is None else withheld) & inv.by_id.keys()
            if inv == self._inv and unhealthy == self._unhealthy and withheld == self._withheld:
                return False
            self._inv, self._unhealthy, self._withheld = inv, unhealthy, withheld
            self._version += 1
            self._cond.notify_all()
            return True

    def set_unhealthy(self, unhealthy: frozenset[str]) -> bool:
        return self.update(self.inventory, unhealthy)

    def set_withheld(self, withheld: frozenset[str]) -> bool:
        """Leave ``withheld`` out of the list (and refuse them in ``Allocate``)."""
        with self._cond:
            inv, unhealthy = self._inv, self._unhealthy
        return self.update(inv, unhealthy, withheld)

    # lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Remove a stale socket file, serve on a new one, and check that it answers."""
        with self._cond:
            self._closing = self._send_empty = False
        if os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)
        server = grpc.server(
            ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="vgpu-dp"),
            options=[("grpc.so_reuseport", 0)],
        )
        server.add_generic_rpc_handlers((_handlers(_Servicer(self)),))
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server = server
        self.identity = file_identity(self.socket_path)
        # Self-dial: the kubelet calls back as soon as it gets the registration.
        with grpc.insecure_channel(f"unix:{self.socket_path}") as channel:
            channel.unary_unary(m.SERVICE + "GetDevicePluginOptions")(
                b"", timeout=5, wait_for_ready=True
            )

    def stop(self, *, send_empty: bool) -> None:
        """End every stream (after an empty list when ``send_empty``) and stop serving."""
        with self._cond:
            self._closing = True
            self._send_empty = send_empty
            if send_empty:
                self._inv = ResourceInventory(self.resource, ())
                self._unhealthy = frozenset()
                self._withheld = frozenset()
            self._version += 1
            target = self._version
            self._cond.notify_all()
            deadline = time.monotonic() + SHUTDOWN_FLUSH
            while send_empty and any(v < target for v in self._sent.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        server, self._server = self._server, None
        if server is not None:
            # After a clean shutdown the streams have ended; otherwise the kubelet
            # is gone and nothing waits for an answer.
            server.stop(grace=0.2 if send_empty else None).wait()
        try:
            if self.identity is not None and file_identity(self.socket_path) == self.identity:
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    # streams -------------------------------------------------------------------
    def stream(self, context: Any) -> Iterator[bytes]:
        with self._cond:
            self._stream_seq += 1
            me = self._stream_seq
            self._newest_stream = me
            self.streams_opened += 1
            self._cond.notify_all()
        context.add_callback(self._wake)
        ended_by_kubelet = False
        try:
            seen = -1
            while True:
                with self._cond:
                    while (
                        self._version == seen
                        and not self._closing
                        and self._newest_stream == me
                        and context.is_active()
                    ):
                        self._cond.wait(STREAM_POLL)
                    if self._newest_stream != me:
                        return
                    if not context.is_active():
                        ended_by_kubelet = not self._closing
                        return
                    if self._closing and (self._version == seen or not self._send_empty):
                        return
                    seen = self._version
                    message = device_list(self._inv, self._unhealthy, self._withheld)
                    closing = self._closing
                yield message
                with self._cond:
                    self._sent[me] = seen
                    self._cond.notify_all()
                if closing:
                    return
        except GeneratorExit:
            ended_by_kubelet = not self._closing and self._newest_stream == me
            raise
        finally:
            with self._cond:
                self._sent.pop(me, None)
                self._cond.notify_all()
            if ended_by_kubelet:
                log.info("%s: the kubelet closed the ListAndWatch stream", self.resource)
                self._on_stream_end(self)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


def _handlers(servicer: _Servicer) -> Any:
    """The ``v1beta1.DevicePlugin`` service: each request and response is the wire's
    bytes, read and written by :mod:`vgpu_state.deviceplugin.messages`."""
    return grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin",
        {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                servicer.GetDevicePluginOptions
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(servicer.ListAndWatch),
            "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
                servicer.GetPreferredAllocation
            ),
            "Allocate": grpc.unary_unary_rpc_method_handler(servicer.Allocate),
            "PreStartContainer": grpc.unary_unary_rpc_method_handler(servicer.PreStartContainer),
        },
    )


def _refuse(context: Any, error: WireError) -> NoReturn:
    """End the call with INVALID_ARGUMENT, naming what is wrong with the request."""
    log.warning("refused a request the kubelet sent: %s", error)
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
    raise AssertionError("unreachable") from error


class _Servicer:
    def __init__(self, plugin: ResourceServer) -> None:
        self.plugin = plugin

    def GetDevicePluginOptions(self, request: bytes, context: Any) -> bytes:
        try:
            m.empty(request, "Empty")
        except WireError as e:
            _refuse(context, e)
        return m.options(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: bytes, context: Any) -> Iterator[bytes]:
        try:
            m.empty(request, "Empty")
        except WireError as e:
            _refuse(context, e)
        return self.plugin.stream(context)

    def GetPreferredAllocation(self, request: bytes, context: Any) -> bytes:
        try:
            containers = m.preferred_allocation_request(request)
        except WireError as e:
            _refuse(context, e)
        inv = self.plugin.inventory
        withheld = self.plugin.withheld
        return m.preferred_allocation_response(
            [
                preferred(
                    inv,
                    [i for i in r.available if i not in withheld],
                    list(r.must_include),
                    r.size,
                )
                for r in containers
            ]
        )

    def Allocate(self, request: bytes, context: Any) -> bytes:
        try:
            containers = m.allocate_request(request)
        except WireError as e:
            _refuse(context, e)
        inv = self.plugin.inventory
        withheld = self.plugin.withheld
        responses = []
        for ids in containers:
            try:
                got = allocate(inv, list(ids), iommufd=self.plugin.iommufd, withheld=withheld)
            except UnknownDevicesError as e:
                log.warning("Allocate refused: %s", e)
                context.abort(grpc.StatusCode.NOT_FOUND, str(e))
                raise AssertionError("unreachable") from e
            except AllocationError as e:
                log.warning("Allocate refused: %s", e)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
                raise AssertionError("unreachable") from e
            responses.append(
                m.ContainerAllocation(
                    envs=got.envs,
                    devices=tuple(m.DeviceSpec(p, p, "mrw") for p in got.device_nodes),
                )
            )
            log.info("Allocate %s: %s", self.plugin.resource, ", ".join(got.envs.values()))
        return m.allocate_response(responses)

    def PreStartContainer(self, request: bytes, context: Any) -> bytes:
        try:
            m.empty(request, "PreStartContainerRequest")
        except WireError as e:
            _refuse(context, e)
        return b""
