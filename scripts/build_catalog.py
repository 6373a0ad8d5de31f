#!/usr/bin/env python3
"""Rebuild the packaged vGPU catalog from the reference table.

Usage: python scripts/build_catalog.py [PATH/TO/vgpu-types.csv]
(default: ../shared/reference/vgpu-types.csv next to the repository).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO.parent / "shared" / "reference" / "vgpu-types.csv"
TARGET = REPO / "vgpu_state" / "catalog" / "data" / "vgpu-types.csv"


def main(argv: list[str]) -> int:
    source = Path(argv[1]) if len(argv) > 1 else DEFAULT_SOURCE
    if not source.is_file():
        print(f"error: {source} not found", file=sys.stderr)
        return 1
    data = source.read_bytes()
    header = data.split(b"\n", 1)[0].decode()
    expected = (
        "gpu_model,pci_device_id,framebuffer_mib,vgpu_type_name,series,"
        "profile_framebuffer_mib,max_instances_per_gpu,type_id_example"
    )
    if header.strip() != expected:
        print(f"error: {source}: unexpected header {header!r}", file=sys.stderr)
        return 1
    TARGET.write_bytes(data)
    rows = data.count(b"\n") - 1
    print(f"wrote {TARGET.relative_to(REPO)} ({rows} types)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
