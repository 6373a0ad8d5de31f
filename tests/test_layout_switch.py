"""Switching a node's layout converges in one apply: the layout is the whole desired state."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from vgpu_state.cli.main import cli

A2_THREE_4G = """\
node: a2-node
gpus:
  - address: "0000:08:00.0"
    model: A2
    vgpus:
      - {{type: A2-4Q, vf: 0{held}}}
      - {{type: A2-4Q, vf: 1}}
      - {{type: A2-4Q, vf: 2}}
"""

CONFIG = """\
version: v1
{policy}vgpu-configs:
  a2-4g:
    - devices: all
      vgpu-devices: {{A2-4Q: 3}}
  a2-2g:
    - devices: all
      vgpu-devices: {{A2-2Q: 8}}
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("held", "policy", "summary", "present", "absent"),
    [
        pytest.param(
            "",
            "",
            "Plan: 8 to create, 3 to destroy, 0 blocked.",
            ["will be destroyed", "will be created"],
            ["cannot proceed", "in use by"],
            id="free-node-switches-by-default",
        ),
        pytest.param(
            ', in-use: "vm default/win-1"',
            "",
            "Plan: 0 to create, 2 to destroy, 9 blocked.",
            ["in use by vm default/win-1", "will be destroyed"],
            [],
            id="held-vgpu-blocked-free-ones-destroyed",
        ),
        pytest.param(
            "",
            "policy: {prune: false}\n",
            "Plan: 0 to create, 0 to destroy, 11 blocked.",
            ["policy prune is false"],
            ["will be destroyed"],
            id="prune-false-is-additive",
        ),
    ],
)
def test_switching_a2_from_4g_to_2g(
    tmp_path: Path, held: str, policy: str, summary: str, present: list[str], absent: list[str]
) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(A2_THREE_4G.format(held=held))
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.format(policy=policy))
    code, out, err = run("plan", "-f", str(config), "-c", "a2-2g", "--sim", str(spec))
    assert code == 0, err
    assert out.rstrip().splitlines()[-1] == summary
    for text in present:
        assert text in out
    for text in absent:
        assert text not in out
    if held:
        # The held vGPU is named with its holder; the two free ones go.
        lines = out.splitlines()
        destroyed = {
            lines[i + 1].split("parent: ")[1]
            for i, line in enumerate(lines)
            if line.endswith("will be destroyed")
        }
        assert destroyed == {"0000:08:00.5", "0000:08:00.6"}  # VF 0 (08:00.4) is held
        assert any(line.endswith("A2-4Q cannot be destroyed") for line in lines)
