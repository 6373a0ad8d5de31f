"""The checked-in device plugin stubs are exactly what grpcio-tools makes of api.proto."""

from __future__ import annotations


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
