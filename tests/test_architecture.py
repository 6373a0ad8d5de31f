"""The layer contracts of pyproject.toml hold, and they catch what DESIGN.md forbids."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess[str]:
    """Run import-linter with the project's contracts on the package found in ``package_parent``."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=package_parent,
        env={"PYTHONPATH": str(package_parent), "PATH": "/usr/bin:/bin", "COLUMNS": "250"},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_package_keeps_every_contract() -> None:
    r = lint_imports(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "executor/apply.py",
            "import vgpu_state.sim.host",
            "The executor reaches hosts only through the host port",
        ),
        (
            "host/scan.py",
            "import vgpu_state.planner",
            "The host layer reads and writes the driver only",
        ),
        ("sim/host.py", "import vgpu_state.executor", "Layers point down"),
        ("executor/apply.py", "import vgpu_state.planner", "never makes one"),
        ("statefiles/journal.py", "import vgpu_state.reconcile", "Layers point down"),
        ("cli/scan.py", "import vgpu_state.host.scan", "get a node only from vgpu_state.compose"),
        ("agent/assemble.py", "import vgpu_state.sim.node", "only from vgpu_state.compose"),
        ("compose/node.py", "import vgpu_state.reconcile", "Layers point down"),
        ("statefiles/lock.py", "import vgpu_state.catalog", "state files stand on the model"),
        ("statefiles/drivertypes.py", "import click", "state files stand on the model"),
        ("planner/plan.py", "import vgpu_state.host", "Layers point down"),
        ("planner/plan.py", "import pathlib", "No file or process I/O in model"),
        ("config/loader.py", "import jsonpatch", "Pure core never imports I/O libraries"),
        ("statefiles/journal.py", "import kubernetes", "only in their adapter packages"),
        ("config/selection.py", "import vgpu_state.testing", "never imports the test fakes"),
        ("dra/slices.py", "import grpc", "DRA pool, claims and prepare code load neither"),
        ("dra/claims.py", "import vgpu_state.executor", "Layers point down"),
        ("reconcile/once.py", "import vgpu_state.kube.nodestate", "reconcile reaches hosts"),
        ("reconcile/fleet.py", "import vgpu_state.host.scan", "reconcile reaches hosts"),
        ("reconcile/status.py", "import vgpu_state.sim.host", "reconcile reaches hosts"),
        ("reconcile/report.py", "import vgpu_state.deviceplugin", "reconcile reaches hosts"),
        ("planner/plan.py", "import vgpu_state.config", "never reads the config document"),
        ("planner/saved.py", "from vgpu_state.config import loader", "never reads the config"),
        ("planner/plan.py", "import vgpu_state.render", "Layers point down"),
        ("planner/support.py", "import vgpu_state.doctor", "Layers point down"),
        ("doctor/checks.py", "import vgpu_state.render", "Layers point down"),
        ("doctor/checks.py", "import vgpu_state.host.scan", "No file or process I/O in model"),
        ("doctor/checks.py", "import os", "open no file"),
        ("render/plan.py", "import rich", "Pure core never imports I/O libraries"),
        ("render/plan.py", "import vgpu_state.planner.plan", "decide nothing"),
        ("render/doctor.py", "import vgpu_state.catalog", "decide nothing"),
        ("render/plan.py", "import vgpu_state.ports", "Layers point down"),
        ("model/plan.py", "import os", "open no file"),
        ("model/snapshot.py", "import stat", "open no file"),
        ("catalog/catalog.py", "import os.path", "open no file"),
        ("model/plan.py", "from vgpu_state.inputfiles import read_input", "open no file"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    shutil.copytree(
        REPO / "vgpu_state", tmp_path / "vgpu_state", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tmp_path / "vgpu_state" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    r = lint_imports(tmp_path)
    assert r.returncode != 0, r.stdout
    broken = [s for s in r.stdout.splitlines() if re.search(r" BROKEN( \(.*\))?$", s)]
    assert any(contract in s for s in broken), r.stdout


# What the pure packages may take from os, and the calls that open a file.
PURE = ("model", "catalog", "planner", "doctor", "render")
OS_NAMES_ALLOWED = {"strerror"}
OPENING_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes"}
# The catalog's own rows are package data (importlib.resources), not a file of the host.
OPENING_ALLOWED = {"catalog/catalog.py: read_text"}


def file_io_in_the_pure_core(package: Path) -> list[str]:
    """``file:line: what`` of each use of ``os`` beyond ``strerror`` and each call
    that opens a file in ``model``, ``catalog``, ``planner``, ``doctor`` and ``render``."""
    found = []
    for top in PURE:
        for path in sorted((package / top).rglob("*.py")):
            rel = path.relative_to(package).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "os"
                    and node.attr not in OS_NAMES_ALLOWED
                ):
                    found.append(f"{rel}:{node.lineno}: os.{node.attr}")
                if isinstance(node, ast.ImportFrom) and node.module in ("os", "os.path"):
                    found.append(f"{rel}:{node.lineno}: from {node.module} import")
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
                    if name in OPENING_CALLS and f"{rel}: {name}" not in OPENING_ALLOWED:
                        found.append(f"{rel}:{node.lineno}: {name}()")
    return found


def test_the_pure_packages_open_no_file() -> None:
    """The import contracts keep ``os`` and ``stat`` out of the pure core, but
    ``model.errors`` names an errno with ``os.strerror`` and ``open`` is a builtin:
    this check covers what an import contract cannot see."""
    assert file_io_in_the_pure_core(REPO / "vgpu_state") == []


@pytest.mark.parametrize(
    ("module", "line", "found"),
    [
        ("model/errors.py", "_ = os.listdir('/')", "os.listdir"),
        ("planner/plan.py", "_ = open('/etc/hostname').read()", "open()"),
        ("model/snapshot.py", "_ = Path('x').read_text()", "read_text()"),
        ("render/doctor.py", "_ = open('/etc/hostname').read()", "open()"),
    ],
)
def test_file_io_in_the_pure_core_is_caught(
    tmp_path: Path, module: str, line: str, found: str
) -> None:
    shutil.copytree(
        REPO / "vgpu_state", tmp_path / "vgpu_state", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tmp_path / "vgpu_state" / module
    text = target.read_text()
    target.write_text(text + f"\n{line}  # noqa\n")
    lineno = text.count("\n") + 2
    assert file_io_in_the_pure_core(tmp_path / "vgpu_state") == [f"{module}:{lineno}: {found}"]


def test_the_simulator_starts_without_the_cli() -> None:
    """The FUSE server has its own entry point; nothing in the simulator names the CLI."""
    for path in (REPO / "vgpu_state" / "sim").glob("*.py"):
        assert "vgpu_state.cli" not in path.read_text(), path
    r = subprocess.run(
        [sys.executable, "-m", "vgpu_state.sim", "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "mount" in r.stdout


def test_nothing_below_the_shells_reads_the_environment_or_argv() -> None:
    """Settings are passed down: only the CLI and the agent read flags and environment.

    The Kubernetes adapter may read what the official client and kubectl read when
    they load credentials and connect: the in-cluster service environment and
    ``KUBECONFIG`` (kube/credentials.py) and the proxy variables
    ``HTTPS_PROXY``/``NO_PROXY`` (kube/transport.py).
    """
    shells = {"cli", "agent"}
    allowed = {
        "kube/credentials.py: os.environ",
        "kube/transport.py: os.environ",
    }
    offenders = []
    for path in sorted((REPO / "vgpu_state").rglob("*.py")):
        rel = path.relative_to(REPO / "vgpu_state")
        if rel.parts[0] in shells:
            continue
        text = path.read_text()
        for needle in ("os.environ", "os.getenv", "sys.argv"):
            if needle in text and f"{rel}: {needle}" not in allowed:
                offenders.append(f"{rel}: {needle}")
    assert offenders == []


def test_only_the_reconcile_goes_from_config_to_a_plan() -> None:
    """Nothing but ``vgpu_state.reconcile`` rebuilds load → select → resolve → plan."""
    resolve = re.compile(r"^from vgpu_state\.config(\.resolution)? import .*\bresolve\b", re.M)
    planner = re.compile(r"^from vgpu_state\.planner(\.plan)? import .*\bplan\b", re.M)
    offenders = []
    for top in ("vgpu_state", "tests", "bench", "scripts"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO)
            if rel.parts[:2] == ("vgpu_state", "reconcile"):
                continue
            text = path.read_text()
            if resolve.search(text) and planner.search(text):
                offenders.append(str(rel))
    assert offenders == []


# The composition roots that choose the catalog: the command line, the agent's
# assembly and the simulator's own entry points (a simulated node, the FUSE server).
CATALOG_ROOTS = ("cli/", "agent/assemble.py", "sim/host.py", "sim/server.py", "catalog/")


def default_catalog_calls(package: Path) -> list[str]:
    """``file:line`` of every ``default_catalog()`` call outside the composition roots."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith(CATALOG_ROOTS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if name == "default_catalog":
                found.append(f"{rel}:{node.lineno}")
    return found


def test_the_catalog_is_passed_down_from_the_shells() -> None:
    """Below the CLI, the agent's assembly and the simulator's entry points, every
    layer gets its catalog from its caller (``Settings.catalog``), never implicitly."""
    assert default_catalog_calls(REPO / "vgpu_state") == []


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("planner/plan.py", "_ = default_catalog()"),
        ("config/resolution.py", "_ = catalog_module.default_catalog()"),
    ],
)
def test_an_implicit_catalog_below_the_shells_is_caught(
    tmp_path: Path, module: str, line: str
) -> None:
    shutil.copytree(
        REPO / "vgpu_state", tmp_path / "vgpu_state", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tmp_path / "vgpu_state" / module
    text = target.read_text()
    target.write_text(text + f"\n{line}  # noqa\n")
    lineno = text.count("\n") + 2
    assert default_catalog_calls(tmp_path / "vgpu_state") == [f"{module}:{lineno}"]


# JSON Patches ---------------------------------------------------------------------------
GUARDED_PATCH = "kube/guardedpatch.py"
"""The one module that makes JSON Patch ops and sends JSON Patches (checked first)."""
UNCHECKED = "a patch sent without the check"


def json_patches_by_hand(package: Path) -> list[str]:
    """``file:line: what`` of each JSON Patch op written by hand (a dict display or a
    ``dict(...)`` call with an ``op`` key) and each ``.patch(...)`` call whose kind is not
    the constant ``"merge"``, outside :data:`GUARDED_PATCH`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel == GUARDED_PATCH:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "op" for k in node.keys
            ):
                found.append(f"{rel}:{node.lineno}: a JSON Patch op")
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (
                isinstance(f, ast.Name)
                and f.id == "dict"
                and any(k.arg == "op" for k in node.keywords)
            ):
                found.append(f"{rel}:{node.lineno}: a JSON Patch op")
            if isinstance(f, ast.Attribute) and f.attr == "patch":
                kinds = node.args[2:3] + [k.value for k in node.keywords if k.arg == "kind"]
                if not kinds or any(
                    not (isinstance(k, ast.Constant) and k.value == "merge") for k in kinds
                ):
                    found.append(f"{rel}:{node.lineno}: {UNCHECKED}")
    return found


def test_every_json_patch_is_made_by_the_library_and_checked_before_it_is_sent() -> None:
    """JSON Patches are computed with ``jsonpatch`` from the object read and the object
    wanted, and sent only through ``guardedpatch.send``, which applies them to the object
    read first: no product module writes ops, or sends a JSON Patch, by itself."""
    assert json_patches_by_hand(REPO / "vgpu_state") == []


@pytest.mark.parametrize(
    ("module", "line", "found"),
    [
        ("kube/permitted.py", "_ = [{'op': 'add', 'path': '/x', 'value': 1}]", "a JSON Patch op"),
        ("controller/tls.py", "_ = dict(op='remove', path='/x')", "a JSON Patch op"),
        ("kube/kubevirt.py", "_ = lambda api: api.patch('/p', [], 'json')", UNCHECKED),
        ("kube/node.py", "_ = lambda api, k: api.patch('/p', [], kind=k)", UNCHECKED),
    ],
)  # fmt: skip
def test_a_json_patch_by_hand_is_caught(tmp_path: Path, module: str, line: str, found: str) -> None:
    shutil.copytree(
        REPO / "vgpu_state", tmp_path / "vgpu_state", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tmp_path / "vgpu_state" / module
    text = target.read_text()
    target.write_text(text + f"\n{line}  # noqa\n")
    lineno = text.count("\n") + 2
    assert json_patches_by_hand(tmp_path / "vgpu_state") == [f"{module}:{lineno}: {found}"]
