"""The checked-in device plugin stubs are exactly what grpcio-tools makes of api.proto."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_state.deviceplugin import protos


def test_checked_in_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (a test dependency) is needed")
    fresh = protos.generate(tmp_path)
    stale = [
        name
        for name, text in fresh.items()
        if (protos.SOURCE_ROOT / protos.PROTO.parent / name).read_text(encoding="utf-8") != text
    ]
    assert not stale, (
        f"{', '.join(stale)} differ from api.proto: run python -m vgpu_state.deviceplugin.protos"
    )


def test_wire_names_are_the_kubelets() -> None:
    from vgpu_state.deviceplugin.v1beta1 import api_pb2

    services = api_pb2.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    numbers = {
        f"{m.name}.{f.name}": f.number
        for m in api_pb2.DESCRIPTOR.message_types_by_name.values()
        for f in m.fields
    }
    assert numbers["Device.ID"] == 1 and numbers["Device.topology"] == 3
    assert numbers["ContainerAllocateResponse.cdi_devices"] == 5
    assert numbers["ContainerPreferredAllocationRequest.allocation_size"] == 3
    assert numbers["RegisterRequest.options"] == 4
