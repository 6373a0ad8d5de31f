#!/usr/bin/env python3
"""The main job of `make demo` (grows with every capability)."""

from __future__ import annotations

import os
from pathlib import Path

from vgpu_state.catalog import default_catalog
from vgpu_state.config import load_file, resolve, select
from vgpu_state.model import ConfigError, Gpu

REPO = Path(__file__).resolve().parent.parent

# A mixed node: two A2, one A16 (same PCI device id, told apart by subsystem id), one L40S.
NODE = "gpu-node-7"
LABELS = {"pool": "vdi", "kubernetes.io/hostname": NODE}
GPUS = (
    ("0000:08:00.0", 0x25B6, 0x157E),
    ("0000:09:00.0", 0x25B6, 0x157E),
    ("0000:3b:00.0", 0x25B6, 0x14A9),
    ("0000:41:00.0", 0x26B9, 0x1851),
)


def main() -> int:
    os.chdir(REPO)
    cat = default_catalog()
    print(f"vgpu-state catalog: {len(cat.models)} GPU models, {len(cat.type_names)} vGPU types")
    print("\nShipped configs:")
    for path in sorted(Path("configs").rglob("*.yaml")):
        try:
            doc = load_file(path)
            print(f"  valid   {path} ({len(doc.configs)} config(s))")
        except ConfigError as exc:
            print(f"  INVALID {path}\n{exc}")
            return 1

    gpus = [
        Gpu(
            index=i,
            address=a,
            vendor_id=0x10DE,
            device_id=d,
            subsystem_vendor_id=0x10DE,
            subsystem_device_id=s,
        )
        for i, (a, d, s) in enumerate(GPUS)
    ]
    doc = load_file("configs/examples/node-pools.yaml")
    labels = ", ".join(f"{k}={v}" for k, v in LABELS.items())
    print(f"\nNode {NODE} ({labels}) with configs/examples/node-pools.yaml:")
    selection = select(doc, NODE, LABELS)
    print(f"  selected config {selection.config!r} by {selection.detail}")
    assert selection.config is not None
    state = resolve(doc, selection.config, gpus, NODE, selection.source)
    wanted = {g.address: g for g in state.gpus}
    for gpu in gpus:
        model = cat.model_for_pci(gpu.device_id, gpu.subsystem_device_id)
        name = model.short_name if model else "unknown"
        desired = wanted.get(gpu.address)
        layout = (
            ", ".join(f"{n}x {t}" for t, n in desired.types) if desired else "unmanaged (untouched)"
        )
        print(f"  GPU {gpu.index} {gpu.address} {name:5} {layout}")
    print(
        f"  policy: in-use={state.policy.in_use} prune={state.policy.prune} "
        f"sriov={state.policy.sriov}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
