"""The checked-in DRA and registration stubs are what grpcio-tools makes of our .proto files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _numbers(module: object) -> dict[str, int]:
    desc = module.DESCRIPTOR  # type: ignore[attr-defined]
    return {
        f"{m.name}.{f.name}": f.number
        for m in desc.message_types_by_name.values()
        for f in m.fields
    }


def test_wire_names_and_field_numbers_are_the_kubelets() -> None:
    from vgpu_state.dra.pluginregistration import api_pb2 as reg
    from vgpu_state.dra.v1 import api_pb2 as v1
    from vgpu_state.dra.v1beta1 import api_pb2 as v1beta1

    registration = reg.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"
    assert [m.name for m in registration.methods] == [
        "GetInfo",
        "NotifyRegistrationStatus",
    ]
    r = _numbers(reg)
    assert (r["PluginInfo.type"], r["PluginInfo.name"], r["PluginInfo.endpoint"]) == (1, 2, 3)
    assert r["PluginInfo.supported_versions"] == 4
    assert (r["RegistrationStatus.plugin_registered"], r["RegistrationStatus.error"]) == (1, 2)

    for module, package in (
        (v1, "k8s.io.kubelet.pkg.apis.dra.v1"),
        (v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1"),
    ):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"{package}.DRAPlugin"
        assert [m.name for m in service.methods] == [
            "NodePrepareResources",
            "NodeUnprepareResources",
        ]
        n = _numbers(module)
        assert (n["Claim.namespace"], n["Claim.uid"], n["Claim.name"]) == (1, 2, 3)
        assert n["NodePrepareResourceResponse.devices"] == 1
        assert n["NodePrepareResourceResponse.error"] == 2
        assert n["Device.request_names"] == 1 and n["Device.pool_name"] == 2
        assert n["Device.device_name"] == 3 and n["Device.cdi_device_ids"] == 4
        assert n["NodeUnprepareResourceResponse.error"] == 1
        assert n["NodePrepareResourcesResponse.claims"] == 1
    assert _numbers(v1)["Device.share_id"] == 5
    assert "Device.share_id" not in _numbers(v1beta1)


def test_the_dra_package_loads_grpc_only_where_it_serves_the_kubelet() -> None:
    code = (
        "import sys\n"
        "import vgpu_state.dra.slices, vgpu_state.dra.claims, vgpu_state.dra.prepare\n"
        "import vgpu_state.cli.main\n"
        "assert 'grpc' not in sys.modules, 'grpc was imported'\n"
        "import vgpu_state.dra.plugin\n"
        "assert 'grpc' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
