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
            "Plan: 0 to create, 0 to destroy, 11 blocked (1 GPU waiting to switch).",
            [
                "in use by vm default/win-1",
                "# switch deferred: waits for vm default/win-1; 2 free vGPUs kept; "
                "8 to create then",
                "A2-4Q kept (destroy deferred)",
                "nvidia.com/NVIDIA_A2-2Q  0 → 0  [8 more wanted, not created: switch "
                "deferred, waits for vm default/win-1]",
                "nvidia.com/NVIDIA_A2-4Q  3 → 3  [1 held]",
                "Disruption: none (nothing is destroyed)",
            ],
            ["will be destroyed", "will be created"],
            id="held-vgpu-defers-the-switch-free-ones-kept",
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
        # The held vGPU is named with its holder; the two free ones stay, since the
        # A2-2Q they would make room for cannot be created while it is there.
        lines = out.splitlines()
        assert sum(line.endswith("A2-4Q cannot be destroyed") for line in lines) == 1
        assert sum(line.endswith("A2-4Q kept (destroy deferred)") for line in lines) == 2
