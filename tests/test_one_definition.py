"""What the code base defines once stays defined once: the frozen model base, NVIDIA's
PCI vendor id and the mdev UUID pattern (all in ``vgpu_state.model``), and every
default path and port of a node (``vgpu_state.wellknown``)."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from vgpu_state import wellknown
from vgpu_state.model.ids import NVIDIA_VENDOR_ID, UUID_PATTERN, is_canonical_uuid

PACKAGE = Path(__file__).resolve().parent.parent / "vgpu_state"
FROZEN = PACKAGE / "model" / "frozen.py"
IDS = PACKAGE / "model" / "ids.py"
UUID_GROUPS = re.compile(r"\{8\}.*\{4\}.*\{4\}.*\{4\}.*\{12\}")


def trees() -> list[tuple[str, ast.AST]]:
    return [
        (str(path.relative_to(PACKAGE)), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in (FROZEN, IDS)
    ]


def test_every_pydantic_model_derives_from_the_one_frozen_base() -> None:
    offenders = []
    for name, tree in trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name | ast.Attribute) and ast.unparse(b).endswith("BaseModel")
                for b in node.bases
            ):
                offenders.append(f"{name}: class {node.name}")
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith("ConfigDict")
                and any(k.arg in ("frozen", "extra") for k in node.keywords)
            ):
                offenders.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


def test_the_vendor_id_and_the_uuid_pattern_are_defined_once() -> None:
    offenders = []
    for name, tree in trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant):
                continue
            if type(node.value) is int and node.value == NVIDIA_VENDOR_ID:
                offenders.append(f"{name}:{node.lineno}: vendor id {node.value:#x}")
            if isinstance(node.value, str) and UUID_GROUPS.search(node.value):
                offenders.append(f"{name}:{node.lineno}: UUID pattern {node.value!r}")
    assert offenders == []


def test_the_uuid_checks_agree_on_case_and_shape() -> None:
    lower = "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"
    assert UUID_PATTERN.match(lower) and UUID_PATTERN.match(lower.upper())
    assert is_canonical_uuid(lower) and not is_canonical_uuid(lower.upper())
    for bad in (lower + "\n", lower[:-1], lower.replace("-", ""), " " + lower, 7):
        assert not is_canonical_uuid(bad)
    assert UUID_PATTERN.fullmatch(lower + "0") is None


# What only vgpu_state/wellknown.py may spell; each a part of a literal (the kubelet's
# paths, the CDI directory, the state directory, its files, the metrics port).
WELL_KNOWN_PARTS = (
    "/var/lib/kubelet",
    "plugins_registry",
    "/var/run/cdi",
    "/var/lib/vgpu-state",
    wellknown.JOURNAL_FILE,
    wellknown.LOCK_FILE,
    wellknown.DRIVER_TYPES_FILE,
    str(wellknown.METRICS_PORT),
)


def well_known_literals(package: Path) -> list[str]:
    """``file:line: literal`` of every string or number in code (docstrings aside) that
    spells a well-known path, file name or port outside ``wellknown.py``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "wellknown.py" or "_pb2" in path.name:
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or id(node) in docstrings:
                continue
            text = str(node.value) if type(node.value) in (str, int) else ""
            if any(part in text for part in WELL_KNOWN_PARTS):
                rel = path.relative_to(package).as_posix()
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_every_well_known_path_and_port_is_defined_once() -> None:
    assert well_known_literals(PACKAGE) == []


@pytest.mark.parametrize(
    "line",
    [
        'PLUGINS = "/var/lib/kubelet/device-plugins"',
        "PORT = 9410",
        'LISTEN = "0.0.0.0:9410"',
        'STATE = Path("/var/lib/vgpu-state") / "journal.jsonl"',
        'HELP = f"the CDI specs in /var/run/cdi/{NAME}"',
    ],
)
def test_a_spelled_out_well_known_path_is_caught(tmp_path: Path, line: str) -> None:
    copy = tmp_path / "vgpu_state"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "agent" / "assemble.py"
    text = target.read_text()
    target.write_text(text + f"\n{line}  # noqa\n")
    lineno = text.count("\n") + 2
    found = well_known_literals(copy)
    assert found and all(f.startswith(f"agent/assemble.py:{lineno}: ") for f in found), found
