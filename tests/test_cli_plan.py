"""`vgpu-state plan` as an operator runs it against a simulated node."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from vgpu_state.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "examples" / "mixed-node.yaml"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    spec = tmp_path / "node.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", spec)
    return spec


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_plan_prints_the_minimal_diff_with_legend_and_summary(node: Path) -> None:
    code, out, _ = run("plan", "-f", str(CONFIG), "--sim", str(node))
    assert code == 0
    assert 'Node gpu-node-1: configuration "mixed" (selected by node label)' in out
    assert "  + create\n  - destroy\n" in out
    assert "  ~ " not in out.split("vgpu-state will perform")[0]  # only symbols that occur
    assert "# gpu[0000:08:00.0] A2 (index 0, mdev): 2 vGPU(s) unchanged" in out
    assert "- gpu[0000:3b:00.0].vgpu[9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80] will be destroyed" in out
    assert out.rstrip().endswith("Plan: 8 to create, 1 to destroy, 0 blocked.")
    assert "\x1b[" not in out  # no colour when stdout is not a terminal


def test_detailed_exitcode(node: Path, tmp_path: Path) -> None:
    code, _, _ = run("plan", "-f", str(CONFIG), "--sim", str(node), "--detailed-exitcode")
    assert code == 2
    exported = tmp_path / "current.yaml"
    code, out, _ = run("export", "--sim", str(node))
    exported.write_text(out)
    args = ["plan", "-f", str(exported), "--sim", str(node)]
    code, out, _ = run(*args, "--detailed-exitcode")
    assert (code, out.strip().splitlines()[-1]) == (
        0,
        'No changes. The node matches configuration "mixed".',  # the node's config label
    )
    assert run(*args)[0] == 0


def test_json_output_follows_the_schema(node: Path) -> None:
    code, out, _ = run("plan", "-f", str(CONFIG), "--sim", str(node), "-o", "json")
    assert code == 0
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads((REPO / "schemas" / "plan.schema.json").read_text()))
    assert doc["format_version"] == "1.6"
    assert doc["selection"] == {"config": "mixed", "source": "label"}
    assert doc["summary"] == {
        "blocked": 0,
        "cluster": 0,
        "create": 8,
        "destroy": 1,
        "kept": 3,
        "sriov": 0,
        "switches_deferred": 0,
    }
    assert doc["snapshot_fingerprint"].startswith("sha256:")


def test_two_saved_runs_are_identical(node: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for out in (first, second):
        code, text, _ = run("plan", "-f", str(CONFIG), "--sim", str(node), "--out", str(out))
        assert code == 0 and f"vgpu-state apply {out}" in text
    assert first.read_bytes() == second.read_bytes()


def test_held_vgpu_blocks_with_its_holder(node: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.read_text().replace("A2-4C: 1\n        A2-4Q: 3", "A2-8Q: 2"))
    code, out, _ = run("plan", "-f", str(config), "--sim", str(node), "--detailed-exitcode")
    assert code == 2
    assert "A2-4C cannot be destroyed\n      in use by vm default/win-1" in out
    assert "2 × A2-8Q cannot be created" in out


def test_in_use_flags_add_holders(node: Path) -> None:
    code, out, _ = run(
        "plan",
        "-f",
        str(CONFIG),
        "--sim",
        str(node),
        "--in-use",
        "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80=pod ml/trainer-0",
    )
    assert code == 0
    assert "in use by pod ml/trainer-0" in out
    assert "4 × T4-4Q cannot be created" in out


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("T4-4Q: 4", "T4-4Q: 17"),
            "c.yaml:20:16: T4-4Q: 17 exceeds 4, the most one T4 holds "
            "(vgpu-configs.mixed[1].vgpu-devices.T4-4Q)",
        ),
        (
            ("A2-4Q: 3", "A2-4Q: 4"),
            "c.yaml:15:9: 5 vGPUs of 4096 MiB exceed 4, the most one A2 holds",
        ),
    ],
)
def test_layout_that_cannot_fit_is_an_error(
    node: Path, tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.read_text().replace(*edit))
    code, out, err = run("plan", "-f", str(config), "--sim", str(node))
    assert code == 1
    assert message in err
    assert "Traceback" not in err + out


def test_no_config_selected_is_an_error(node: Path, tmp_path: Path) -> None:
    text = node.read_text().replace("nvidia.com/vgpu.config: mixed", "pool: none")
    node.write_text(text)
    code, _, err = run("plan", "-f", str(CONFIG), "--sim", str(node))
    assert code == 1
    assert "no config selected for node gpu-node-1" in err


def test_label_naming_an_unknown_config_suggests(node: Path) -> None:
    code, _, err = run(
        "plan", "-f", str(CONFIG), "--sim", str(node), "--label", "nvidia.com/vgpu.config=mixd"
    )
    assert code == 1
    assert "did you mean mixed?" in err


def test_bad_config_reports_position(node: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.read_text().replace("T4-4Q: 4", "T4-4X: 4"))
    code, _, err = run("plan", "-f", str(config), "--sim", str(node))
    assert code == 1
    assert err.startswith(f"{config}:20:9: ")


def test_plan_and_scan_never_import_kubernetes_or_grpc(node: Path) -> None:
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from vgpu_state.cli.main import cli\n"
        "r = CliRunner()\n"
        f"args = ['plan', '-f', {str(CONFIG)!r}, '--sim', {str(node)!r}]\n"
        "assert r.invoke(cli, args).exit_code == 0\n"
        f"assert r.invoke(cli, ['scan', '--sim', {str(node)!r}]).exit_code == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'grpc')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_config_from_stdin(node: Path) -> None:
    result = CliRunner().invoke(
        cli, ["plan", "-f", "-", "--sim", str(node)], input=CONFIG.read_text()
    )
    assert result.exit_code == 0
    assert result.stdout.rstrip().endswith("Plan: 8 to create, 1 to destroy, 0 blocked.")


def test_select_takes_node_labels_and_gpus_from_the_simulator(node: Path) -> None:
    code, out, _ = run("select", "-f", str(CONFIG), "--sim", str(node))
    assert code == 0
    assert out.splitlines()[0] == (
        "node gpu-node-1: config mixed from node label nvidia.com/vgpu.config=mixed"
    )
    assert "  GPU 1 0000:3b:00.0 T4: 4x T4-4Q  [" in out


def test_plan_and_assert_report_an_unfinished_apply(node: Path) -> None:
    from vgpu_state.statefiles import Journal

    journal = Journal(node.with_name(node.name + ".journal.jsonl"))
    journal.append(
        {"event": "plan-start", "plan_id": "dead", "node": "gpu-node-1", "config": "mixed",
         "actions": 9}
    )  # fmt: skip
    journal.close()
    for command in ("plan", "assert"):
        result = CliRunner().invoke(cli, [command, "-f", str(CONFIG), "--sim", str(node)])
        assert "warning: plan dead (config 'mixed'" in result.stderr
        assert "did not finish: 0 of 9 steps done" in result.stderr
