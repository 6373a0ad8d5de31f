"""The vGPU catalog: model lookup, type names, and the packaged copy of the reference table."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_state.catalog import default_catalog, parse_type_name

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO.parent / "shared" / "reference" / "vgpu-types.csv"
PACKAGED = REPO / "vgpu_state" / "catalog" / "data" / "vgpu-types.csv"


def test_packaged_table_matches_reference() -> None:
    if not REFERENCE.is_file():
        pytest.skip(f"reference table not found at {REFERENCE}")
    assert PACKAGED.read_bytes() == REFERENCE.read_bytes(), (
        "vgpu_state/catalog/data/vgpu-types.csv is stale: run python scripts/build_catalog.py"
    )


@pytest.mark.parametrize(
    ("device", "subsystem", "model"),
    [
        (0x25B6, 0x157E, "A2"),
        (0x25B6, 0x14A9, "A16 (per physical GPU; 4 per board)"),
        (0x1EB8, 0x12A2, "Tesla T4"),
        (0x26B9, 0x1851, "L40S"),
        (0x1E78, 0x13D9, "Quadro RTX 6000 (passive)"),
        (0x1E78, 0x13D8, "Quadro RTX 8000 (passive)"),
    ],
)
def test_model_by_pci_ids(device: int, subsystem: int, model: str) -> None:
    found = default_catalog().model_for_pci(device, subsystem)
    assert found is not None and found.name == model


def test_shared_device_id_without_known_subsystem_is_not_guessed() -> None:
    assert default_catalog().model_for_pci(0x25B6, 0x0000) is None


@pytest.mark.parametrize(
    ("text", "name", "series", "fb_gb", "mig"),
    [
        ("A10-4Q", "A10-4Q", "Q", 4, None),
        ("NVIDIA A10-4Q", "A10-4Q", "Q", 4, None),
        ("GRID T4-1Q", "T4-1Q", "Q", 1, None),
        ("NVIDIA RTX Pro 6000 Blackwell DC-3Q", "DC-3Q", "Q", 3, None),
        ("M60-0Q", "M60-0Q", "Q", 0, None),
        ("DC-1-24Q", "DC-1-24Q", "Q", 24, 1),
        ("A100-1-5CME", "A100-1-5CME", "C", 5, 1),
        ("DC-1-24QNOME", "DC-1-24QNOME", "Q", 24, 1),
        ("DC-4-96CMEALL", "DC-4-96CMEALL", "C", 96, 4),
        ("DC-1-24CGFX", "DC-1-24CGFX", "C", 24, 1),
        ("RTX5000-Ada-4Q", "RTX5000-Ada-4Q", "Q", 4, None),
    ],
)
def test_type_name_grammar(text: str, name: str, series: str, fb_gb: int, mig: int | None) -> None:
    parsed = parse_type_name(text)
    assert parsed is not None
    assert (parsed.name, parsed.series, parsed.framebuffer_gb, parsed.mig_slices) == (
        name,
        series,
        fb_gb,
        mig,
    )


def test_unknown_names_are_tolerated() -> None:
    assert parse_type_name("GRID T4-2B4") is None
    assert default_catalog().type("T4-2B4") is None


def test_type_facts() -> None:
    cat = default_catalog()
    t = cat.type("NVIDIA A2-4Q")
    assert t is not None
    assert (t.series, t.framebuffer_mib, t.max_instances, t.type_id) == ("Q", 4096, 4, 746)
    gfx = cat.type("DC-1-24QGFX")
    assert gfx is not None and gfx.name == "DC-1-24Q"
    assert cat.type_by_id(1147) is not None and cat.type_by_id(1147).name == "L40S-1Q"  # type: ignore[union-attr]


def test_sriov_facts() -> None:
    cat = default_catalog()
    assert cat.find_model("A2").sriov_totalvfs == 16  # type: ignore[union-attr]
    assert cat.find_model("L40S").sriov_totalvfs == 32  # type: ignore[union-attr]
    assert cat.find_model("T4").sriov_totalvfs == 0  # type: ignore[union-attr]
