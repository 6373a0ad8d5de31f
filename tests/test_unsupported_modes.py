"""GPU modes where a user meets them: a MIG-backed layout validates (also under
--strict) with a note that its GPU instances are inferred; two framebuffer sizes
need mode: mixed-size, which validate names, and a model without that mode is
named as such. Planning a GPU for MIG-backed vGPUs is refused on a node (nothing
written) until the planner lays out GPU instances."""

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


def test_a_mig_backed_layout_validates_with_a_note_that_strict_leaves_a_note(
    tmp_path: Path,
) -> None:
    (tmp_path / "layouts.yaml").write_text(MIG_LAYOUTS)
    note = (
        "layouts.yaml:4:7: note: experimental: inferred, not verified on hardware: "
        "MIG-backed vGPUs in GPU instances 1g.5gb: 7 (the fewest that hold the types)"
    )
    for strict in ((), ("--strict",)):
        proc = vgpu_state("validate", "-f", "layouts.yaml", *strict, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "layouts.yaml: valid: 1 config (1 note)\n"
        assert proc.stderr.startswith(note), proc.stderr
        assert "warning" not in proc.stderr and LIMITATION not in proc.stderr


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


def test_two_framebuffer_sizes_need_mixed_size_mode_which_older_gpus_lack(
    tmp_path: Path,
) -> None:
    def validate(types: str, mode: str = "") -> subprocess.CompletedProcess[str]:
        (tmp_path / "layouts.yaml").write_text(
            "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n"
            f"{'      mode: ' + mode + chr(10) if mode else ''}      vgpu-devices: {types}\n"
        )
        return vgpu_state("validate", "-f", "layouts.yaml", cwd=tmp_path)

    a10 = validate("{A10-4Q: 2, A10-8Q: 1}")
    assert a10.returncode == 1
    assert "vGPUs on one GPU share one framebuffer size" in a10.stderr
    assert "the A10 has no mixed-size mode" in a10.stderr
    l40s = validate("{L40S-24Q: 1, L40S-12Q: 2}")
    assert l40s.returncode == 1
    assert "unless the GPU is in mixed-size mode; add mode: mixed-size to this entry" in (
        l40s.stderr
    )
    mixed = validate("{L40S-24Q: 1, L40S-12Q: 2}", "mixed-size")
    assert mixed.returncode == 0, mixed.stderr
    assert ": note: experimental: inferred, not verified on hardware: mixed-size mode" in (
        mixed.stderr
    )
    assert validate("{A10-4Q: 2, A10-8Q: 1}", "mixed-size").returncode == 1
