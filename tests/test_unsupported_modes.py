"""What vgpu-state does not do is said where a user meets it: MIG-backed vGPU types
(a warning from validate, a planning error on a node that nothing follows) and the
driver's mixed-size mode (a validate error that names it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

A100_NODE = """\
node: a100-node
driver:
  flavour: all
gpus:
  - address: "0000:3b:00.0"
    model: A100
    layout: mdev
    sriov: true
"""
MIG_LAYOUTS = """\
version: v1
vgpu-configs:
  mig:
    - devices: all
      vgpu-devices: {A100-1-5C: 7}
"""
LIMITATION = "vgpu-state does not lay out MIG-backed vGPUs"


def vgpu_state(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", *args],
        cwd=cwd, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_validate_warns_about_a_mig_backed_type_and_strict_refuses_it(tmp_path: Path) -> None:
    (tmp_path / "layouts.yaml").write_text(MIG_LAYOUTS)
    ok = vgpu_state("validate", "-f", "layouts.yaml", cwd=tmp_path)
    assert ok.returncode == 0
    assert "valid: 1 config (1 warning)" in ok.stdout
    warning = "layouts.yaml:5:22: warning: A100-1-5C is MIG-backed: "
    assert ok.stderr.startswith(warning + LIMITATION)
    assert "docs/config.md#what-vgpu-state-does-not-do" in ok.stderr
    strict = vgpu_state("validate", "-f", "layouts.yaml", "--strict", cwd=tmp_path)
    assert strict.returncode == 1
    assert strict.stderr.startswith("layouts.yaml:5:22: A100-1-5C is MIG-backed: " + LIMITATION)


def test_planning_mig_backed_vgpus_without_nvidia_smi_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    """MIG mode is read with nvidia-smi only: without one, a MIG-backed layout is a
    planning error that names the flag, and neither plan nor apply writes anything."""
    (tmp_path / "layouts.yaml").write_text(MIG_LAYOUTS)
    spec = tmp_path / "node.yaml"
    spec.write_text(A100_NODE)
    for command in ("plan", "apply"):
        args = [command, "-f", "layouts.yaml", "-c", "mig", "--sim", "node.yaml"]
        proc = vgpu_state(*args, *(["--auto-approve"] if command == "apply" else []), cwd=tmp_path)
        assert proc.returncode == 1, command
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(
            "error: gpu[0000:3b:00.0] (A100 PCIe 40GB): the layout is MIG-backed (A100-1-5C); "
            "reading MIG/mixed-size mode needs nvidia-smi: pass --nvidia-smi PATH"
        ), last
        assert "[layouts.yaml:4:7 (vgpu-configs.mig[0])]" in last
    assert spec.read_text() == A100_NODE, "the simulated node is as it was"
    assert not (tmp_path / "node.yaml.journal.jsonl").exists(), "no apply was journalled"


def test_two_framebuffer_sizes_on_one_gpu_name_the_unsupported_mixed_size_mode(
    tmp_path: Path,
) -> None:
    (tmp_path / "layouts.yaml").write_text(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n"
        "      vgpu-devices: {A10-4Q: 2, A10-8Q: 1}\n"
    )
    proc = vgpu_state("validate", "-f", "layouts.yaml", cwd=tmp_path)
    assert proc.returncode == 1
    assert "vGPUs on one GPU share one framebuffer size" in proc.stderr
    assert "(mixed-size mode is not supported)" in proc.stderr
