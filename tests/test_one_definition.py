"""What the code base defines once stays defined once: the frozen model base, NVIDIA's
PCI vendor id and the mdev UUID pattern (all in ``vgpu_state.model``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
