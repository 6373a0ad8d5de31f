"""Hand-built node snapshots for planner tests (independent of the simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vgpu_state.catalog import VgpuType, default_catalog
from vgpu_state.catalog.capacity import remaining as room
from vgpu_state.model.desired import DesiredGpu, DesiredState
from vgpu_state.model.pci import vf_address
from vgpu_state.model.policy import Policy
from vgpu_state.model.snapshot import (
    CreatableType,
    Gpu,
    NodeSnapshot,
    SysfsInterface,
    Vgpu,
    VirtualFunction,
)

NODE = "node1"


@dataclass(frozen=True)
class V:
    """An existing vGPU: type, VF index (None = on the PF), optional UUID."""

    type: str
    vf: int | None = None
    uuid: str | None = None


def _uuid(address: str, n: int) -> str:
    bus = address[5:7]
    return f"00000000-0000-4000-8000-{int(bus, 16):04x}{n:08x}"


def build_gpu(
    address: str = "0000:08:00.0",
    model: str = "A2",
    layout: str = "mdev",
    vgpus: Sequence[V] = (),
    index: int = 0,
    sriov_on: bool = True,
) -> Gpu:
    cat = default_catalog()
    m = cat.find_model(model)
    assert m is not None, model
    types = [t for t in m.types if not t.is_mig]
    sriov = m.sriov_capable
    numvfs = m.sriov_totalvfs if (sriov and sriov_on) else 0
    vf_addrs = [vf_address(address, 4, 1, i) for i in range(numvfs)]
    existing: list[Vgpu] = []
    for n, v in enumerate(vgpus):
        t = m.type(v.type)
        assert t is not None, v.type
        if layout == "vendor-vfio":
            assert v.vf is not None
            existing.append(
                Vgpu(kind="vf", parent=vf_addrs[v.vf], type_id=t.type_id, type_name=t.name)
            )
        else:
            parent = address if v.vf is None else vf_addrs[v.vf]
            existing.append(
                Vgpu(
                    kind="mdev",
                    parent=parent,
                    uuid=v.uuid or _uuid(address, n),
                    type_id=t.type_id,
                    type_name=t.name,
                )
            )
    present = [m.type(v.type) for v in vgpus]

    def remaining(t: VgpuType) -> int:
        return room(t, present)

    occupied = {v.parent for v in existing}
    vfs: list[VirtualFunction] = []
    for i, a in enumerate(vf_addrs):
        busy = a in occupied
        if layout == "vendor-vfio":
            creatable = tuple(
                CreatableType(type_id=t.type_id, name=t.name, available=1)
                for t in types
                if not busy and remaining(t) > 0
            )
            current = next((v.type_id for v in existing if v.parent == a), None)
        else:
            creatable = tuple(
                CreatableType(
                    type_id=t.type_id,
                    name=t.name,
                    available=0 if busy else min(remaining(t), 1),
                )
                for t in types
            )
            current = None
        vfs.append(
            VirtualFunction(index=i, address=a, creatable=creatable, current_type_id=current)
        )
    pf_creatable: tuple[CreatableType, ...] = ()
    if not sriov:
        pf_creatable = tuple(
            CreatableType(
                type_id=t.type_id,
                name=t.name,
                available=remaining(t),
            )
            for t in types
        )
    lay = SysfsInterface.SRIOV_DISABLED if sriov and not sriov_on else SysfsInterface(layout)
    return Gpu(
        index=index,
        address=address,
        vendor_id=0x10DE,
        device_id=m.device_ids[0],
        subsystem_device_id=(m.subsystem_device_ids or (0,))[0],
        model=m.name,
        driver="nvidia",
        sriov_totalvfs=m.sriov_totalvfs or None,
        sriov_numvfs=numvfs,
        vfs=tuple(vfs),
        layout=lay,
        pf_creatable=pf_creatable,
        vgpus=tuple(sorted(existing, key=lambda v: v.key)),
    )


def build_snapshot(*gpus: Gpu) -> NodeSnapshot:
    ordered = sorted(gpus, key=lambda g: g.address)
    return NodeSnapshot(
        node=NODE,
        gpus=tuple(g.model_copy(update={"index": i}) for i, g in enumerate(ordered)),
    )


def desired(
    layouts: dict[str, dict[str, int]],
    snapshot: NodeSnapshot,
    policy: Policy | None = None,
    config: str = "test",
) -> DesiredState:
    gpus = []
    for address, types in sorted(layouts.items()):
        g = snapshot.gpu(address)
        gpus.append(
            DesiredGpu(
                address=address,
                index=g.index if g else 0,
                model=g.model if g else None,
                types=tuple(sorted(types.items())),
                entry=f"test.yaml (vgpu-configs.{config}[0])",
            )
        )
    managed = set(layouts)
    return DesiredState(
        node=NODE,
        config=config,
        selection_source="flag",
        policy=policy or Policy(prune=True),
        gpus=tuple(gpus),
        unmanaged=tuple(g.address for g in snapshot.gpus if g.address not in managed),
    )
