"""`vgpu-state plan` shows its blast radius: capacity before → after, disruption, holders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from vgpu_state.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
SIM = REPO / "configs" / "sim"

A2_8Q = """\
version: v1
{policy}vgpu-configs:
  a2-8q:
    - devices: all
      vgpu-devices:
        A2-8Q: 2
"""

L40S_4Q = """\
version: v1
vgpu-configs:
  render:
    - devices: all
      vgpu-devices:
        L40S-4Q: 2
"""

L40S_VFS_OFF = """\
node: l40s-node
driver:
  flavour: graphics
gpus:
  - address: "0000:26:00.0"
    model: L40S
    layout: vendor-vfio
    sriov: false
"""


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout


def plan_both(config: Path, spec: Path, name: str) -> tuple[str, dict[str, Any]]:
    code, text = run("plan", "-f", str(config), "--sim", str(spec), "-c", name)
    assert code == 0, text
    code, out = run("plan", "-f", str(config), "--sim", str(spec), "-c", name, "-o", "json")
    assert code == 0, out
    return text, json.loads(out)


def capacity(doc: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    return {c["resource"] or c["type_name"]: (c["before"], c["after"], c["held"])
            for c in doc["capacity"]}


@pytest.fixture
def a2_node(tmp_path: Path) -> Path:
    spec = tmp_path / "a2.yaml"
    shutil.copy(SIM / "a2-host.yaml", spec)
    return spec


def test_a_layout_switch_a_held_vgpu_blocks_is_deferred_and_loses_no_capacity(
    a2_node: Path, tmp_path: Path
) -> None:
    config = tmp_path / "layouts.yaml"
    config.write_text(A2_8Q.format(policy=""))
    text, doc = plan_both(config, a2_node, "a2-8q")
    lines = text.splitlines()
    cap = lines.index("Capacity (vGPUs per resource, now → after this plan):")
    # The held A2-4C keeps every A2-8Q out (one framebuffer size per GPU): destroying
    # the free A2-4A and A2-4Q would buy nothing, so they stay and the switch waits.
    assert lines[cap + 1 : cap + 5] == [
        "  nvidia.com/NVIDIA_A2-4A  1 → 1",
        "  nvidia.com/NVIDIA_A2-4C  1 → 1  [1 held]",
        "  nvidia.com/NVIDIA_A2-4Q  1 → 1",
        "  nvidia.com/NVIDIA_A2-8Q  0 → 0  [2 more wanted, not created: switch deferred, "
        "waits for vm default/win-1]",
    ]
    assert lines[-3:] == [
        "Disruption: none (nothing is destroyed)",
        "Protected (policy in-use: protect): vm default/win-1 (1 vGPU)",
        "Plan: 0 to create, 0 to destroy, 5 blocked (1 GPU waiting to switch).",
    ]
    assert "Affected" not in text
    assert doc["format_version"] == "1.6"
    assert doc["disruption"] == {"level": "none", "destroyed": 0, "held": 0, "gpus": 0}
    assert doc["actions"] == []
    assert doc["protected"] == [{"holder": "vm default/win-1", "vgpus": 1}]
    assert doc["affected"] == []
    assert capacity(doc) == {
        "nvidia.com/NVIDIA_A2-4A": (1, 1, 0),
        "nvidia.com/NVIDIA_A2-4C": (1, 1, 1),
        "nvidia.com/NVIDIA_A2-4Q": (1, 1, 0),
        "nvidia.com/NVIDIA_A2-8Q": (0, 0, 0),
    }
    [wanted] = [c for c in doc["capacity"] if c["blocked"]]
    assert (wanted["blocked"], wanted["blocked_code"], wanted["waits_for"]) == (
        2, "SwitchDeferred", ["vm default/win-1"]
    )
    assert {c["publish"] for c in doc["capacity"]} == {"device-plugin"}


def test_in_use_ignore_names_the_holder_that_loses_its_vgpu(a2_node: Path, tmp_path: Path) -> None:
    config = tmp_path / "layouts.yaml"
    config.write_text(A2_8Q.format(policy="policy:\n  in-use: ignore\n"))
    text, doc = plan_both(config, a2_node, "a2-8q")
    assert text.splitlines()[-3:] == [
        "Disruption: device (2 free vGPUs and 1 held vGPU destroyed on 1 GPU)",
        "Affected (policy in-use: ignore, their vGPUs are destroyed): vm default/win-1 (1 vGPU)",
        "Plan: 2 to create, 3 to destroy, 0 blocked.",
    ]
    assert "Protected" not in text
    assert doc["affected"] == [{"holder": "vm default/win-1", "vgpus": 1}]
    assert doc["disruption"]["held"] == 1
    assert capacity(doc)["nvidia.com/NVIDIA_A2-4C"] == (1, 0, 1)
    assert capacity(doc)["nvidia.com/NVIDIA_A2-8Q"] == (0, 2, 0)


def test_enabling_sriov_on_an_l40s_disrupts_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "l40s.yaml"
    spec.write_text(L40S_VFS_OFF)
    config = tmp_path / "layouts.yaml"
    config.write_text(L40S_4Q)
    text, doc = plan_both(config, spec, "render")
    assert "~ gpu[0000:26:00.0].sriov will be enabled" in text
    assert text.splitlines()[-2] == (
        "Disruption: none (nothing is destroyed; enabling SR-IOV adds virtual functions)"
    )
    assert [(a["kind"], a["disruption"]) for a in doc["actions"]] == [
        ("enable-sriov", "none"), ("create", "none"), ("create", "none")
    ]
    assert doc["disruption"]["level"] == "none"
    # No virtual function exists yet, so the driver's name of the type is not known.
    assert "  L40S-4Q (resource name not known yet)  0 → 2 (+2)" in text
    assert doc["capacity"] == [
        {"resource": None, "type_name": "L40S-4Q", "publish": "device-plugin", "before": 0,
         "after": 2, "held": 0, "kubevirt": None, "blocked": 0, "blocked_code": None,
         "waits_for": []}
    ]


def test_a_create_only_plan_is_none_and_counts_what_stays(tmp_path: Path) -> None:
    spec = tmp_path / "l40s.yaml"
    shutil.copy(SIM / "l40s-pair.yaml", spec)
    config = tmp_path / "layouts.yaml"
    config.write_text(L40S_4Q)
    text, doc = plan_both(config, spec, "render")
    assert "  nvidia.com/NVIDIA_L40S-4Q  2 → 4 (+2)  [1 held]" in text
    assert text.splitlines()[-2:] == [
        "Disruption: none (creates only)",
        "Plan: 2 to create, 0 to destroy, 0 blocked.",
    ]
    assert "Protected" not in text and "Affected" not in text
    assert doc["disruption"] == {"level": "none", "destroyed": 0, "held": 0, "gpus": 0}
    assert capacity(doc) == {"nvidia.com/NVIDIA_L40S-4Q": (2, 4, 1)}


def test_a_node_that_matches_prints_no_blast_radius_but_json_has_capacity(tmp_path: Path) -> None:
    spec = tmp_path / "l40s.yaml"
    shutil.copy(SIM / "l40s-pair.yaml", spec)
    code, out = run("export", "--sim", str(spec))
    exported = tmp_path / "current.yaml"
    exported.write_text(out)
    code, text = run("plan", "-f", str(exported), "--sim", str(spec))
    assert code == 0
    assert "Capacity" not in text and "Disruption" not in text
    code, out = run("plan", "-f", str(exported), "--sim", str(spec), "-o", "json")
    doc = json.loads(out)
    assert doc["disruption"]["level"] == "none"
    assert capacity(doc) == {"nvidia.com/NVIDIA_L40S-4Q": (2, 2, 1)}


def test_capacity_names_the_dra_channel(tmp_path: Path) -> None:
    spec = tmp_path / "l40s.yaml"
    shutil.copy(SIM / "l40s-pair.yaml", spec)
    config = tmp_path / "layouts.yaml"
    config.write_text(L40S_4Q.replace("vgpu-configs:", "policy:\n  publish: dra\nvgpu-configs:"))
    text, doc = plan_both(config, spec, "render")
    assert "  nvidia.com/NVIDIA_L40S-4Q  2 → 4 (+2)  [DRA; 1 held]" in text
    assert [(c["resource"], c["publish"]) for c in doc["capacity"]] == [
        ("nvidia.com/NVIDIA_L40S-4Q", "dra")
    ]
