#!/usr/bin/env python3
"""The main job of `make demo` (grows with every capability)."""

from __future__ import annotations

from vgpu_state.catalog import default_catalog


def main() -> int:
    cat = default_catalog()
    print(f"vgpu-state catalog: {len(cat.models)} GPU models, {len(cat.type_names)} vGPU types")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
