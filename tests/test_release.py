"""What a release publishes carries one version string (docs/release.md).

pyproject.toml's ``version`` is the package's and ``vgpu-state --version``'s, the image
tag, the Helm chart's version and appVersion, deploy/'s image tag and the version in
the docs' install commands (scripts/set_version.py lists them). The release workflow
(.github/workflows/release.yml) publishes from a tag v<version> only, and checks what it
built with scripts/release_check.py, as ``make release-check`` does here.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from scripts import release_check, set_version
from vgpu_state.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PYPROJECT_VERSION = PYPROJECT["project"]["version"]


def test_every_place_spells_pyprojects_version() -> None:
    found = set_version.places()
    where = {str(p.path.relative_to(REPO)) for p in found}
    assert {
        "pyproject.toml",
        "deploy/helm/vgpu-state/Chart.yaml",
        "deploy/kustomization.yaml",
        "docs/release.md",
        "docs/gitops.md",
    } <= where
    assert len([p for p in found if p.path.name == "Chart.yaml"]) == 2  # version, appVersion
    assert [str(p) for p in found if p.version != PYPROJECT_VERSION] == [], (
        f"python3 scripts/set_version.py {PYPROJECT_VERSION}"
    )


def test_the_command_the_image_tag_and_the_installed_package_say_the_same() -> None:
    tag = subprocess.run(
        ["sh", str(REPO / "scripts" / "version")], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert tag == PYPROJECT_VERSION
    assert installed_version("vgpu-state") == PYPROJECT_VERSION, (
        "the installed package is older than pyproject.toml: reinstall it "
        "(make .venv/bin/.installed-test)"
    )
    result = CliRunner().invoke(cli, ["--version"])
    assert result.output.strip() == f"vgpu-state, version {PYPROJECT_VERSION}"


def test_scripts_version_needs_no_git(tmp_path: Path) -> None:
    """A source tarball: no .git, the same version."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "version", tmp_path / "scripts" / "version")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    proc = subprocess.run(
        ["sh", "scripts/version"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == PYPROJECT_VERSION


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the files that spell the version."""
    for name in ("pyproject.toml", "README.md", "deploy/kustomization.yaml",
                 "deploy/helm/vgpu-state/Chart.yaml"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    return tmp_path


@pytest.mark.parametrize(
    ("path", "old", "new"),
    [
        ("deploy/helm/vgpu-state/Chart.yaml", 'appVersion: "{v}"', 'appVersion: "9.9.9"'),
        ("deploy/helm/vgpu-state/Chart.yaml", "\nversion: {v}\n", "\nversion: 9.9.9\n"),
        ("deploy/kustomization.yaml", 'newTag: "{v}"', 'newTag: "9.9.9"'),
        ("docs/release.md", "charts/vgpu-state --version {v}", "charts/vgpu-state --version 9.9.9"),
        ("pyproject.toml", 'version = "{v}"', 'version = "9.9.9"'),
    ],
)
def test_a_place_that_differs_is_named_and_set_version_mends_it(
    tree: Path, path: str, old: str, new: str
) -> None:
    file = tree / path
    text = file.read_text(encoding="utf-8")
    assert old.format(v=PYPROJECT_VERSION) in text
    file.write_text(text.replace(old.format(v=PYPROJECT_VERSION), new, 1), encoding="utf-8")
    bad = set_version.differing(tree)
    assert bad, f"a changed {path} went unnoticed"
    if path == "pyproject.toml":  # the source moved: every other place differs
        assert all(p.version == PYPROJECT_VERSION for p in bad) and len(bad) > 4
    else:
        assert [(p.path, p.version) for p in bad] == [(file, "9.9.9")]
        lines = file.read_text(encoding="utf-8").splitlines()
        assert bad[0].line == next(i for i, line in enumerate(lines, 1) if "9.9.9" in line)
    set_version.write("9.9.10", tree)
    assert set_version.differing(tree) == []
    assert {p.version for p in set_version.places(tree)} == {"9.9.10"}


@pytest.mark.parametrize("bad", ["1.0.0rc1", "1.0.0-rc.1", "1.0", "v1.0.0", "1.0.0.dev3"])
def test_set_version_takes_only_a_release_version(tree: Path, bad: str) -> None:
    with pytest.raises(SystemExit, match=r"not a release version X\.Y\.Z"):
        set_version.write(bad, tree)
    assert set_version.differing(tree) == []


# make release-check's comparison, on small artifacts made here --------------------------
def _tar_bytes(files: dict[str, bytes], gzip: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    import hashlib

    digest = hashlib.sha256(data).hexdigest()
    blobs[f"blobs/sha256/{digest}"] = data
    return {"digest": f"sha256:{digest}", "size": len(data)}


def artifacts(
    root: Path, *, wheel: str, sdist: str, tag: str, label: str, package: str, chart: str
) -> list[str]:
    dist, charts = root / "dist", root / "chart"
    dist.mkdir()
    charts.mkdir()
    with zipfile.ZipFile(dist / f"vgpu_state-{wheel}-py3-none-any.whl", "w") as z:
        z.writestr(
            f"vgpu_state-{wheel}.dist-info/METADATA", f"Name: vgpu-state\nVersion: {wheel}\n"
        )
    (dist / f"vgpu_state-{sdist}.tar.gz").write_bytes(
        _tar_bytes({f"vgpu_state-{sdist}/PKG-INFO": f"Version: {sdist}\n".encode()}, gzip=True)
    )
    chart_yaml = f'name: vgpu-state\nversion: {chart}\nappVersion: "{chart}"\n'
    (charts / f"vgpu-state-{chart}.tgz").write_bytes(
        _tar_bytes({"vgpu-state/Chart.yaml": chart_yaml.encode()}, gzip=True)
    )
    blobs: dict[str, bytes] = {}
    layer = _blob(blobs, _tar_bytes({
        "opt/vgpu-state/lib/python3.11/site-packages/vgpu_state-x.dist-info/METADATA":
        f"Version: {package}\n".encode()}, gzip=True))  # fmt: skip
    config = _blob(blobs, json.dumps(
        {"config": {"Labels": {"org.opencontainers.image.version": label}}}).encode())  # fmt: skip
    manifest = _blob(blobs, json.dumps({"config": config, "layers": [layer]}).encode())
    manifest["annotations"] = {"org.opencontainers.image.ref.name": f"localhost/vgpu-state:{tag}"}
    blobs["index.json"] = json.dumps({"manifests": [manifest]}).encode()
    image = root / "image.oci.tar"
    image.write_bytes(_tar_bytes(blobs))
    return ["--dist", str(dist), "--chart", str(charts), "--image", str(image)]


ARTIFACTS = ("wheel", "sdist", "tag", "label", "package", "chart")


@pytest.mark.parametrize("odd", [None, *ARTIFACTS])
def test_release_check_names_the_artifact_that_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], odd: str | None
) -> None:
    versions = {a: "7.7.7" if a == odd else PYPROJECT_VERSION for a in ARTIFACTS}
    status = release_check.main(artifacts(tmp_path, **versions))
    out = capsys.readouterr().out
    differ = [line for line in out.splitlines() if "differs from" in line]
    if odd is None:
        assert status == 0, out
        assert differ == [] and f"OK, every artifact and place says {PYPROJECT_VERSION}" in out
    else:
        assert status == 1, out
        assert differ and all("7.7.7" in line for line in differ), out
        assert len(differ) == (2 if odd == "chart" else 1), out  # version and appVersion


def test_release_check_refuses_another_tag_and_a_missing_artifact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = artifacts(tmp_path, **dict.fromkeys(ARTIFACTS, PYPROJECT_VERSION))
    assert release_check.main([*args, "--tag", f"v{PYPROJECT_VERSION}"]) == 0
    assert release_check.main([*args, "--tag", "v7.7.7"]) == 1
    assert "git tag" in capsys.readouterr().out
    for wheel in (tmp_path / "dist").glob("*.whl"):
        wheel.unlink()
    assert release_check.main(args) == 1
    assert "(missing)" in capsys.readouterr().out


# The release workflow -----------------------------------------------------------------
def workflow() -> dict[str, Any]:
    doc: dict[str, Any] = YAML(typ="safe").load(
        (WORKFLOWS / "release.yml").read_text(encoding="utf-8")
    )
    return doc


def test_the_release_workflow_runs_on_a_version_tag_with_least_privilege() -> None:
    doc = workflow()
    # ruamel reads the key `on` as the string "on".
    assert doc["on"] == {"push": {"tags": ["v[0-9]+.[0-9]+.[0-9]+"]}}
    assert doc["permissions"] == {}, "nothing by default; each job names what it uses"
    granted = {name: job.get("permissions") for name, job in doc["jobs"].items()}
    assert granted == {
        "check": {"contents": "read"},
        "test": {"contents": "read"},
        "build": {"contents": "read"},
        "image": {"packages": "write"},
        "chart": {"packages": "write"},
        "pypi": {"id-token": "write"},
        "github-release": {"contents": "write"},
    }
    steps = {name: json.dumps(job["steps"]) for name, job in doc["jobs"].items()}
    assert "scripts/set_version.py --check --tag" in steps["check"]
    assert "bash .ci/run" in steps["test"]
    assert "scripts/build-image" in steps["build"]
    assert "scripts/release_check.py --tag" in steps["build"]
    assert "pypa/gh-action-pypi-publish" in steps["pypi"]
    assert "helm push" in steps["chart"]
    # Nothing is published before the suite passed and the artifacts were checked.
    for job in ("image", "chart", "pypi"):
        assert "build" in doc["jobs"][job]["needs"]
    assert "test" in doc["jobs"]["build"]["needs"]
    assert doc["env"]["IMAGE"] == "ghcr.io/vgpu-state/vgpu-state"
    assert doc["env"]["CHARTS"] == "oci://ghcr.io/vgpu-state/charts"


def actionlint_binary() -> str:
    directory = os.environ.get("VGPU_STATE_ACTIONLINT_BIN")
    path = (
        Path(directory) / "actionlint"
        if directory
        else REPO / "hack" / "actionlint" / "bin" / "actionlint"
    )
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    reason = f"{path} is not built (sh hack/actionlint/build.sh, needs Go >= 1.26)"
    if os.environ.get("VGPU_STATE_REQUIRE_K8S") == "1":
        pytest.fail(f"actionlint is required (VGPU_STATE_REQUIRE_K8S=1): {reason}")
    pytest.skip(f"no actionlint: {reason}")


def test_the_workflows_pass_actionlint() -> None:
    actionlint = actionlint_binary()
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert files
    proc = subprocess.run([actionlint, "-no-color", *files], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_finds_a_broken_workflow(tmp_path: Path) -> None:
    """The check can fail: a job asking for a permission that does not exist."""
    actionlint = actionlint_binary()
    broken = tmp_path / "release.yml"
    text = (WORKFLOWS / "release.yml").read_text(encoding="utf-8")
    broken.write_text(text.replace("id-token: write", "id-tokens: write"), encoding="utf-8")
    proc = subprocess.run([actionlint, "-no-color", str(broken)], capture_output=True, text=True)
    assert proc.returncode == 1 and "id-tokens" in proc.stdout, proc.stdout + proc.stderr


def test_the_workflow_scripts_run_with_the_standard_library_only() -> None:
    """The release workflow's check job runs them before anything is installed."""
    for script in ("set_version.py", "release_check.py"):
        proc = subprocess.run(
            [sys.executable, "-I", "-S", str(REPO / "scripts" / script), "--help"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
