"""An entry of the selected config that applies to no GPU is an error, never "No changes"."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from vgpu_state.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
SIM = REPO / "configs" / "sim"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


CASES = [
    pytest.param(
        "a2-host.yaml",
        "devices: all\n      vgpu-devices: {T4-8Q: 2}",
        [
            "entry [0] of config 'c' (T4-8Q: 2) applies to no GPU on node a2-node",
            "GPU 0 0000:08:00.0 (A2) does not offer T4-8Q",
            "the node has GPU 0 0000:08:00.0 A2",
        ],
        id="another-models-type",
    ),
    # An index the node lacks is skipped and listed, or an error under --strict
    # (tests/test_vdm_compat.py).
    pytest.param(
        "t4-pair.yaml",
        "devices: all\n      vgpu-devices: {T4-1B: 16}",
        [
            "gpu[0000:3b:00.0] (Tesla T4): the driver does not offer T4-1B",
            "it offers: T4-1Q, T4-2Q,",
        ],
        id="type-the-catalog-and-driver-lack",
    ),
]


@pytest.mark.parametrize(("spec", "entry", "messages"), CASES)
@pytest.mark.parametrize("command", ["plan", "apply", "assert"])
def test_entry_that_lays_out_nothing_is_an_error(
    tmp_path: Path, spec: str, entry: str, messages: list[str], command: str
) -> None:
    node = tmp_path / spec
    shutil.copy(SIM / spec, node)
    config = tmp_path / "c.yaml"
    config.write_text(f"version: v1\nvgpu-configs:\n  c:\n    - {entry}\n")
    before = node.read_text()
    extra = ["--auto-approve"] if command == "apply" else []
    code, out, err = run(command, "-f", str(config), "-c", "c", "--sim", str(node), *extra)
    assert code == 1
    for message in messages:
        assert message in err
    assert "No changes" not in out and "matches" not in out
    assert node.read_text() == before


def test_nvidias_multi_model_file_is_not_a_no_op_error(tmp_path: Path) -> None:
    """Entries for GPUs the node lacks (other device-filters, the A16 entry sharing the A2's
    filter) are not errors: they lay out other kinds of node."""
    node = tmp_path / "a2.yaml"
    shutil.copy(SIM / "a2-host.yaml", node)
    config = REPO / "configs" / "examples" / "vgpu-device-manager.yaml"
    code, out, err = run("plan", "-f", str(config), "-c", "default", "--sim", str(node))
    assert code == 0, err
    assert "A2-2Q" in out
