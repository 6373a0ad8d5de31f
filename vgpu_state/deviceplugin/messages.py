"""The device plugin API's messages (``v1beta1``, v1beta1/api.proto), written and read by
:mod:`vgpu_state.protowire`: what the plugin sends the kubelet and the requests it reads.

The field numbers are api.proto's; tests/test_protowire.py reads every
message back with the generated classes (and writes the requests with them).
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu_state import protowire as w

API_VERSION = "v1beta1"
SERVICE = "/v1beta1.DevicePlugin/"
REGISTER = "/v1beta1.Registration/Register"


@dataclass(frozen=True)
class Device:
    """One ``Device`` of a ``ListAndWatchResponse``."""

    id: str
    health: str
    numa_node: int | None = None


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True)
class ContainerAllocation:
    """One ``ContainerAllocateResponse``: the environment and the device nodes."""

    envs: dict[str, str]
    devices: tuple[DeviceSpec, ...]


@dataclass(frozen=True)
class PreferredRequest:
    """One ``ContainerPreferredAllocationRequest``."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


# -- what the plugin sends ------------------------------------------------------


def options(*, pre_start_required: bool, get_preferred_allocation_available: bool) -> bytes:
    """``DevicePluginOptions``."""
    return w.boolean(1, pre_start_required) + w.boolean(2, get_preferred_allocation_available)


def register_request(endpoint: str, resource_name: str, plugin_options: bytes) -> bytes:
    """``RegisterRequest`` of this API version."""
    return (
        w.string(1, API_VERSION)
        + w.string(2, endpoint)
        + w.string(3, resource_name)
        + w.message(4, plugin_options)
    )


def list_and_watch_response(devices: list[Device]) -> bytes:
    """``ListAndWatchResponse``: each device with its NUMA node, where it has one."""
    out = []
    for d in devices:
        topology = (
            w.message(3, w.message(1, w.integer(1, d.numa_node)))
            if d.numa_node is not None
            else b""
        )
        out.append(w.message(1, w.string(1, d.id) + w.string(2, d.health) + topology))
    return b"".join(out)


def preferred_allocation_response(choices: list[list[str]]) -> bytes:
    """``PreferredAllocationResponse``: one container's device IDs per item."""
    return b"".join(w.message(1, w.strings(1, ids)) for ids in choices)


def allocate_response(containers: list[ContainerAllocation]) -> bytes:
    """``AllocateResponse``."""
    out = []
    for c in containers:
        specs = b"".join(w.message(3, _device_spec(d)) for d in c.devices)
        out.append(w.message(1, w.string_map(1, c.envs) + specs))
    return b"".join(out)


def _device_spec(d: DeviceSpec) -> bytes:
    return w.string(1, d.container_path) + w.string(2, d.host_path) + w.string(3, d.permissions)


# -- what the plugin reads --------------------------------------------------------


def empty(data: bytes, name: str) -> None:
    """A message whose fields the plugin does not need (``Empty``,
    ``PreStartContainerRequest``): well formed, its fields skipped."""
    for _ in w.Reader(data, name):
        pass


def preferred_allocation_request(data: bytes) -> list[PreferredRequest]:
    """``PreferredAllocationRequest``."""
    top = w.Reader(data, "PreferredAllocationRequest")
    found = []
    for number, wire_type, value in top:
        if number != 1:
            continue
        index = top.count(1, "container_requests")
        r = top.message(number, "container_requests", wire_type, value, index)
        available: list[str] = []
        must: list[str] = []
        size = 0
        for n, t, v in r:
            if n == 1:
                r.count(1, "available_deviceIDs")
                available.append(r.string(n, "available_deviceIDs", t, v))
            elif n == 2:
                r.count(2, "must_include_deviceIDs")
                must.append(r.string(n, "must_include_deviceIDs", t, v))
            elif n == 3:
                size = r.integer(n, "allocation_size", t, v)
        found.append(PreferredRequest(tuple(available), tuple(must), size))
    return found


def allocate_request(data: bytes) -> list[tuple[str, ...]]:
    """``AllocateRequest``: each container's device IDs."""
    top = w.Reader(data, "AllocateRequest")
    found = []
    for number, wire_type, value in top:
        if number != 1:
            continue
        index = top.count(1, "container_requests")
        r = top.message(number, "container_requests", wire_type, value, index)
        ids = []
        for n, t, v in r:
            if n == 1:
                r.count(1, "devices_ids")
                ids.append(r.string(n, "devices_ids", t, v))
        found.append(tuple(ids))
    return found
