"""MIG-backed and mixed-size vGPU types get resource names and KubeVirt CR entries by the
same rule as every type: the names pass the kubelet's rules and KubeVirt's own schema."""

from __future__ import annotations

from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests.apiserver import kubevirt_validator
from tests.builders import V, build_gpu, build_snapshot
from vgpu_state.kube.permitted import desired_entries
from vgpu_state.model.resources import resource_name, resource_name_problem
from vgpu_state.model.snapshot import Gpu

PRO6000 = "RTX PRO 6000 Blackwell Server Edition"


@pytest.mark.parametrize(
    ("type_name", "resource"),
    [
        ("NVIDIA DC-1-24Q", "nvidia.com/NVIDIA_DC-1-24Q"),
        ("NVIDIA A100-1-5CME", "nvidia.com/NVIDIA_A100-1-5CME"),
        ("NVIDIA B300X-7-269C", "nvidia.com/NVIDIA_B300X-7-269C"),
        (
            "NVIDIA RTX Pro 6000 Blackwell DC-2-48Q",
            "nvidia.com/NVIDIA_RTX_Pro_6000_Blackwell_DC-2-48Q",
        ),
    ],
)
def test_a_mig_backed_type_has_a_legal_resource_name(type_name: str, resource: str) -> None:
    assert resource_name(type_name) == resource
    assert resource_name_problem(resource) is None


def named(gpu: Gpu) -> Gpu:
    """The GPU with its vGPUs' sysfs names as the driver shows them (``NVIDIA <type>``)."""
    vgpus = tuple(
        v.model_copy(update={"type_sysfs_name": f"NVIDIA {v.type_name}"}) for v in gpu.vgpus
    )
    return gpu.model_copy(update={"vgpus": vgpus})


def test_mig_backed_and_mixed_size_entries_pass_kubevirts_schema() -> None:
    mig_mdev = build_gpu(
        "0000:3b:00.0", "A100 PCIe 40GB", vgpus=[V("A100-1-5C", 0), V("A100-1-5CME", 1)]
    )
    mig_vfio = build_gpu(
        "0000:5e:00.0", PRO6000, layout="vendor-vfio", vgpus=[V("DC-1-24Q", 0), V("DC-1-24C", 1)]
    )
    mixed = build_gpu(
        "0000:86:00.0", "L40S", layout="vendor-vfio", vgpus=[V("L40S-24Q", 0), V("L40S-12Q", 1)]
    )
    wanted = desired_entries(build_snapshot(*(named(g) for g in (mig_mdev, mig_vfio, mixed))))
    assert wanted.problems == ()
    entries = {(e.list, e.selector, e.resource) for e in wanted.entries}
    assert {
        ("mediatedDevices", "NVIDIA A100-1-5C", "nvidia.com/NVIDIA_A100-1-5C"),
        ("mediatedDevices", "NVIDIA A100-1-5CME", "nvidia.com/NVIDIA_A100-1-5CME"),
        ("pciHostDevices", "10DE:2BB5", "nvidia.com/NVIDIA_DC-1-24Q"),
        ("pciHostDevices", "10DE:2BB5", "nvidia.com/NVIDIA_DC-1-24C"),
        ("pciHostDevices", "10DE:26B9", "nvidia.com/NVIDIA_L40S-24Q"),
        ("pciHostDevices", "10DE:26B9", "nvidia.com/NVIDIA_L40S-12Q"),
    } == entries
    permitted: dict[str, list[dict[str, Any]]] = {}
    for e in wanted.entries:
        permitted.setdefault(e.list, []).append(e.to_json())
    cr = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": {"permittedHostDevices": permitted}},
    }
    kubevirt_validator()(cr)
    # The schema check is strict: a misspelt selector is refused.
    permitted["mediatedDevices"][0]["mdevNameSelectr"] = permitted["mediatedDevices"][0].pop(
        "mdevNameSelector"
    )
    with pytest.raises(jsonschema.ValidationError):
        kubevirt_validator()(cr)
