"""The pre-commit hook (``.pre-commit-hooks.yaml``), run by pre-commit itself, offline.

``pre-commit try-repo`` runs this repository's hook on a git repository that
holds this repository's config files (``configs/default.yaml`` and
``configs/examples/``, under the names the hook picks up by default), as a
user's layouts repository would. The hook is ``language: system``: it runs
the ``vgpu-state`` of this virtualenv, and pre-commit builds nothing (pip is
told there is no index, so a hook that needed one would fail here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIGS = [
    REPO / "configs" / "default.yaml",
    *sorted((REPO / "configs" / "examples").glob("*.yaml")),
]


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _layouts_repo(path: Path) -> Path:
    (path / "layouts").mkdir(parents=True)
    for config in CONFIGS:
        shutil.copy(config, path / "layouts" / config.name)
    _git(path, "init", "-q")
    _git(path, "add", ".")
    return path


def _try_repo(cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRE_COMMIT_HOME": str(home),
        "PIP_NO_INDEX": "1",  # offline: nothing may be installed from an index
        "GIT_CONFIG_GLOBAL": os.devnull,
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(REPO), "vgpu-state-validate",
         "--all-files", "--verbose", "--color", "never"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.fixture
def needs_git() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed (pre-commit needs it)")


def test_the_hook_validates_this_repositorys_configs(needs_git: None, tmp_path: Path) -> None:
    repo = _layouts_repo(tmp_path / "layouts-repo")
    done = _try_repo(repo, tmp_path / "pre-commit-home")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vgpu-state validate" in done.stdout and "Passed" in done.stdout, done.stdout
    # Every config was validated by the command (it prints a line per file).
    for config in CONFIGS:
        assert f"layouts/{config.name}" in done.stdout, done.stdout


def test_the_hook_fails_on_an_invalid_layout_naming_file_line_and_column(
    needs_git: None, tmp_path: Path
) -> None:
    repo = _layouts_repo(tmp_path / "layouts-repo")
    bad = repo / "layouts" / "default.yaml"
    text = bad.read_text()
    assert "vgpu-configs:" in text
    broken = "vgpu-configs:\n  broken: [{devices: all, vgpu-devices: {A2-4Q: many}}]"
    bad.write_text(text.replace("vgpu-configs:", broken, 1))
    _git(repo, "add", ".")
    done = _try_repo(repo, tmp_path / "pre-commit-home")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Failed" in done.stdout
    assert "layouts/default.yaml:" in done.stdout and "many" in done.stdout, done.stdout
    # The other files are still checked and pass.
    assert "layouts/node-pools.yaml" in done.stdout
