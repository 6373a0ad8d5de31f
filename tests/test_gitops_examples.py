"""The CI examples of ``docs/gitops.md`` (``examples/gitops/``): valid YAML that yamllint
accepts, jobs that validate, snapshot, plan offline and post the comment, and every
``vgpu-state`` command in them accepted by this version's command line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML
from yamllint import linter
from yamllint.config import YamlLintConfig

from vgpu_state.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "gitops"
GITHUB = EXAMPLES / "github-actions.yml"
GITLAB = EXAMPLES / "gitlab-ci.yml"
LINT = YamlLintConfig(
    """\
extends: default
rules:
  line-length: {max: 100}
  document-start: disable
  truthy: {check-keys: false}
  comments: {min-spaces-from-content: 2}
"""
)


def _load(path: Path) -> Any:
    return YAML(typ="safe", pure=True).load(path.read_text())


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.y*ml")), ids=lambda p: p.name)
def test_every_example_passes_yamllint(path: Path) -> None:
    problems = [
        f"{path.name}:{p.line}:{p.column}: {p.message} ({p.rule})"
        for p in linter.run(path.read_text(), LINT)
    ]
    assert problems == []


def _commands(scripts: list[str]) -> list[list[str]]:
    """Each ``vgpu-state …`` command of the shell scripts, as arguments."""
    found = []
    for script in scripts:
        text = re.sub(r"\\\n\s*", " ", script)  # continued lines
        for line in text.splitlines():
            line = line.split(" > ")[0].split(" || ")[0].strip()
            if line.startswith("vgpu-state "):
                found.append(shlex.split(line)[1:])
    return found


def _github_scripts() -> list[str]:
    workflow = _load(GITHUB)
    steps = workflow["jobs"]["plan"]["steps"]
    return [s["run"] for s in steps if "run" in s]


def _gitlab_scripts() -> list[str]:
    job = _load(GITLAB)["vgpu-state-plan"]
    return [str(line) for line in job["script"]]


@pytest.mark.parametrize("scripts", [_github_scripts, _gitlab_scripts], ids=["github", "gitlab"])
def test_the_job_validates_snapshots_plans_offline_and_posts_markdown(scripts: Any) -> None:
    commands = _commands(scripts())
    verbs = [c[:2] if c[0] == "fleet" else c[:1] for c in commands]
    assert verbs == [["validate"], ["fleet", "snapshot"], ["fleet", "plan"]], commands
    plan = commands[2]
    assert "--from" in plan and plan[plan.index("-o") + 1] == "markdown"
    assert plan[plan.index("--from") + 1] == commands[1][commands[1].index("--out") + 1]
    assert "--detailed-exitcode" in plan
    posted = "\n".join(scripts())
    assert "plan.md" in posted and ("gh pr comment" in posted or "/notes" in posted)


@pytest.mark.parametrize("scripts", [_github_scripts, _gitlab_scripts], ids=["github", "gitlab"])
def test_every_command_is_one_this_version_accepts(scripts: Any) -> None:
    for args in _commands(scripts()):
        # --help after the arguments: an unknown option or command is still an error.
        done = CliRunner().invoke(cli, [*args, "--help"])
        assert done.exit_code == 0, (args, done.output)
        plan = args[:2] == ["fleet", "plan"]
        if plan:
            assert "markdown" in done.output


def test_github_posts_only_with_permission_and_keeps_secrets_out_of_the_log() -> None:
    workflow = _load(GITHUB)
    assert workflow["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert list(workflow["on"]) == ["pull_request"]
    steps = workflow["jobs"]["plan"]["steps"]
    snapshot = next(s for s in steps if "fleet snapshot" in s.get("run", ""))
    assert "secrets." in snapshot["env"]["FLEET_KUBECONFIG"]
    assert "secrets." not in snapshot["run"]  # passed through the environment, not inline
