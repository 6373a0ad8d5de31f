"""What the withheld-capacity tests share: a simulated A2 whose layout switches, the configs
that switch and revert it, and how the plans withhold its vGPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.model.plan import ActionKind, Plan
from vgpu_state.reconcile import Inputs, Settings
from vgpu_state.reconcile import once as reconcile_once_module

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


def config(layout: str, policy: str = "protect") -> StaticConfigSource:
    return StaticConfigSource(
        load_text(_LAYOUT.format(policy=policy, layout=layout), "layouts.yaml", catalog=CATALOG)
    )


def settings() -> Settings:
    return Settings(catalog=CATALOG)


def evacuate_withholds(plan: Plan, inputs: Inputs) -> Plan:
    """``plan`` with each pending switch's free vGPUs of departing types withheld, as
    ``in-use: evacuate`` plans them (a switch is pending on a GPU that defers it or
    whose vGPUs the plan destroys)."""
    gpus = []
    for g in plan.gpus:
        destroys = any(a.kind is ActionKind.DESTROY for a in plan.gpu_actions(g.address))
        live = inputs.snapshot.gpu(g.address)
        wanted = next((d for d in inputs.desired.gpus if d.address == g.address), None)
        if live is None or wanted is None or not (destroys or g.deferred_switch is not None):
            gpus.append(g)
            continue
        keep = {name for name, count in wanted.types if count}
        keys = sorted(
            v.key for v in live.vgpus if v.key not in inputs.in_use and v.type_name not in keep
        )
        gpus.append(g.model_copy(update={"withheld": tuple(keys)}))
    return plan.model_copy(update={"gpus": tuple(gpus)})


def plans_withhold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every plan of this test withhold as ``in-use: evacuate`` does."""
    plan_inputs = reconcile_once_module.plan_inputs

    def withholding(inputs: Inputs, s: Settings) -> Plan:
        return evacuate_withholds(plan_inputs(inputs, s), inputs)

    monkeypatch.setattr(reconcile_once_module, "plan_inputs", withholding)
