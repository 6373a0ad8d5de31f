# ruff: noqa: E501
"""The validate / schema / select commands, shipped configs, and generated files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.config import json_schema_text, load_file

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "schemas" / "vgpu-state-config.schema.json"
# Config documents only: configs/sim/ holds simulator node specs, tested with the simulator.
SHIPPED = sorted(p for p in (REPO / "configs").rglob("*.yaml") if p.parent.name != "sim")


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_shipped_configs_exist() -> None:
    names = {p.relative_to(REPO).as_posix() for p in SHIPPED}
    assert "configs/default.yaml" in names
    assert len(names) >= 6


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_config_is_valid(path: Path) -> None:
    code, out, err = run("validate", "-f", str(path))
    if path.name == "vgpu-device-manager.yaml":
        # vgpu-device-manager's own example lays out MIG-backed types, whose GPU instances
        # vgpu-state derives by an inferred rule: each such entry gets a note saying so.
        lines = err.splitlines()
        assert lines and all(
            ": note: experimental: inferred, not verified on hardware: MIG-backed vGPUs" in x
            for x in lines
        )
        err = ""
    assert (code, err) == (0, ""), err
    assert "valid:" in out
    data = YAML(typ="safe", pure=True).load(path.read_text())
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    first_line = path.read_text().splitlines()[0]
    schema_rel = Path("../" * (len(path.relative_to(REPO).parts) - 1)) / SCHEMA.relative_to(REPO)
    assert first_line == f"# yaml-language-server: $schema={schema_rel.as_posix()}"


def test_vgpu_device_manager_example_has_no_extensions() -> None:
    data = YAML(typ="safe", pure=True).load(
        (REPO / "configs/examples/vgpu-device-manager.yaml").read_text()
    )
    assert set(data) == {"version", "vgpu-configs"}
    for entries in data["vgpu-configs"].values():
        assert isinstance(entries, list)
        for entry in entries:
            assert set(entry) <= {"devices", "device-filter", "vgpu-devices"}
            assert entry["devices"] == "all" or all(isinstance(d, int) for d in entry["devices"])


def test_schema_file_is_current() -> None:
    assert SCHEMA.read_text() == json_schema_text(), (
        "schemas/vgpu-state-config.schema.json is stale: run vgpu-state schema > "
        "schemas/vgpu-state-config.schema.json"
    )


def test_schema_command_prints_schema() -> None:
    code, out, _ = run("schema")
    assert code == 0 and json.loads(out)["title"] == "vgpu-state config"
    assert "description" in json.loads(out)["properties"]["node-selectors"]


def test_default_config_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_default_config.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_default_config_covers_every_model_with_q_types() -> None:
    from vgpu_state.catalog import default_catalog

    doc = load_file(REPO / "configs" / "default.yaml", catalog=CATALOG)
    listed = {name for e in doc.configs["default"].entries for name in e.vgpu_devices}
    for model in default_catalog().models:
        if any(t.series == "Q" and not t.is_mig for t in model.types):
            assert any(model.offers(name) for name in listed), model.name


def test_validate_reports_every_error() -> None:
    text = "version: v2\nvgpu-configs:\n  a:\n    - devices: all\n      vgpu-devices: {A10-4Q: 9}\n"
    code, out, err = run("validate", "-f", "-", stdin=text)
    assert code == 1 and out == ""
    assert err.splitlines() == [
        "<stdin>:1:10: unsupported version 'v2'; expected v1 (version)",
        "<stdin>:5:30: A10-4Q: 9 exceeds 6, the most one A10 holds "
        "(vgpu-configs.a[0].vgpu-devices.A10-4Q)",
    ]


def test_validate_config_name(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: v1\nvgpu-configs:\n  a10:\n    - devices: all\n      vgpu-devices: {A10-4Q: 6}\n"
    )
    assert run("validate", "-f", str(path), "-c", "a10")[0] == 0
    code, _, err = run("validate", "-f", str(path), "-c", "a1O")
    assert code == 1 and err.strip() == f"{path}: config 'a1O' is not defined; did you mean a10?"


def test_validate_missing_file(tmp_path: Path) -> None:
    code, _, err = run("validate", "-f", str(tmp_path / "nope.yaml"))
    assert code == 1 and "cannot read the file" in err


def test_select_shows_choice_and_layout() -> None:
    code, out, err = run(
        "select",
        "-f",
        str(REPO / "configs/examples/node-pools.yaml"),
        "--node",
        "n1",
        "--label",
        "pool=vdi",
        "--gpu",
        "08:00.0=A2",
        "--gpu",
        "09:00.0=A16",
        "--gpu",
        "0000:41:00.0=L40S",
        "--gpu",
        "0000:05:00.0=T4",
    )
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("node n1: config workstations from first matching node-selector")
    assert lines[2].startswith("  GPU 0 0000:05:00.0 T4: unmanaged")
    assert lines[3].startswith("  GPU 1 0000:08:00.0 A2: 4x A2-4Q  [")
    assert lines[4].startswith("  GPU 2 0000:09:00.0 A16: 8x A16-2Q  [")
    assert lines[5].startswith("  GPU 3 0000:41:00.0 L40S: 8x L40S-6Q  [")


def test_select_unknown_label_value() -> None:
    code, _, err = run(
        "select",
        "-f",
        str(REPO / "configs/examples/node-pools.yaml"),
        "--node",
        "n1",
        "--label",
        "nvidia.com/vgpu.config=compte",
    )
    assert code == 1 and "did you mean compute?" in err


def test_select_nothing_selected(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: v1\nvgpu-configs:\n  a:\n    - devices: all\n      vgpu-devices: {}\n"
    )
    code, out, err = run("select", "-f", str(path), "--node", "n1", "--gpu", "08:00.0=A2")
    # No layout for the node is an error (exit 1), saying why none was selected.
    assert code == 1 and "  GPU 0 0000:08:00.0: unmanaged" in out
    assert "error: node n1: no config selected: no label nvidia.com/vgpu.config, " in err
    assert "no node-selector matches and the file has no default" in err
    code, out, err = run(
        "select", "-f", str(path), "--node", "n1", "--gpu", "08:00.0=A2", "-o", "json"
    )
    doc = json.loads(out)
    assert code == 1 and doc["error"]["reason"] == "NoConfigSelected"
    assert doc["config"] is None and doc["gpus"][0]["managed"] is False


def test_select_bad_gpu_model() -> None:
    code, _, err = run(
        "select", "-f", str(REPO / "configs/default.yaml"), "--node", "n1", "--gpu", "08:00.0=A3"
    )
    assert code == 1 and "unknown GPU model 'A3'" in err


def test_config_commands_never_import_kubernetes_or_grpc() -> None:
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from vgpu_state.cli.main import cli\n"
        f"r = CliRunner()\n"
        f"assert r.invoke(cli, ['validate', '-f', {str(REPO / 'configs/default.yaml')!r}]).exit_code == 0\n"
        "assert r.invoke(cli, ['schema']).exit_code == 0\n"
        f"assert r.invoke(cli, ['select', '-f', {str(REPO / 'configs/default.yaml')!r}, "
        "'--node', 'n', '--gpu', '08:00.0=A2']).exit_code == 0\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'grpc'))\n"
        "print(bad)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


REUSED_ANCHOR = (
    "version: v1\nvgpu-configs:\n  a: &x\n    - devices: all\n      vgpu-devices: {A2-4Q: 4}\n"
    "  b: &x\n    - devices: all\n      vgpu-devices: {A2-8Q: 2}\ndefault: a\n"
)


@pytest.mark.parametrize("command", ["validate", "plan", "apply"])
def test_a_reused_anchor_is_a_located_config_error(tmp_path: Path, command: str) -> None:
    """The error names file, line, column and anchor; no library warning, nothing written."""
    config = tmp_path / "c.yaml"
    config.write_text(REUSED_ANCHOR)
    spec = tmp_path / "node.yaml"
    spec.write_text((REPO / "configs" / "sim" / "a2-host.yaml").read_text())
    args = {
        "validate": ["validate", "-f", str(config)],
        "plan": ["plan", "-f", str(config), "--sim", str(spec)],
        "apply": ["apply", "-f", str(config), "--sim", str(spec), "--auto-approve"],
    }[command]
    # Not even the host lock's file: apply reads the config before it takes the lock.
    files = lambda: {p.name: p.read_bytes() for p in tmp_path.iterdir()}  # noqa: E731
    before = files()
    done = subprocess.run(
        [sys.executable, "-c", "from vgpu_state.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == [
        f"{config}:6:6: anchor &x is already defined on line 3, column 6; "
        "give each anchor its own name"
    ]
    assert files() == before
