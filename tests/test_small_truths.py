"""Small truths of the text output: type lists by size then name, "-" for what sysfs lacks."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from tests.builders import build_gpu, build_snapshot
from vgpu_state.catalog import type_sort_key
from vgpu_state.cli.scan import print_snapshot


@pytest.mark.parametrize(
    ("names", "ordered"),
    [
        (["L40S-12A", "L40S-1A", "L40S-2A"], ["L40S-1A", "L40S-2A", "L40S-12A"]),
        (["L40S-1Q", "L40S-1A", "L40S-1B"], ["L40S-1A", "L40S-1B", "L40S-1Q"]),
        (["M60-1Q", "M60-0Q"], ["M60-0Q", "M60-1Q"]),
        (["T4-2B4", "T4-16Q", "T4-1Q"], ["T4-1Q", "T4-16Q", "T4-2B4"]),  # unparsable last
    ],
)
def test_types_sort_by_framebuffer_then_name(names: list[str], ordered: list[str]) -> None:
    assert sorted(names, key=type_sort_key) == ordered


def test_scan_lists_creatable_types_by_size_then_name(tmp_path: Path) -> None:
    from vgpu_state.sim.node import open_sim

    spec = tmp_path / "node.yaml"
    spec.write_text(
        "node: n\ndriver: {flavour: graphics}\ngpus:\n"
        '  - {address: "0000:26:00.0", model: L40S, layout: vendor-vfio}\n'
    )
    node = open_sim(str(spec))
    try:
        snapshot = node.host.scan()
    finally:
        node.close()
    out = io.StringIO()
    print_snapshot(snapshot, Console(file=out, width=1000))
    line = next(x for x in out.getvalue().splitlines() if "still fits" in x)
    names = [part.split(" ×")[0].strip() for part in line.split("│")[2].split(",")]
    assert names[:4] == ["L40S-1A", "L40S-1B", "L40S-1Q", "L40S-2A"]
    assert names.index("L40S-8Q") < names.index("L40S-12A") < names.index("L40S-48Q")


def test_missing_numa_node_and_iommu_group_print_as_a_dash() -> None:
    gpu = build_gpu("0000:08:00.0", "A2")
    assert gpu.iommu_group is None and gpu.numa_node is None
    out = io.StringIO()
    print_snapshot(build_snapshot(gpu), Console(file=out, width=200))
    row = next(x for x in out.getvalue().splitlines() if "NUMA / IOMMU" in x)
    assert "- / -" in row
    assert "None" not in out.getvalue()


@pytest.mark.parametrize(
    ("model", "layout", "types"),
    [
        ("L40S", "vendor-vfio", "{L40S-12C: 2}"),
        ("A2", "mdev", "{A2-4Q: 2}"),
    ],
)
def test_a_create_that_waits_for_sriov_is_addressed_by_vf_and_its_saved_plan_applies(
    tmp_path: Path, model: str, layout: str, types: str
) -> None:
    from click.testing import CliRunner

    from vgpu_state.cli.main import cli

    spec = tmp_path / "node.yaml"
    spec.write_text(
        f'node: n\ngpus:\n  - {{address: "0000:26:00.0", model: {model}, layout: {layout}, '
        "sriov: false}\n"
    )
    config = tmp_path / "c.yaml"
    config.write_text(
        f"version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {types}\n"
    )
    saved = tmp_path / "plan.json"
    runner = CliRunner()
    r = runner.invoke(
        cli, ["plan", "-f", str(config), "-c", "c", "--sim", str(spec), "--out", str(saved)]
    )
    assert r.exit_code == 0, r.output
    assert "+ gpu[0000:26:00.0].vf[new 1] will be created" in r.stdout
    assert "+ gpu[0000:26:00.0].vf[new 2] will be created" in r.stdout
    assert ".vgpu[" not in r.stdout
    r = runner.invoke(cli, ["apply", str(saved)])
    assert r.exit_code == 0, r.output
    assert "Apply complete: 3 done" in r.stdout
