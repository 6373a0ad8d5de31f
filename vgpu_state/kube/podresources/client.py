"""Which vGPUs pods hold, from the kubelet's pod-resources API (``v1.PodResourcesLister``).

``List`` returns, per running pod and container, the device IDs the kubelet
allocated to it for each extended resource. vgpu-state's device plugin
advertises the mdev UUID or the VF address as the device ID, so the IDs of
our resources are directly the keys of the plan's in-use map. A KubeVirt VM
runs in pod ``virt-launcher-<vm>-<suffix>``; its holder names the VM too.

``grpc`` is imported on first use; the answer is read by
:mod:`vgpu_state.kube.podresources.messages` (no protobuf runtime).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass

from vgpu_state.kube.errors import PodResourcesUnavailableError
from vgpu_state.model.resources import DEFAULT_DOMAIN
from vgpu_state.wellknown import KUBELET_POD_RESOURCES_SOCKET

DEFAULT_SOCKET = KUBELET_POD_RESOURCES_SOCKET
_LAUNCHER = re.compile(r"^virt-launcher-(?P<vm>.+)-[a-z0-9]{5}$")


@dataclass(frozen=True, order=True)
class PodHolder:
    """A pod (and the KubeVirt VM it runs, if any) holding a device."""

    namespace: str
    pod: str
    container: str = ""
    resource: str = ""

    @property
    def vm(self) -> str | None:
        m = _LAUNCHER.match(self.pod)
        return m.group("vm") if m else None

    def __str__(self) -> str:
        text = f"pod {self.namespace}/{self.pod}"
        vm = self.vm
        return f"{text} (VM {self.namespace}/{vm})" if vm else text


def ours(domain: str = DEFAULT_DOMAIN) -> Callable[[str], bool]:
    """Resource names in ``domain`` (``nvidia.com/...``)."""
    prefix = f"{domain}/"
    return lambda name: name.startswith(prefix)


def list_holders(
    socket: str = DEFAULT_SOCKET,
    resources: Callable[[str], bool] | None = None,
    timeout: float = 5.0,
) -> dict[str, PodHolder]:
    """Device ID (mdev UUID or VF address, lower case) -> the pod holding it.

    Raises :class:`PodResourcesUnavailableError` when the socket is missing or
    the kubelet does not answer: then nothing is known about what is free.
    """
    try:
        mode = os.stat(socket).st_mode
    except FileNotFoundError as e:
        raise PodResourcesUnavailableError(socket, "no such socket") from e
    except OSError as e:
        raise PodResourcesUnavailableError(socket, e.strerror or str(e)) from e
    if not stat.S_ISSOCK(mode):
        raise PodResourcesUnavailableError(socket, "not a unix socket")

    import grpc

    from vgpu_state.kube.podresources import messages
    from vgpu_state.protowire import WireError

    keep = resources or ours()
    with grpc.insecure_channel(f"unix://{os.path.abspath(socket)}") as channel:
        try:
            answer = channel.unary_unary(messages.LIST)(b"", timeout=timeout)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = e.details() if hasattr(e, "details") else str(e)
            name = code.name if code is not None else "error"
            raise PodResourcesUnavailableError(socket, f"List failed: {name}: {details}") from e
    try:
        pods = messages.list_response(answer)
    except WireError as e:
        raise PodResourcesUnavailableError(socket, f"List's answer is unreadable: {e}") from e
    held: dict[str, PodHolder] = {}
    for pod in pods:
        for container in pod.containers:
            for devices in container.devices:
                if not keep(devices.resource_name):
                    continue
                for device in devices.device_ids:
                    held[device.lower()] = PodHolder(
                        pod.namespace, pod.name, container.name, devices.resource_name
                    )
    return held
