"""``vgpu-state apply|assert|export|history`` on simulated nodes (spec copies in tmp)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from vgpu_state.cli.main import cli
from vgpu_state.sim.host import SimHost
from vgpu_state.sim.node import held_vgpus

SIM = Path(__file__).resolve().parent.parent / "configs" / "sim"
A2_LAYOUT = """\
version: v1
policy: {prune: true}
vgpu-configs:
  a2-4g:
    - devices: all
      vgpu-devices: {A2-4Q: 3, A2-4C: 1}
  a2-only-4q:
    - devices: all
      vgpu-devices: {A2-4Q: 4}
"""


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the captured A2 host and a layout for it."""
    spec = tmp_path / "a2.yaml"
    shutil.copy(SIM / "a2-host.yaml", spec)
    layout = tmp_path / "layout.yaml"
    layout.write_text(A2_LAYOUT)
    return spec, layout


def test_apply_needs_auto_approve_without_a_terminal(node: tuple[Path, Path]) -> None:
    spec, layout = node
    before = spec.read_text()
    r = run("apply", "-f", str(layout), "--sim", str(spec))
    assert r.exit_code == 1
    assert "no terminal; pass --auto-approve" in r.stderr
    assert spec.read_text() == before


def test_apply_converges_then_assert_and_history(node: tuple[Path, Path]) -> None:
    spec, layout = node
    assert run("assert", "-f", str(layout), "--sim", str(spec)).exit_code == 1
    r = run("apply", "-f", str(layout), "--sim", str(spec), "--auto-approve")
    assert r.exit_code == 0, r.output
    assert "Apply complete: 3 done, 0 already done, 0 blocked" in r.output
    ok = run("assert", "-f", str(layout), "--sim", str(spec))
    assert ok.exit_code == 0 and 'matches configuration "a2-4g"' in ok.output
    assert "No changes" in run("plan", "-f", str(layout), "--sim", str(spec)).output
    history = run("history", "--sim", str(spec), "-v")
    assert "node a2-node  config 'a2-4g' (label)  converged: 3 done" in history.output
    assert history.output.count("ok       ") == 3


def test_blocked_items_refuse_without_skip_blocked(node: tuple[Path, Path]) -> None:
    spec, layout = node
    before = spec.read_text()
    args = ["apply", "-f", str(layout), "-c", "a2-only-4q", "--sim", str(spec), "--auto-approve"]
    r = run(*args)
    assert r.exit_code == 1
    assert "2 item(s) are blocked; nothing was changed" in r.stderr
    assert spec.read_text() == before
    partial = run(*args, "--skip-blocked")
    # The held vGPU stays, so the node does not match: never "Apply complete".
    assert "Apply incomplete" in partial.output and "2 blocked" in partial.output
    assert "Apply complete" not in partial.output
    assert 'the node does not match configuration "a2-only-4q"' in partial.stderr
    assert "1 × A2-4Q missing (want 4, have 3)" in partial.stderr
    assert partial.exit_code == 1  # the node did not fully converge
    with SimHost(spec) as host:
        assert "f715f63c-0d00-4007-9c5a-b07b0c6c05de" in held_vgpus(host)


def test_stale_saved_plan_is_refused_and_names_what_moved(
    node: tuple[Path, Path], tmp_path: Path
) -> None:
    spec, layout = node
    saved = tmp_path / "plan.json"
    r = run("plan", "-f", str(layout), "--sim", str(spec), "--out", str(saved))
    assert r.exit_code == 0 and saved.exists()
    with SimHost(spec) as host:  # someone removes a vGPU after the plan was made
        host.remove_mdev("c728e022-f16f-434b-ad2c-9665ee634d3d")
        host.save()
    before = spec.read_text()
    stale = run("apply", str(saved))
    assert stale.exit_code == 1
    assert "saved plan is stale" in stale.stderr
    assert "c728e022-f16f-434b-ad2c-9665ee634d3d (A2-4Q) disappeared" in stale.stderr
    assert spec.read_text() == before


def test_fresh_saved_plan_applies_exactly(node: tuple[Path, Path], tmp_path: Path) -> None:
    spec, layout = node
    saved = tmp_path / "plan.json"
    run("plan", "-f", str(layout), "--sim", str(spec), "--out", str(saved))
    r = run("apply", str(saved))
    assert r.exit_code == 0 and "Apply complete: 3 done" in r.output
    assert run("assert", "-f", str(layout), "--sim", str(spec)).exit_code == 0


def test_export_then_plan_has_no_changes_for_every_example(
    sim_spec_paths: list[Path], tmp_path: Path
) -> None:
    """export > f.yaml; plan -f f.yaml says "No changes" with no -c; validate accepts f."""
    for path in sim_spec_paths:
        exported = run("export", "--sim", str(path))
        assert exported.exit_code == 0, path.name
        config = tmp_path / f"{path.stem}-current.yaml"
        config.write_text(exported.stdout)
        assert run("validate", "-f", str(config)).exit_code == 0, exported.stdout
        p = run("plan", "-f", str(config), "--sim", str(path))
        assert p.exit_code == 0, p.output
        assert "No changes" in p.output, f"{path.name}:\n{exported.stdout}\n{p.output}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param("node: empty\ngpus: []\n", "the node has no NVIDIA GPUs", id="no-gpus"),
        pytest.param(
            'node: n\ngpus:\n  - {address: "0000:08:00.0", model: A2, driver: vfio-pci}\n',
            "the node has no GPU with a vGPU manager",
            id="no-vgpu-manager",
        ),
    ],
)
def test_export_with_nothing_to_export_says_so(tmp_path: Path, spec: str, message: str) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(spec)
    r = run("export", "--sim", str(path))
    assert r.exit_code == 1
    assert r.stdout == ""
    assert f"nothing to export: {message}" in r.stderr


def test_export_names_the_config_current_on_an_unlabelled_node(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text('node: n\ngpus:\n  - {address: "0000:08:00.0", model: A2}\n')
    r = run("export", "--sim", str(path))
    assert r.exit_code == 0
    assert "default: current\n" in r.stdout
    config = tmp_path / "f.yaml"
    config.write_text(r.stdout)
    p = run("plan", "-f", str(config), "--sim", str(path))
    assert 'No changes. The node matches configuration "current".' in p.output


def test_second_apply_waits_for_the_lock_then_names_the_holder(
    node: tuple[Path, Path], tmp_path: Path
) -> None:
    spec, layout = node
    spec.write_text(spec.read_text() + "faults:\n  - {op: any, delay-ms: 1500}\n")
    lock = tmp_path / "apply.lock"
    common = ["-f", str(layout), "--sim", str(spec), "--auto-approve", "--state-dir", str(tmp_path)]
    first = subprocess.Popen(
        [sys.executable, "-m", "vgpu_state.cli.main", "apply", *common],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not (lock.exists() and lock.read_text()):
            assert first.poll() is None
            time.sleep(0.01)
        r = run("apply", *common, "--lock-timeout", "0.3")
        assert r.exit_code == 1
        assert f"is held by pid {first.pid}" in r.stderr and "(apply: " in r.stderr
        assert "held for " in r.stderr and "waiting up to 0.3 s" in r.stderr
        assert "waited 0.3 s" in r.stderr
    finally:
        first.kill()
        first.wait()
