"""In-use from the kubelet: our pod-resources protos, a client, a fake kubelet on a unix socket."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.kubelet_podresources import PodDevices, PodResourcesKubelet, serving
from vgpu_state.kube.errors import PodResourcesUnavailableError
from vgpu_state.kube.podresources.client import PodHolder, list_holders

UUID_A = "F715F63C-0D00-4007-9C5A-B07B0C6C05DE"


def _socket(tmp_path: Path) -> Path:
    # A unix socket path must stay short (108 bytes); pytest's tmp paths can be long.
    import tempfile

    return Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp")) / "kubelet.sock"


def test_holders_of_our_resources_with_the_vm_of_a_virt_launcher(tmp_path: Path) -> None:
    sock = _socket(tmp_path)
    kubelet = PodResourcesKubelet(
        [
            PodDevices(
                "vms", "virt-launcher-win-1-x7k2p", "compute", "nvidia.com/NVIDIA_A2-4C", [UUID_A]
            ),
            PodDevices("ml", "trainer-0", "main", "nvidia.com/NVIDIA_L40S-12Q", ["0000:81:00.6"]),
            PodDevices("ml", "trainer-0", "main", "example.com/nic", ["0000:c0:00.1"]),
        ]
    )
    with serving(sock, kubelet):
        held = list_holders(str(sock))
    assert held == {
        UUID_A.lower(): PodHolder(
            "vms", "virt-launcher-win-1-x7k2p", "compute", "nvidia.com/NVIDIA_A2-4C"
        ),
        "0000:81:00.6": PodHolder("ml", "trainer-0", "main", "nvidia.com/NVIDIA_L40S-12Q"),
    }
    assert str(held[UUID_A.lower()]) == "pod vms/virt-launcher-win-1-x7k2p (VM vms/win-1)"
    assert str(held["0000:81:00.6"]) == "pod ml/trainer-0"


def test_a_missing_socket_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(PodResourcesUnavailableError, match="no such socket") as info:
        list_holders(str(tmp_path / "kubelet.sock"))
    assert "which vGPUs pods hold is unknown" in str(info.value)
    plain = tmp_path / "file.sock"
    plain.write_text("")
    with pytest.raises(PodResourcesUnavailableError, match="not a unix socket"):
        list_holders(str(plain))


def test_a_kubelet_that_refuses_is_a_typed_error(tmp_path: Path) -> None:
    sock = _socket(tmp_path)
    with (
        serving(sock, PodResourcesKubelet(fail=grpc.StatusCode.RESOURCE_EXHAUSTED)),
        pytest.raises(PodResourcesUnavailableError, match="RESOURCE_EXHAUSTED"),
    ):
        list_holders(str(sock))


def test_a_dead_socket_is_a_typed_error(tmp_path: Path) -> None:
    sock = _socket(tmp_path)
    with serving(sock, PodResourcesKubelet()):
        pass
    # The server is gone; whether its socket file stays or not, nobody answers.
    if not sock.exists():
        import socket as socket_mod

        s = socket_mod.socket(socket_mod.AF_UNIX)
        s.bind(str(sock))
        s.close()
    with pytest.raises(PodResourcesUnavailableError):
        list_holders(str(sock), timeout=1.0)


def test_wire_names_and_field_numbers_are_the_kubelets() -> None:
    from vgpu_state.kube.podresources import api_pb2

    desc = api_pb2.DESCRIPTOR
    assert desc.package == "v1"
    assert desc.services_by_name["PodResourcesLister"].full_name == "v1.PodResourcesLister"
    numbers = {
        f"{m.name}.{f.name}": f.number
        for m in desc.message_types_by_name.values()
        for f in m.fields
    }
    assert numbers["ListPodResourcesResponse.pod_resources"] == 1
    assert numbers["PodResources.name"] == 1
    assert numbers["PodResources.namespace"] == 2
    assert numbers["PodResources.containers"] == 3
    assert numbers["ContainerResources.devices"] == 2
    assert numbers["ContainerResources.dynamic_resources"] == 5
    assert numbers["ContainerDevices.resource_name"] == 1
    assert numbers["ContainerDevices.device_ids"] == 2
    assert numbers["NUMANode.ID"] == 1
    assert numbers["ClaimResource.share_id"] == 5
    assert numbers["GetPodResourcesRequest.pod_namespace"] == 2
