"""Resource names and env vars: what the kubelet accepts and what KubeVirt reads."""

from __future__ import annotations

import pytest

from vgpu_state.model.resources import (
    ResourceNameError,
    env_var,
    resource_name,
    resource_name_problem,
)


@pytest.mark.parametrize(
    ("type_name", "expected"),
    [
        ("NVIDIA A2-4Q", "nvidia.com/NVIDIA_A2-4Q"),
        ("GRID T4-1Q", "nvidia.com/GRID_T4-1Q"),
        ("NVIDIA  L40S-24Q\n", "nvidia.com/NVIDIA_L40S-24Q"),
        ("NVIDIA RTX Pro 6000 Blackwell DC-3Q", "nvidia.com/NVIDIA_RTX_Pro_6000_Blackwell_DC-3Q"),
    ],
)
def test_resource_name_from_type(type_name: str, expected: str) -> None:
    assert resource_name(type_name) == expected


@pytest.mark.parametrize(
    "type_name",
    ["A2-4Q (beta)", "x" * 64, "A2-4Q-", "_A2", ""],
)
def test_illegal_type_names_are_reported(type_name: str) -> None:
    with pytest.raises(ResourceNameError, match="gives resource"):
        resource_name(type_name)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("nvidia.com", "exactly one '/'"),
        ("kubernetes.io/foo", "reserved"),
        ("Nvidia.com/foo", "DNS subdomain"),
        ("requests.nvidia.com/foo", "requests."),
    ],
)
def test_resource_name_problems(name: str, fragment: str) -> None:
    problem = resource_name_problem(name)
    assert problem is not None and fragment in problem


def test_env_var_matches_kubevirt() -> None:
    assert env_var("nvidia.com/GRID_T4-1Q", "mdev") == "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q"
    assert (
        env_var("nvidia.com/NVIDIA_L40S-24Q", "vf") == "PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-24Q"
    )
