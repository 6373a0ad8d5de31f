"""What the withheld-capacity tests share: a simulated A2 whose layout switches, and the
configs (``in-use: evacuate`` unless told otherwise) that switch and revert it."""

from __future__ import annotations

from pathlib import Path

from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.reconcile import Settings

CATALOG = default_catalog()
SIM = Path(__file__).resolve().parent.parent / "configs" / "sim"
NODE = "a2-node"
GPU = "0000:08:00.0"
HELD_4C = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"
FREE_4Q = "c728e022-f16f-434b-ad2c-9665ee634d3d"
FREE_4A = "3deab9a4-200a-4c54-99b1-5eb0722d1d81"
VM_HOLDER = "pod default/virt-launcher-win-1-x7k2p (VM default/win-1)"
R_4C, R_4Q, R_4A = "nvidia.com/NVIDIA_A2-4C", "nvidia.com/NVIDIA_A2-4Q", "nvidia.com/NVIDIA_A2-4A"
R_2Q = "nvidia.com/NVIDIA_A2-2Q"

_LAYOUT = """version: v1
policy:
  in-use: {policy}
vgpu-configs:
  a2:
    - devices: all
      vgpu-devices: {layout}
"""
KEEP = "{A2-4C: 1, A2-4Q: 1, A2-4A: 1}"
"""The simulated A2's layout as it is (nothing to do)."""
SWITCH = "{A2-2Q: 8}"
"""Every type on the A2 departs."""


def a2_host(tmp_path: Path) -> Path:
    """A copy of the simulated A2 whose A2-4C no process holds open: which VM holds it is
    the test's cluster's to say (the kubelet's pod-resources, as on a node)."""
    spec = tmp_path / "a2-host.yaml"
    text = (SIM / "a2-host.yaml").read_text()
    held = ', in-use: "vm default/win-1"'
    assert held in text
    spec.write_text(text.replace(held, ""))
    return spec


def config(layout: str, policy: str = "evacuate") -> StaticConfigSource:
    return StaticConfigSource(
        load_text(_LAYOUT.format(policy=policy, layout=layout), "layouts.yaml", catalog=CATALOG)
    )


def settings() -> Settings:
    return Settings(catalog=CATALOG)
