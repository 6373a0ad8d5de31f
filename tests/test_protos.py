"""The checked-in gRPC stubs are exactly what grpcio-tools makes of our .proto files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))


def test_checked_in_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (a test dependency) is needed")
    from gen_protos import PROTOS, generate

    fresh = generate(tmp_path)
    assert len(fresh) == 3 * len(PROTOS)
    assert {p.parent for p in fresh} == {
        p.parent.relative_to(REPO) for p in REPO.glob("vgpu_state/**/api.proto")
    }
    stale = [str(p) for p, text in fresh.items() if (REPO / p).read_text(encoding="utf-8") != text]
    assert not stale, (
        f"{', '.join(stale)} differ from their .proto: run python scripts/gen_protos.py"
    )
