"""The device plugin's and the pod-resources client's protobuf messages, written and read
without the protobuf runtime (vgpu_state/protowire.py and the two ``messages`` modules).

Every message the agent sends is read back by the classes protoc generates from the
kubelet's api.proto files; every message it reads is written by them. Hostile bytes
(as a process that took over the kubelet's socket could send) end in a clear error.
The real kubelet's device manager talking to the plugin is tests/test_kubelet_devicemanager.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu_state import protowire as w
from vgpu_state.deviceplugin import messages as m
from vgpu_state.deviceplugin.inventory import ResourceInventory
from vgpu_state.deviceplugin.server import ResourceServer
from vgpu_state.deviceplugin.v1beta1 import api_pb2 as pb
from vgpu_state.kube.errors import PodResourcesUnavailableError
from vgpu_state.kube.podresources import api_pb2 as prpb
from vgpu_state.kube.podresources import messages as pm
from vgpu_state.kube.podresources.client import list_holders
from vgpu_state.testing.grpc_unix import unix_server

ids = st.lists(st.text(max_size=40), max_size=6)
names = st.text(max_size=40)


# -- what the agent sends, read by the generated classes ---------------------------------


@pytest.mark.parametrize("pre_start", [False, True])
@pytest.mark.parametrize("preferred", [False, True])
def test_options(pre_start: bool, preferred: bool) -> None:
    got = pb.DevicePluginOptions.FromString(
        m.options(pre_start_required=pre_start, get_preferred_allocation_available=preferred)
    )
    assert got == pb.DevicePluginOptions(
        pre_start_required=pre_start, get_preferred_allocation_available=preferred
    )


@given(endpoint=names, resource=names)
def test_register_request(endpoint: str, resource: str) -> None:
    data = m.register_request(
        endpoint,
        resource,
        m.options(pre_start_required=False, get_preferred_allocation_available=True),
    )
    got = pb.RegisterRequest.FromString(data)
    assert got == pb.RegisterRequest(
        version="v1beta1",
        endpoint=endpoint,
        resource_name=resource,
        options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    assert got.HasField("options")


devices = st.lists(
    st.builds(
        m.Device,
        id=names,
        health=st.sampled_from(["Healthy", "Unhealthy", ""]),
        numa_node=st.none() | st.integers(-(2**63), 2**63 - 1),
    ),
    max_size=8,
)


@given(devices)
def test_list_and_watch_response(listed: list[m.Device]) -> None:
    got = pb.ListAndWatchResponse.FromString(m.list_and_watch_response(listed))
    want = pb.ListAndWatchResponse(
        devices=[
            pb.Device(
                ID=d.id,
                health=d.health,
                topology=(
                    pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)])
                    if d.numa_node is not None
                    else None
                ),
            )
            for d in listed
        ]
    )
    assert got == want
    # NUMA node 0 is a node, not "no topology".
    for d, sent in zip(listed, got.devices, strict=True):
        assert sent.HasField("topology") == (d.numa_node is not None)


@given(st.lists(ids, max_size=5))
def test_preferred_allocation_response(choices: list[list[str]]) -> None:
    got = pb.PreferredAllocationResponse.FromString(m.preferred_allocation_response(choices))
    assert got == pb.PreferredAllocationResponse(
        container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=c) for c in choices]
    )


containers = st.lists(
    st.builds(
        m.ContainerAllocation,
        envs=st.dictionaries(names, names, max_size=4),
        devices=st.lists(st.builds(m.DeviceSpec, names, names, names), max_size=3).map(tuple),
    ),
    max_size=4,
)


@given(containers)
def test_allocate_response(sent: list[m.ContainerAllocation]) -> None:
    got = pb.AllocateResponse.FromString(m.allocate_response(sent))
    assert got == pb.AllocateResponse(
        container_responses=[
            pb.ContainerAllocateResponse(
                envs=c.envs,
                devices=[
                    pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path,
                                  permissions=d.permissions)
                    for d in c.devices
                ],
            )
            for c in sent
        ]
    )  # fmt: skip


def test_the_empty_answers_are_empty_messages() -> None:
    assert pb.PreStartContainerResponse.FromString(b"") == pb.PreStartContainerResponse()
    assert pb.Empty.FromString(b"") == pb.Empty()


# -- what the agent reads, written by the generated classes -------------------------------


@given(st.lists(st.tuples(ids, ids, st.integers(-(2**31), 2**31 - 1)), max_size=5))
def test_preferred_allocation_request(requests: list[tuple[list[str], list[str], int]]) -> None:
    data = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=a, must_include_deviceIDs=mi, allocation_size=n
            )
            for a, mi, n in requests
        ]
    ).SerializeToString()
    assert m.preferred_allocation_request(data) == [
        m.PreferredRequest(tuple(a), tuple(mi), n) for a, mi, n in requests
    ]


@given(st.lists(ids, max_size=5))
def test_allocate_request(requests: list[list[str]]) -> None:
    data = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=r) for r in requests]
    ).SerializeToString()
    assert m.allocate_request(data) == [tuple(r) for r in requests]


def test_requests_without_needed_fields_are_read_and_their_fields_skipped() -> None:
    m.empty(pb.PreStartContainerRequest(devices_ids=["a", "b"]).SerializeToString(), "x")
    m.empty(pb.Empty().SerializeToString(), "Empty")


pods = st.lists(
    st.tuples(
        names,
        names,
        st.lists(st.tuples(names, st.lists(st.tuples(names, ids), max_size=3)), max_size=3),
    ),
    max_size=4,
)


@settings(max_examples=50)
@given(pods, st.lists(st.integers(0, 2**40), max_size=4))
def test_list_response(listed: list[tuple[str, str, list[Any]]], cpus: list[int]) -> None:
    """The parts the agent does not read (CPUs, memory, topology, dynamic resources) are
    skipped; the devices by pod, container and resource are read."""
    topology = prpb.TopologyInfo(nodes=[prpb.NUMANode(ID=1)])
    data = prpb.ListPodResourcesResponse(
        pod_resources=[
            prpb.PodResources(
                name=pod,
                namespace=ns,
                cpu_ids=cpus,
                containers=[
                    prpb.ContainerResources(
                        name=c,
                        cpu_ids=cpus,
                        memory=[prpb.ContainerMemory(memory_type="hugepages-1Gi", size=2**33,
                                                     topology=topology)],
                        dynamic_resources=[prpb.DynamicResource(
                            claim_name="c", claim_namespace=ns,
                            claim_resources=[prpb.ClaimResource(
                                cdi_devices=[prpb.CDIDevice(name="k8s.gpu/x")],
                                driver_name="d", share_id="s")])],
                        devices=[
                            prpb.ContainerDevices(resource_name=r, device_ids=d, topology=topology)
                            for r, d in devs
                        ],
                    )
                    for c, devs in containers
                ],
            )
            for pod, ns, containers in listed
        ]
    ).SerializeToString()  # fmt: skip
    assert pm.list_response(data) == [
        pm.PodResources(
            pod,
            ns,
            tuple(
                pm.ContainerResources(c, tuple(pm.ContainerDevices(r, tuple(d)) for r, d in devs))
                for c, devs in containers
            ),
        )
        for pod, ns, containers in listed
    ]


# -- hostile bytes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\x0a\x04\x0a\x03ab", r"AllocateRequest.container_requests\[0\]: field 1 at byte 0 "
         r"is 3 bytes long, past the message's end \(2 left\)"),
        (b"\x0a\x05\x0a\x03ab", r"AllocateRequest: field 1 at byte 0 is 5 bytes long"),
        (b"\x0a\x80", r"AllocateRequest: field 1's length at byte 1 is cut short"),
        (b"\x08" + b"\xff" * 11, r"AllocateRequest: field 1 at byte 1 is longer than 10 bytes"),
        (b"\x80", r"AllocateRequest: a field's key at byte 0 is cut short"),
        (b"\x0b\x0c", r"field 1 at byte 0 has wire type 3, which proto3 does not use"),
        (b"\x00", r"field number 0 at byte 0 is out of range"),
        (b"\x0d\x01\x02", r"field 1 at byte 0 is cut short"),
        (b"\x08\x01", r"AllocateRequest.container_requests \(field 1\) has wire type 0, not 2"),
        (b"\x0a\x03\x0a\x01\xff", r"container_requests\[0\].devices_ids is not UTF-8"),
    ],
)  # fmt: skip
def test_malformed_requests_are_refused_naming_the_field_and_byte(data: bytes, error: str) -> None:
    with pytest.raises(w.WireError, match=error):
        m.allocate_request(data)


def test_a_repeated_field_holds_at_most_the_limit() -> None:
    one = w.message(1, w.string(1, "x"))
    m.allocate_request(one * w.MAX_REPEATED)
    with pytest.raises(
        w.WireError, match=f"AllocateRequest.container_requests has more than {w.MAX_REPEATED}"
    ):
        m.allocate_request(one * (w.MAX_REPEATED + 1))
    ids_ = w.strings(2, ["a"] * (w.MAX_REPEATED + 1))
    with pytest.raises(w.WireError, match=r"pod_resources\[0\].containers\[0\].devices\[0\]"):
        pm.list_response(w.message(1, w.message(3, w.message(2, ids_))))


def test_deep_nesting_in_an_unknown_field_is_skipped_unread() -> None:
    """A field the reader does not know is never parsed, however deep it nests; a known
    message is read no deeper than MAX_DEPTH."""
    deep = b""
    for _ in range(10_000):
        deep = w.message(1, deep)
    assert m.allocate_request(w.message(7, deep)) == []
    with pytest.raises(w.WireError, match=f"nested deeper than {w.MAX_DEPTH} messages"):
        w.Reader(b"", "X", depth=w.MAX_DEPTH + 1)


def test_the_plugin_answers_a_malformed_request_with_invalid_argument() -> None:
    with tempfile.TemporaryDirectory(prefix="pw-", dir="/tmp") as d:
        server = ResourceServer(
            ResourceInventory("nvidia.com/A2-4Q", ()),
            f"{d}/p.sock",
            iommufd=False,
            on_stream_end=lambda s: None,
        )
        server.start()
        try:
            with grpc.insecure_channel(f"unix:{d}/p.sock") as channel:
                call = channel.unary_unary(m.SERVICE + "Allocate")
                with pytest.raises(grpc.RpcError) as caught:
                    call(b"\x0a\x05\x0a\x03ab", timeout=5)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "past the message's end" in str(caught.value.details())
                # A well-formed request for an unknown device is still refused by name.
                with pytest.raises(grpc.RpcError) as caught:
                    call(m.allocate_response([]) + w.message(1, w.string(1, "nope")), timeout=5)
                assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        finally:
            server.stop(send_empty=False)


def test_an_unreadable_pod_resources_answer_is_unavailable_naming_why(tmp_path: Path) -> None:
    def answer(request: bytes, context: object) -> bytes:
        return b"\x0a\x09\x0a\x01a"  # a pod whose length runs past the end

    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(answer)}
    )
    socket = tmp_path / "pr.sock"
    server = unix_server(socket, lambda s: s.add_generic_rpc_handlers((handler,)), workers=1)
    try:
        with pytest.raises(PodResourcesUnavailableError, match=r"unreadable.*ListPodResources"):
            list_holders(str(socket))
    finally:
        server.stop(None)
