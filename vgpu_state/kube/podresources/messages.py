"""The pod-resources API's ``List`` answer (``v1``, api.proto), read by
:mod:`vgpu_state.protowire`: per pod and container, the devices the kubelet
allocated, by resource. The rest of the answer (CPUs, memory, dynamic resources)
is skipped unread.

The field numbers are api.proto's; tests/test_protowire.py
writes the answers with the generated classes and reads them here.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu_state import protowire as w

LIST = "/v1.PodResourcesLister/List"


@dataclass(frozen=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]


@dataclass(frozen=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


def list_response(data: bytes) -> list[PodResources]:
    """``ListPodResourcesResponse``'s ``pod_resources``."""
    top = w.Reader(data, "ListPodResourcesResponse")
    pods = []
    for number, wire_type, value in top:
        if number == 1:
            index = top.count(1, "pod_resources")
            pods.append(_pod(top.message(number, "pod_resources", wire_type, value, index)))
    return pods


def _pod(r: w.Reader) -> PodResources:
    name = namespace = ""
    containers = []
    for n, t, v in r:
        if n == 1:
            name = r.string(n, "name", t, v)
        elif n == 2:
            namespace = r.string(n, "namespace", t, v)
        elif n == 3:
            index = r.count(3, "containers")
            containers.append(_container(r.message(n, "containers", t, v, index)))
    return PodResources(name, namespace, tuple(containers))


def _container(r: w.Reader) -> ContainerResources:
    name = ""
    devices = []
    for n, t, v in r:
        if n == 1:
            name = r.string(n, "name", t, v)
        elif n == 2:
            index = r.count(2, "devices")
            devices.append(_devices(r.message(n, "devices", t, v, index)))
    return ContainerResources(name, tuple(devices))


def _devices(r: w.Reader) -> ContainerDevices:
    resource = ""
    ids = []
    for n, t, v in r:
        if n == 1:
            resource = r.string(n, "resource_name", t, v)
        elif n == 2:
            r.count(2, "device_ids")
            ids.append(r.string(n, "device_ids", t, v))
    return ContainerDevices(resource, tuple(ids))
