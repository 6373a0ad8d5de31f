"""A stand-in for the kubelet's DRA manager, speaking the real gRPC protocol.

It does what the kubelet does with a DRA driver: finds ``*.sock`` in the
plugins_registry directory, calls ``GetInfo``, checks the plugin type, picks
the first version of the plugin's list it supports, reports the outcome with
``NotifyRegistrationStatus`` and then calls ``NodePrepareResources`` /
``NodeUnprepareResources`` on the endpoint. Used by tests and benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from vgpu_state.dra.pluginregistration import api_pb2 as reg_pb2
from vgpu_state.dra.pluginregistration import api_pb2_grpc as reg_grpc
from vgpu_state.dra.v1 import api_pb2 as v1_pb2
from vgpu_state.dra.v1 import api_pb2_grpc as v1_grpc
from vgpu_state.dra.v1beta1 import api_pb2 as v1beta1_pb2
from vgpu_state.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

_VERSIONS: dict[str, tuple[Any, Any]] = {
    "v1.DRAPlugin": (v1_pb2, v1_grpc),
    "v1beta1.DRAPlugin": (v1beta1_pb2, v1beta1_grpc),
}


@dataclass
class Registered:
    name: str
    endpoint: str
    version: str
    channel: Any
    stub: Any
    pb2: Any


class DraKubelet:
    """Registers DRA plugins found in ``registry_dir`` and calls them."""

    def __init__(self, registry_dir: Path, versions: tuple[str, ...] = tuple(_VERSIONS)) -> None:
        self.registry_dir = registry_dir
        self.versions = versions
        self.plugins: dict[str, Registered] = {}
        self._channels: list[Any] = []

    def register_all(self, timeout: float = 5.0) -> list[str]:
        """Register every plugin socket in the registry directory; their driver names."""
        names = []
        for sock in sorted(self.registry_dir.glob("*.sock")):
            names.append(self.register(sock, timeout))
        return names

    def register(self, socket: Path, timeout: float = 5.0) -> str:
        channel = grpc.insecure_channel(f"unix://{socket}")
        self._channels.append(channel)
        reg = reg_grpc.RegistrationStub(channel)
        info = reg.GetInfo(reg_pb2.InfoRequest(), timeout=timeout)
        chosen = next((v for v in info.supported_versions if v in self.versions), None)
        error = ""
        if info.type != "DRAPlugin":
            error = f"plugin type {info.type!r} is not DRAPlugin"
        elif chosen is None:
            error = f"none of {list(info.supported_versions)} is supported"
        reg.NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=not error, error=error), timeout=timeout
        )
        if error:
            raise RuntimeError(f"{socket}: {error}")
        assert chosen is not None
        pb2, grpc_mod = _VERSIONS[chosen]
        dra = grpc.insecure_channel(f"unix://{info.endpoint}")
        self._channels.append(dra)
        self.plugins[info.name] = Registered(
            info.name, info.endpoint, chosen, dra, grpc_mod.DRAPluginStub(dra), pb2
        )
        return str(info.name)

    def prepare(
        self, driver: str, claims: list[tuple[str, str, str]], timeout: float = 45.0
    ) -> Any:
        """``NodePrepareResources`` for (namespace, name, uid) triples; the response."""
        return self._call(driver, "NodePrepareResources", claims, timeout)

    def unprepare(
        self, driver: str, claims: list[tuple[str, str, str]], timeout: float = 45.0
    ) -> Any:
        """``NodeUnprepareResources`` for (namespace, name, uid) triples; the response."""
        return self._call(driver, "NodeUnprepareResources", claims, timeout)

    def _call(
        self, driver: str, method: str, claims: list[tuple[str, str, str]], timeout: float
    ) -> Any:
        p = self.plugins[driver]
        request = getattr(p.pb2, f"{method}Request")(
            claims=[p.pb2.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]
        )
        return getattr(p.stub, method)(request, timeout=timeout)

    def close(self) -> None:
        for c in self._channels:
            c.close()
        self._channels.clear()
        self.plugins.clear()
