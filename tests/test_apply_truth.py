"""No false success: an apply reports "complete", exits 0 and journals "converged" only
when a fresh scan shows the selected layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from vgpu_state.cli.main import cli

L40S_SRIOV_OFF = """\
node: l40s-node
driver:
  flavour: {flavour}
  extra-types:
    - {{name: L40S-5Q, id: 2301, framebuffer-mib: 5120, max-instances: 9}}
gpus:
  - address: "0000:26:00.0"
    model: L40S
    layout: vendor-vfio
    sriov: false
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def plan_ends(journal: Path) -> list[dict[str, object]]:
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    return [r for r in records if r.get("event") == "plan-end"]


@pytest.mark.parametrize(
    ("flavour", "types", "why", "missing"),
    [
        pytest.param(
            "graphics",
            "{L40S-12C: 2}",
            "the driver does not offer L40S-12C",
            "2 × L40S-12C missing (want 2, have 0)",
            id="type-the-driver-turns-out-not-to-offer",
        ),
        pytest.param(
            "all",
            "{L40S-5Q: 12}",
            "12 × L40S-5Q requested but one GPU holds at most 9",
            "12 × L40S-5Q missing (want 12, have 0)",
            id="more-than-the-driver-allows",
        ),
    ],
)
def test_creates_that_cannot_happen_after_sriov_comes_up_fail_the_apply(
    tmp_path: Path, flavour: str, types: str, why: str, missing: str
) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(L40S_SRIOV_OFF.format(flavour=flavour))
    config = tmp_path / "c.yaml"
    config.write_text(
        f"version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {types}\n"
    )
    args = ["-f", str(config), "-c", "c", "--sim", str(spec)]
    code, out, err = run("plan", *args)
    assert code == 0 and "1 SR-IOV to enable" in out  # nothing can tell before SR-IOV is on

    code, out, err = run("apply", *args, "--auto-approve")
    assert code == 1
    assert "Apply complete" not in out
    assert "Apply incomplete: 1 done" in out
    assert 'error: the node does not match configuration "c":' in err
    assert why in err
    assert f"gpu[0000:26:00.0]: {missing}" in err
    assert "Traceback" not in err

    journal = spec.with_name(spec.name + ".journal.jsonl")
    (end,) = plan_ends(journal)
    assert end["outcome"] == "partial"
    assert any(missing in str(line) for line in end["differences"])  # type: ignore[attr-defined]
    code, out, _ = run("history", "--sim", str(spec))
    assert "partial: 1 done" in out and "converged" not in out

    code, out, err = run("assert", *args)  # now SR-IOV is on, the driver's lists decide
    assert code == 1
    assert "matches" not in out
    assert why in err


def test_apply_that_reaches_the_layout_says_complete_and_journals_converged(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text(L40S_SRIOV_OFF.format(flavour="all"))
    config = tmp_path / "c.yaml"
    config.write_text(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {L40S-5Q: 3}\n"
    )
    code, out, err = run(
        "apply", "-f", str(config), "-c", "c", "--sim", str(spec), "--auto-approve"
    )
    assert code == 0, err
    assert "Apply complete: 4 done, 0 already done, 0 blocked" in out
    journal = spec.with_name(spec.name + ".journal.jsonl")
    (end,) = plan_ends(journal)
    assert end["outcome"] == "converged"
    assert "differences" not in end
