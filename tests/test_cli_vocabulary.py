"""One CLI vocabulary: every command spells the shared options the same, shows examples
in its help, and the old spellings keep working with a deprecation warning.

The walk covers every command of ``vgpu-state`` (the COMMANDS table) and every
subcommand of a group, as a user sees them with ``--help``.
"""

from __future__ import annotations

import json
import logging
import os
import pty
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from vgpu_state import __version__
from vgpu_state.cli.main import COMMANDS, cli
from vgpu_state.cli.options import ENV_LOG_LEVEL, LOG_LEVELS, modernise

REPO = Path(__file__).resolve().parent.parent
MIXED = REPO / "configs" / "sim" / "mixed.yaml"
MIXED_LAYOUTS = REPO / "configs" / "examples" / "mixed-node.yaml"

SHARED = {
    # parameter name -> the option strings every command that has it must use
    "config_file": ["-f", "--config"],
    "config_name": ["-c", "--config-name"],
    "sysfs_root": ["--sysfs-root"],
    "output": ["-o", "--output"],
    "log_level": ["--log-level"],
    "sim_spec": ["--sim"],
    "kubeconfig": ["--kubeconfig"],
    "node": ["--node"],
    "label_key": ["--label-key"],
}
OLD_SPELLINGS = {"--file", "--config-file"}
REPORTING = {
    # commands that report: each takes -o text|json
    "validate", "select", "doctor", "scan", "plan", "apply", "assert", "history",
    "fleet plan",
}  # fmt: skip


def every_command() -> Iterator[tuple[str, click.Command]]:
    for name in sorted(COMMANDS):
        command = cli.get_command(click.Context(cli), name)
        assert command is not None
        yield name, command
        if isinstance(command, click.Group):
            for sub in sorted(command.commands):
                yield f"{name} {sub}", command.commands[sub]


def help_of(path: str) -> str:
    result = CliRunner().invoke(cli, [*path.split(), "--help"], prog_name="vgpu-state")
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_spells_the_shared_options_the_same() -> None:
    seen: dict[str, set[str]] = {}
    for path, command in every_command():
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            opts = set(param.opts) | set(param.secondary_opts)
            assert not opts & OLD_SPELLINGS, f"{path}: {sorted(opts)} is an old spelling"
            if param.name in SHARED:
                assert param.opts == SHARED[param.name], f"{path}: {param.name} is {param.opts}"
                seen.setdefault(param.name, set()).add(path)
            # A shared short or long flag never means something else.
            for name, spelled in SHARED.items():
                if param.name != name:
                    assert not opts & set(spelled), f"{path}: {sorted(opts)} means {param.name}"
            if param.name == "sysfs_root":
                assert "default: /sys" in " ".join(help_of(path).split()), path
            if param.name == "output":
                # -o is how a command reports, never a file to write (that is --out).
                assert isinstance(param.type, click.Choice), f"{path}: -o is not a format"
            if param.name == "log_level":
                assert isinstance(param.type, click.Choice)
                assert tuple(param.type.choices) == LOG_LEVELS, path
    # The vocabulary is used, not just allowed.
    assert {"validate", "plan", "apply", "assert", "doctor", "fleet plan"} <= seen["config_file"]
    assert {"validate", "plan", "apply", "assert", "doctor", "export"} <= seen["config_name"]
    assert {"scan", "plan", "export", "deviceplugin", "agent"} <= seen["sysfs_root"]


def test_every_reporting_command_has_text_and_json_output() -> None:
    commands = dict(every_command())
    for path in sorted(REPORTING):
        (output,) = [p for p in commands[path].params if p.name == "output"]
        assert isinstance(output.type, click.Choice), path
        assert {"text", "json"} <= set(output.type.choices), path
        assert output.default == "text", path


def test_every_help_shows_examples() -> None:
    for path, _ in [("", cli), *every_command()]:
        text = help_of(path)
        assert "Examples:" in text, f"vgpu-state {path} --help shows no examples"
        examples = text.split("Examples:", 1)[1]
        assert "vgpu-state" in examples, f"vgpu-state {path}: no command in its examples"


