"""The kubelet DRA plugin: registration socket and DRA service (v1 and v1beta1) over gRPC.

The kubelet finds ``<driver>-reg.sock`` in its ``plugins_registry`` directory
(at start it walks the directory, so a socket left there registers again),
calls ``GetInfo`` and connects to the endpoint it names,
``<plugins dir>/<driver>/dra.sock``, which serves
``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` and its ``v1beta1`` twin; the
kubelet uses the first of ``v1.DRAPlugin``, ``v1beta1.DRAPlugin`` it knows.
This is the only module of the DRA package that imports gRPC.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from vgpu_state.dra.pluginregistration import api_pb2 as reg_pb2
from vgpu_state.dra.pluginregistration import api_pb2_grpc as reg_grpc
from vgpu_state.dra.prepare import ClaimRef, DraPaths, Preparer
from vgpu_state.dra.slices import DRIVER
from vgpu_state.dra.v1 import api_pb2 as v1_pb2
from vgpu_state.dra.v1 import api_pb2_grpc as v1_grpc
from vgpu_state.dra.v1beta1 import api_pb2 as v1beta1_pb2
from vgpu_state.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.plugin.driver,
            endpoint=str(self.plugin.paths.socket),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.plugin.registration_status(bool(request.plugin_registered), str(request.error))
        return reg_pb2.RegistrationStatusResponse()


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


class _Service:
    """One DRAPlugin servicer body for both API versions (same messages, other package)."""

    def __init__(self, preparer: Preparer, pb2: Any) -> None:
        self.preparer = preparer
        self.pb2 = pb2

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        results = self.preparer.prepare(_refs(request))
        response = self.pb2.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
                log.warning("prepare claim %s failed: %s", uid, result.error)
                continue
            for d in result.devices:
                entry.devices.add(
                    request_names=[d.top_request],
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids),
                )
            log.info("prepared claim %s: %s", uid, ", ".join(d.device for d in result.devices))
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        errors = self.preparer.unprepare(_refs(request))
        response = self.pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
            if error:
                log.warning("unprepare claim %s failed: %s", uid, error)
            else:
                log.info("unprepared claim %s", uid)
        return response


class _V1(_Service, v1_grpc.DRAPluginServicer):
    pass


class _V1beta1(_Service, v1beta1_grpc.DRAPluginServicer):
    pass


class DraPlugin:
    """Serves registration and the DRA service on their unix sockets until :meth:`stop`."""

    def __init__(self, preparer: Preparer, paths: DraPaths, driver: str = DRIVER) -> None:
        self.preparer = preparer
        self.paths = paths
        self.driver = driver
        self.registered = threading.Event()
        self.on_registered: Callable[[], None] | None = None
        """Called each time the kubelet registers the plugin (e.g. to republish slices)."""
        self._servers: list[Any] = []

    @property
    def registration_socket(self) -> Path:
        return self.paths.registry_dir / f"{self.driver}-reg.sock"

    def registration_status(self, registered: bool, error: str) -> None:
        if registered:
            log.info("kubelet registered DRA driver %s", self.driver)
            self.registered.set()
            if self.on_registered is not None:
                self.on_registered()
        else:
            log.error("kubelet refused DRA driver %s: %s", self.driver, error)
            self.registered.clear()

    def _serve(self, socket: Path, add: Any) -> None:
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add(server)
        if not server.add_insecure_port(f"unix://{socket}"):
            raise OSError(f"cannot listen on {socket}")
        server.start()
        self._servers.append(server)

    def start(self) -> None:
        """Serve the DRA service first, then offer the registration socket to the kubelet."""
        prep = self.preparer
        self._serve(
            self.paths.socket,
            lambda s: (
                v1_grpc.add_DRAPluginServicer_to_server(_V1(prep, v1_pb2), s),
                v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1(prep, v1beta1_pb2), s),
            ),
        )
        self._serve(
            self.registration_socket,
            lambda s: reg_grpc.add_RegistrationServicer_to_server(_Registration(self), s),
        )
        log.info("DRA plugin %s serving %s", self.driver, self.paths.socket)

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving and remove the sockets (the kubelet then drops the plugin)."""
        for server in reversed(self._servers):
            server.stop(grace).wait()
        self._servers.clear()
        for socket in (self.registration_socket, self.paths.socket):
            with contextlib.suppress(OSError):
                socket.unlink()
        self.registered.clear()
