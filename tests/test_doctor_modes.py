"""`vgpu-state doctor` on GPUs with MIG and mixed-size mode: capability, state, and
the nvidia-smi that reads them (simulated nodes, as an operator runs it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from vgpu_state.cli.main import cli

REPO = Path(__file__).resolve().parent.parent

PRO_MIG = """\
node: n
nvidia-smi: true
gpus:
  - address: "0000:3b:00.0"
    model: RTX PRO 6000 Blackwell Server Edition
    layout: vendor-vfio
    mig-mode: true
    gpu-instances: [1g.24gb, 1g.24gb, 2g.48gb]
    vgpus: [{type: DC-1-24Q}]
"""


def doctor(*args: str) -> tuple[int, dict[str, Any]]:
    r = CliRunner().invoke(cli, ["doctor", *args, "-o", "json"])
    return r.exit_code, json.loads(r.stdout)


def by_id(report: dict[str, Any], gpu: int = 0) -> dict[str, dict[str, str]]:
    return {c["id"]: c for c in report["gpus"][gpu]["checks"]}


def test_mig_state_and_instances_are_reported(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(PRO_MIG)
    _, report = doctor("--sim", str(node))
    mig = by_id(report)["mig"]
    assert mig["status"] == "ok"
    assert "MIG mode on, GPU instances: 2 × 1g.24gb, 1 × 2g.48gb" in mig["message"]
    assert "experimental: inferred, not verified on hardware" in mig["message"]
    mixed = by_id(report)["mixed-size"]
    assert mixed["message"].endswith("mixed-size mode N/A in MIG mode")
    (smi,) = [c for c in report["checks"] if c["id"] == "nvidia-smi"]
    assert smi["status"] == "ok" and "nvidia-smi (simulated)" in smi["message"]


def test_the_example_specs(tmp_path: Path) -> None:
    for name in ("rtx-pro-6000.yaml", "l40s-mixed.yaml"):
        shutil.copy(REPO / "configs" / "sim" / name, tmp_path / name)
    code, report = doctor("--sim", str(tmp_path / "rtx-pro-6000.yaml"))
    assert code == 0
    assert by_id(report)["mig"]["message"].startswith("MIG-capable; MIG mode off")
    assert by_id(report)["mixed-size"]["message"].endswith("mixed-size mode off")
    code, report = doctor("--sim", str(tmp_path / "l40s-mixed.yaml"))
    assert code == 0 and "mig" not in by_id(report)
    assert "mixed-size capable" in by_id(report)["mixed-size"]["message"]


def test_a_missing_nvidia_smi_is_a_finding_with_its_fix(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(PRO_MIG.replace("nvidia-smi: true", "nvidia-smi: false"))
    _, report = doctor("--sim", str(node))
    (smi,) = [c for c in report["checks"] if c["id"] == "nvidia-smi"]
    assert smi["status"] == "warn" and "--nvidia-smi PATH" in smi["action"]
    mig = by_id(report)["mig"]
    assert mig["status"] == "warn" and "not read: no nvidia-smi" in mig["message"]
    assert "--nvidia-smi PATH" in mig["action"]
    # On a real host, the flag names a tool that is not there.
    r = CliRunner().invoke(cli, ["doctor", "--sim", str(node), "--nvidia-smi", "/x"])
    assert r.exit_code != 0 and "--nvidia-smi applies to a real host" in r.stderr