def test_the_global_options_are_on_vgpu_state_itself() -> None:
    text = help_of("")
    for flag in ("--log-level", "--no-color", "--version"):
        assert flag in text


def test_log_level_before_the_command_sets_the_level_of_every_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Recorded as absent, so that the value the command sets is removed afterwards.
    monkeypatch.setenv(ENV_LOG_LEVEL, "info")
    monkeypatch.delenv(ENV_LOG_LEVEL)
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    root.handlers = []
    try:
        with pytest.raises(SystemExit) as exit_:
            cli.main(["--log-level", "error", "schema"], prog_name="vgpu-state")
        assert exit_.value.code == 0
        assert root.level == logging.ERROR
        # The agent and the controller read it as their own --log-level's default.
        assert os.environ[ENV_LOG_LEVEL] == "error"
    finally:
        os.environ.pop(ENV_LOG_LEVEL, None)
        root.handlers = handlers
        root.setLevel(level)  # also clears the loggers' cached levels


def run_in_terminal(args: list[str], cwd: Path) -> str:
    """The command's output as a terminal shows it (colours are only used on one)."""
    parent, child = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpu_state.cli.main", *args],
        stdin=child, stdout=child, stderr=child, cwd=cwd, env=env, close_fds=True,
    )  # fmt: skip
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(parent, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(60)
    os.close(parent)
    return b"".join(chunks).decode(errors="replace")


def test_no_color_turns_the_colours_of_a_terminal_off(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    shutil.copy(MIXED, spec)
    args = ["plan", "-f", str(MIXED_LAYOUTS), "--sim", str(spec)]
    coloured = run_in_terminal(args, tmp_path)
    assert "\x1b[" in coloured, "a plan on a terminal is coloured"
    plain = run_in_terminal(["--no-color", *args], tmp_path)
    assert "\x1b[" not in plain
    assert "Plan:" in plain


def test_shell_completion_scripts_and_completions() -> None:
    exe = shutil.which("vgpu-state", path=str(Path(sys.executable).parent))
    assert exe is not None
    for shell in ("bash", "zsh", "fish"):
        proc = subprocess.run(
            [exe], env={**os.environ, "_VGPU_STATE_COMPLETE": f"{shell}_source"},
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "_VGPU_STATE_COMPLETE" in proc.stdout, shell
    proc = subprocess.run(
        [exe],
        env={**os.environ, "_VGPU_STATE_COMPLETE": "bash_complete",
             "COMP_WORDS": "vgpu-state pl", "COMP_CWORD": "1"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert "plain,plan" in proc.stdout.splitlines()


def test_version_is_the_installed_packages() -> None:
    from importlib.metadata import version

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"vgpu-state, version {__version__}"
    assert __version__ == version("vgpu-state")


# Old spellings ---------------------------------------------------------------------
def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", *args],
        cwd=cwd, capture_output=True, text=True, check=False,
        env={**os.environ, "NO_COLOR": "1", **env},
    )  # fmt: skip


@pytest.fixture
def node(tmp_path: Path) -> Path:
    spec = tmp_path / "node.yaml"
    shutil.copy(MIXED, spec)
    return spec


def test_file_and_config_file_still_work_and_warn(tmp_path: Path, node: Path) -> None:
    new = run(["plan", "-f", str(MIXED_LAYOUTS), "--sim", str(node)], tmp_path)
    assert new.returncode == 0 and "deprecated" not in new.stderr
    for old in ("--config-file", "--file"):
        proc = run(["plan", old, str(MIXED_LAYOUTS), "--sim", str(node)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == new.stdout
        assert f"warning: {old} is deprecated" in proc.stderr
        assert "use -f/--config" in proc.stderr
    proc = run(["validate", f"--file={MIXED_LAYOUTS}"], tmp_path)
    assert proc.returncode == 0 and "valid: 1 config" in proc.stdout
    assert "warning: --file is deprecated" in proc.stderr


def test_config_as_the_old_named_layout_still_works_and_warns(tmp_path: Path, node: Path) -> None:
    """``--config NAME`` with the file given by another flag (or the environment) is the
    named layout, as before; alone it is the file."""
    new = run(["plan", "-f", str(MIXED_LAYOUTS), "-c", "mixed", "--sim", str(node)], tmp_path)
    assert new.returncode == 0, new.stderr
    old = run(
        ["plan", "--config-file", str(MIXED_LAYOUTS), "--config", "mixed", "--sim", str(node)],
        tmp_path,
    )
    assert old.returncode == 0, old.stderr
    assert old.stdout == new.stdout
    assert "--config NAME (the named layout) is deprecated" in old.stderr
    assert "use -c/--config-name NAME" in old.stderr
    env = run(["plan", "--config", "mixed", "--sim", str(node)], tmp_path,
              VGPU_STATE_CONFIG_FILE=str(MIXED_LAYOUTS))  # fmt: skip
    assert env.returncode == 0, env.stderr
    assert env.stdout == new.stdout and "deprecated" in env.stderr
    as_file = run(["plan", "--config", str(MIXED_LAYOUTS), "--sim", str(node)], tmp_path)
    assert as_file.returncode == 0, as_file.stderr
    assert "deprecated" not in as_file.stderr
    missing = run(["validate", "-f", str(MIXED_LAYOUTS), "--config", "nope"], tmp_path)
    assert missing.returncode == 1
    assert "config 'nope' is not defined" in missing.stderr


def test_modernise_leaves_what_follows_a_double_dash() -> None:
    assert modernise(["--file", "a", "--", "--file"], has_config_name=False) == [
        "--config", "a", "--", "--file",
    ]  # fmt: skip
    assert modernise(["-f", "a", "--config=x"], has_config_name=True) == [
        "-f", "a", "--config-name=x",
    ]  # fmt: skip
    assert modernise(["-f", "a", "--config=x"], has_config_name=False) == ["-f", "a", "--config=x"]


# -o json where it was missing ------------------------------------------------------------
def test_validate_select_assert_history_and_apply_report_json(tmp_path: Path, node: Path) -> None:
    valid = json.loads(run(["validate", "-f", str(MIXED_LAYOUTS), "-o", "json"], tmp_path).stdout)
    assert valid["valid"] is True and valid["configs"] == ["mixed"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nvgpu-configs:\n  x:\n    - devices: all\n      vgpu-devices: 3\n")
    proc = run(["validate", "-f", str(bad), "-o", "json"], tmp_path)
    assert proc.returncode == 1
    invalid = json.loads(proc.stdout)
    assert invalid["valid"] is False and invalid["errors"][0].startswith(f"{bad}:")
    chosen = json.loads(
        run(["select", "-f", str(MIXED_LAYOUTS), "--sim", str(node), "-o", "json"], tmp_path).stdout
    )
    assert chosen["config"] == "mixed" and all(g["managed"] for g in chosen["gpus"])
    base = ["-f", str(MIXED_LAYOUTS), "--sim", str(node), "-o", "json"]
    before = run(["assert", *base], tmp_path)
    assert before.returncode == 1 and json.loads(before.stdout)["matches"] is False
    refused = run(["apply", *base], tmp_path)
    assert refused.returncode == 1 and "pass --auto-approve" in refused.stderr
    applied = run(["apply", *base, "--auto-approve"], tmp_path)
    assert applied.returncode == 0, applied.stderr
    result = json.loads(applied.stdout)
    assert result["outcome"] == "complete" and result["done"] == len(result["steps"]) > 0
    after = run(["assert", *base], tmp_path)
    assert after.returncode == 0 and json.loads(after.stdout)["matches"] is True
    again = json.loads(run(["apply", *base, "--auto-approve"], tmp_path).stdout)
    assert again["outcome"] == "no-changes" and again["steps"] == []
    history = json.loads(run(["history", "--sim", str(node), "-o", "json"], tmp_path).stdout)
    assert [a["outcome"] for a in history["applies"]] == ["converged"]
