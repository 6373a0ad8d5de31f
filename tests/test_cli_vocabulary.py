"""One CLI vocabulary: every command spells the shared options the same, shows examples
in its help, reports errors in one JSON document, exits with the documented codes, and
the old spellings keep working with a deprecation warning.

The walk covers every command of ``vgpu-state`` (the COMMANDS table) and every
subcommand of a group, as a user sees them with ``--help``: a new command is checked
without being listed here.
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
from vgpu_state.cli.main import cli
from vgpu_state.cli.options import (
    DEPRECATED_SPELLINGS,
    ENV_LOG_LEVEL,
    LOG_LEVELS,
    SHARED_OPTIONS,
    modernise,
)

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
    def walk(path: str, group: click.Group) -> Iterator[tuple[str, click.Command]]:
        for name in group.list_commands(click.Context(group)):
            command = group.get_command(click.Context(group), name)
            assert command is not None, name
            full = f"{path} {name}".strip()
            yield full, command
            if isinstance(command, click.Group):
                yield from walk(full, command)

    yield from walk("", cli)


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


# The flag table -------------------------------------------------------------------------
SPELLINGS = {flag: row.name for row in SHARED_OPTIONS.values() for flag in row.opts}
"""Every spelling of a shared concept -> its parameter name."""
OTHER_SPELLINGS = {
    # spellings of a concept of the table that no command may use (deprecated ones are
    # hidden options or rewritten before parsing, never shown)
    "--config-dir", "--plugin-dir", "--file", "--config-file", "--journal", "--lock-file",
    "--layouts", "--layout", "--kube-config", "--kube-context", "--sysfs",
    "--node-name", "--output-format", "--format", "--state", "--statedir",
}  # fmt: skip


def default_of(param: click.Parameter) -> object:
    """The default as given (newer click versions mark "none given" with a sentinel;
    click 8.2 gives a flag without a default ``False``)."""
    default = param.default
    if type(default).__name__ == "Sentinel":
        return None
    if isinstance(param, click.Option) and param.is_flag and default is False:
        return None  # an off flag: "not given"
    return default


def test_every_option_of_a_shared_concept_comes_from_the_table() -> None:
    """Every command's option that is a concept of the table is spelled, defaulted and
    read from the environment as the table says; no command spells one otherwise."""
    checked: dict[str, set[str]] = {}
    for path, command in every_command():
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            opts = set(param.opts) | set(param.secondary_opts)
            if param.hidden:
                # An old spelling kept for one release: listed, and warned about.
                assert all(o in DEPRECATED_SPELLINGS for o in opts), f"{path}: {opts}"
                continue
            assert not opts & OTHER_SPELLINGS, f"{path}: {sorted(opts)} is not the table's"
            for flag in opts:
                if flag in SPELLINGS:
                    assert param.name == SPELLINGS[flag], f"{path}: {flag} means {param.name}"
            row = SHARED_OPTIONS.get(param.name or "")
            if row is None:
                continue
            checked.setdefault(row.name, set()).add(path)
            assert param.opts == row.opts, f"{path}: {param.name} is {param.opts}"
            if not (path == "export" and row.name == "output"):  # a layouts file: yaml
                assert default_of(param) == row.default, f"{path}: {param.name} default"
            if row.name == "node" and path == "agent":
                assert param.envvar == "NODE_NAME"  # the downward API's
            else:
                assert param.envvar == row.envvar, f"{path}: {param.name} env {param.envvar}"
    # The table is used, not just allowed.
    for name in ("state_dir", "device_plugin_dir", "context", "kubeconfig", "config_file"):
        assert len(checked[name]) >= 2, (name, checked.get(name))
    assert {"agent", "controller", "plan", "fleet plan"} <= checked["config_file"]
    assert {"agent", "deviceplugin"} <= checked["device_plugin_dir"]
    assert {"agent", "plan", "apply", "assert", "history", "scan"} <= checked["state_dir"]


def test_every_command_with_a_kubeconfig_takes_a_context() -> None:
    for path, command in every_command():
        names = {p.name for p in command.params}
        if "kubeconfig" in names:
            assert "context" in names, f"{path} takes --kubeconfig but not --context"
            (kubeconfig,) = [p for p in command.params if p.name == "kubeconfig"]
            assert "in-cluster, then $KUBECONFIG or ~/.kube/config" in (
                getattr(kubeconfig, "help", "") or ""
            ), f"{path}: another kubeconfig default"


def test_the_deprecated_spellings_table_lists_every_rewrite() -> None:
    text = (REPO / "docs" / "cli.md").read_text()
    for old in DEPRECATED_SPELLINGS:
        assert f"`{old.split()[0]}" in text, f"docs/cli.md does not list {old}"


# One JSON error document, exit codes -------------------------------------------------------
def json_commands() -> dict[str, click.Command]:
    """Every command with ``-o json``."""
    found = {}
    for path, command in every_command():
        for p in command.params:
            if p.name == "output" and "json" in getattr(p.type, "choices", ()):
                found[path] = command
    return found


def assert_error_document(stdout: str, where: str) -> dict[str, object]:
    doc = json.loads(stdout)
    error = doc["error"]
    assert set(error) == {"reason", "kind", "message", "issues"}, (where, error)
    assert isinstance(error["reason"], str) and error["reason"], where
    assert error["kind"] in {"user", "host", "transient", "usage", "internal"}, where
    assert isinstance(error["message"], str) and error["message"], where
    for issue in error["issues"]:
        assert set(issue) == {"file", "line", "column", "path", "message"}, where
    return error


def invoke(args: list[str]) -> click.testing.Result:
    return CliRunner().invoke(cli, args, prog_name="vgpu-state")


def test_a_usage_error_of_every_json_command_is_the_error_document_and_exits_1() -> None:
    commands = json_commands()
    assert {"validate", "select", "scan", "doctor", "plan", "apply", "assert", "history",
            "fleet plan", "export"} <= set(commands)  # fmt: skip
    for path in commands:
        result = invoke([*path.split(), "-o", "json", "--no-such-option"])
        assert result.exit_code == 1, (path, result.output)
        error = assert_error_document(result.stdout, path)
        assert error["reason"] == "UsageError" and error["kind"] == "usage"
        assert "--no-such-option" in str(error["message"])
        assert "No such option" in result.stderr, path


def failing(tmp_path: Path, node: Path) -> dict[str, list[str]]:
    """A failing invocation of each command with ``-o json`` (not a usage error)."""
    missing = str(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nvgpu-configs:\n  x:\n    - devices: all\n      vgpu-devices: 3\n")
    unreadable = tmp_path / "state"
    (unreadable / "journal.jsonl").mkdir(parents=True)  # a directory where the journal is
    base = ["-f", str(MIXED_LAYOUTS), "--sim", str(node)]
    return {
        "validate": ["validate", "-f", str(bad)],
        "select": ["select", "-f", str(bad), "--sim", str(node)],
        "scan": ["scan", "--sim", missing],
        "doctor": ["doctor", "--sim", missing],
        "plan": ["plan", "-f", str(bad), "--sim", str(node)],
        "apply": ["apply", *base, "-c", "nope", "--auto-approve"],
        "assert": ["assert", *base, "-c", "nope"],
        "history": ["history", "--state-dir", str(unreadable)],
        "fleet plan": ["fleet", "plan", "-f", str(MIXED_LAYOUTS), "--from", missing],
        "export": ["export", "--sim", missing],
    }


def test_a_failure_of_every_json_command_is_the_error_document_and_exits_1(
    tmp_path: Path, node: Path
) -> None:
    cases = failing(tmp_path, node)
    assert set(cases) == set(json_commands()), "add a failing invocation of the new command"
    for path, args in cases.items():
        result = invoke([*args, "-o", "json"])
        assert result.exit_code == 1, (path, result.output)
        error = assert_error_document(result.stdout, path)
        assert error["kind"] != "usage", (path, error)
        assert result.stderr.strip(), f"{path}: the error is also on stderr"
    # A config error carries its positions.
    result = invoke([*cases["plan"], "-o", "json"])
    (issue,) = assert_error_document(result.stdout, "plan")["issues"]  # type: ignore[misc]
    assert issue["file"].endswith("bad.yaml") and issue["line"] == 5 and issue["column"] > 0


def test_exit_codes(tmp_path: Path, node: Path) -> None:
    """0 success, 1 error, 1 usage error, 2 changes under --detailed-exitcode."""
    base = ["-f", str(MIXED_LAYOUTS), "--sim", str(node)]
    assert invoke(["plan", *base]).exit_code == 0
    assert invoke(["plan", *base, "--detailed-exitcode"]).exit_code == 2
    assert invoke(["plan", *base, "-c", "nope"]).exit_code == 1
    assert invoke(["plan", *base, "--detailed-exitcode", "--bogus"]).exit_code == 1
    for path, _ in every_command():
        result = invoke([*path.split(), "--no-such-option"])
        assert result.exit_code == 1, (path, result.exit_code)


def test_a_mistyped_command_gets_a_suggestion() -> None:
    for args, hint in (
        (["plna"], "'plan'"),
        (["fleet", "plna"], "'plan'"),
        (["fleet", "snapshto"], "'snapshot'"),
        (["valdiate"], "'validate'"),
        (["sim", "mout"], "'mount'"),
    ):
        result = invoke(args)
        assert result.exit_code == 1, args
        assert f"No such command {args[-1]!r}. Did you mean {hint}?" in result.stderr, args
    far = invoke(["zzzzzz"])
    assert far.exit_code == 1 and "Did you mean" not in far.stderr
    as_json = invoke(["plna", "-o", "json"])
    assert "Did you mean 'plan'?" in str(assert_error_document(as_json.stdout, "plna")["message"])


def test_select_without_a_selected_config_exits_1(tmp_path: Path) -> None:
    layouts = tmp_path / "c.yaml"
    layouts.write_text(
        "version: v1\nvgpu-configs:\n  a:\n    - devices: all\n      vgpu-devices: {}\n"
    )
    args = ["select", "-f", str(layouts), "--node", "n1", "--gpu", "08:00.0=A2"]
    text = invoke(args)
    assert text.exit_code == 1 and "no config selected" in text.stderr
    assert "no node-selector matches and the file has no default" in text.stderr
    as_json = invoke([*args, "-o", "json"])
    assert as_json.exit_code == 1
    assert assert_error_document(as_json.stdout, "select")["reason"] == "NoConfigSelected"


# The old spellings of the flag table -------------------------------------------------------
def test_old_directory_spellings_still_work_and_warn(tmp_path: Path, node: Path) -> None:
    assert modernise(["--config-dir", "/etc/vgpu-state"], has_config_name=False) == [
        "--config", "/etc/vgpu-state/config.yaml",
    ]  # fmt: skip
    assert modernise(["--plugin-dir=/x"], has_config_name=False) == ["--device-plugin-dir=/x"]
    state = tmp_path / "state"
    new = run(["apply", "-f", str(MIXED_LAYOUTS), "--sim", str(node), "--auto-approve",
               "--state-dir", str(state)], tmp_path)  # fmt: skip
    assert new.returncode == 0, new.stderr
    assert (state / "journal.jsonl").exists() and "deprecated" not in new.stderr
    old = run(["history", "--journal", str(state / "journal.jsonl"), "-o", "json"], tmp_path)
    assert old.returncode == 0, old.stderr
    assert "warning: --journal is deprecated" in old.stderr and "use --state-dir DIR" in old.stderr
    assert len(json.loads(old.stdout)["applies"]) == 1
    lock = run(["plan", "-f", str(MIXED_LAYOUTS), "--sim", str(node), "--lock-file", "x"],
               tmp_path)  # fmt: skip
    # click 8.2 says "No such option: --lock-file", later ones "No such option '--lock-file'".
    assert lock.returncode == 1 and "No such option" in lock.stderr, "apply's only"
    assert "--lock-file" in lock.stderr
    help_text = help_of("apply")
    assert "--journal" not in help_text and "--lock-file" not in help_text
