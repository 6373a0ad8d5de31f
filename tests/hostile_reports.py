"""Scans a compromised node could report, and a layouts document for the simulated hosts
(shared by the controller's pure tests and its tests against the real API server)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.model.snapshot import (
    CreatableType,
    Gpu,
    NodeSnapshot,
    OfferedType,
    SysfsInterface,
    Vgpu,
)
from vgpu_state.sim.host import SimHost

SIM = Path(__file__).resolve().parent.parent / "configs" / "sim"

LAYOUT_TYPES = ("A2-4A", "A2-4C", "A2-4Q", "T4-8C", "L40S-12Q", "L40S-4Q")
"""The types the simulated hosts carry, each in a layout of :data:`LAYOUTS`."""

LAYOUTS = "version: v1\nvgpu-configs:\n" + "".join(
    f"  {name.lower()}:\n    - devices: all\n      vgpu-devices:\n        {name}: 1\n"
    for name in LAYOUT_TYPES
)
"""The admin's layouts document: one layout per type of :data:`LAYOUT_TYPES`."""


def layouts() -> StaticConfigSource:
    return StaticConfigSource(load_text(LAYOUTS, "layouts.yaml", catalog=default_catalog()))


def bounding() -> dict[str, Any]:
    """The ``ControllerSettings`` keywords that give the controller :data:`LAYOUTS`."""
    return {"layouts": layouts(), "catalog": default_catalog()}


def scan(spec: str, node: str) -> NodeSnapshot:
    with SimHost(SIM / spec, in_memory=True) as host:
        return host.scan().model_copy(update={"node": node})


def made_up_types(node: str, count: int) -> NodeSnapshot:
    """A node whose A2 "offers" ``count`` made-up types of NVIDIA's naming grammar
    (``Z0-1Q`` …), each with one live mdev: every check on the report alone passes."""
    base = scan("a2-host.yaml", node)
    gpu = next(g for g in base.gpus if g.model == "A2")
    offered = tuple(OfferedType(type_id=20_000 + i, name=f"Z{i}-1Q") for i in range(count))
    vgpus = tuple(
        Vgpu(
            kind="mdev",
            parent=gpu.address,
            uuid=str(uuid.uuid5(uuid.NAMESPACE_OID, f"{node}/{i}")),
            type_id=20_000 + i,
            type_name=f"Z{i}-1Q",
            type_sysfs_name=f"NVIDIA Z{i}-1Q",
        )
        for i in range(count)
    )
    forged = gpu.model_copy(update={"offered": offered, "vgpus": vgpus})
    return base.model_copy(update={"gpus": (forged,)})


A2_4Q_ID = 746
"""The driver's type id of ``A2-4Q``."""


def vf_backed_a2(node: str, vf_device: int) -> NodeSnapshot:
    """A node claiming one VF-backed vGPU of ``NVIDIA A2-4Q`` (vendor-VFIO) on a VF whose
    device id it chose."""
    base = scan("a2-host.yaml", node)
    gpu: Gpu = next(g for g in base.gpus if g.model == "A2")
    a2_4q = CreatableType(type_id=A2_4Q_ID, name="A2-4Q", available=1, sysfs_name="NVIDIA A2-4Q")
    vf = gpu.vfs[0].model_copy(
        update={"device_id": vf_device, "creatable": (a2_4q,), "current_type_id": A2_4Q_ID}
    )
    vgpu = Vgpu(
        kind="vf",
        parent=vf.address,
        type_id=A2_4Q_ID,
        type_name="A2-4Q",
        type_sysfs_name="NVIDIA A2-4Q",
    )
    forged = gpu.model_copy(
        update={
            "layout": SysfsInterface.VENDOR_VFIO,
            "vfs": (vf,),
            "sriov_numvfs": 1,
            "offered": (OfferedType(type_id=A2_4Q_ID, name="A2-4Q"),),
            "pf_creatable": (),
            "vgpus": (vgpu,),
        }
    )
    return base.model_copy(update={"gpus": (forged,)})
