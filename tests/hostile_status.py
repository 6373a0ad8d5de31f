"""``VGPUNodeState`` statuses a compromised agent may write: the largest the CRD admits,
and larger ones it refuses (for tests and ``bench/controller_hostile.py``)."""

from __future__ import annotations

import base64
import datetime
import gzip
import json
import random
import string
from typing import Any

from vgpu_state.kube import nodestate as ns
from vgpu_state.model.snapshot import (
    CreatableType,
    Gpu,
    NodeSnapshot,
    OfferedType,
    SysfsInterface,
    Vgpu,
    VirtualFunction,
)

NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)


def _address(gpu: int, vf: int | None = None) -> str:
    domain, bus = divmod(gpu + 1, 256)
    if vf is None:
        return f"{domain:04x}:{bus:02x}:00.0"
    return f"{domain:04x}:{bus:02x}:{1 + vf // 8:02x}.{vf % 8}"


def big_scan(
    node: str, gpus: int = 16, vfs: int = 48, types: int = 48, held: str = "DC-0-2Q"
) -> NodeSnapshot:
    """A vendor-VFIO host whose every VF lists ``types`` creatable types and holds a vGPU:
    with the defaults as costly to decode as a reported scan may be (just under
    :data:`~vgpu_state.kube.nodestate.MAX_SNAPSHOT_OBJECTS`); each vGPU of type ``held``."""
    creatable = tuple(
        CreatableType(
            type_id=1100 + t, name=f"DC-{t}-2Q", available=1, sysfs_name=f"NVIDIA DC-{t}-2Q"
        )
        for t in range(types)
    )
    offered = tuple(
        OfferedType(type_id=1100 + t, name=f"DC-{t}-2Q", framebuffer_mib=2048, max_instances=48)
        for t in range(types)
    )
    out = []
    for g in range(gpus):
        vf_list = tuple(
            VirtualFunction(
                index=i,
                address=_address(g, i),
                driver="nvidia",
                iommu_group=100 + g * 64 + i,
                device_id=0x2BB5,
                creatable=creatable,
            )
            for i in range(vfs)
        )
        vgpus = tuple(
            Vgpu(
                kind="vf",
                parent=vf.address,
                type_id=1100,
                type_name=held,
                type_sysfs_name=f"NVIDIA {held}",
            )
            for vf in vf_list
        )
        out.append(
            Gpu(
                index=g,
                address=_address(g),
                vendor_id=0x10DE,
                device_id=0x2BB5,
                model="RTX PRO 6000 Blackwell Server Edition",
                driver="nvidia",
                sriov_totalvfs=vfs,
                sriov_numvfs=vfs,
                vfs=vf_list,
                layout=SysfsInterface.VENDOR_VFIO,
                offered=offered,
                vgpus=vgpus,
            )
        )
    return NodeSnapshot(node=node, gpus=tuple(out))


def _pack(raw: bytes) -> str:
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def maximal_snapshot(node: str) -> dict[str, Any]:
    """``status.snapshot``: :func:`big_scan`, padded with a problem of random text until
    ``data`` is as long as the CRD admits; it decodes (a reader does all the work)."""
    scan = big_scan(node)
    base = json.loads(scan.model_dump_json(exclude_defaults=True))
    rng = random.Random(node)
    pad = 150_000
    while True:
        noise = "".join(rng.choices(string.ascii_letters + string.digits, k=pad))
        raw = json.dumps({**base, "problems": [noise]}, separators=(",", ":")).encode()
        data = _pack(raw)
        if len(data) >= ns.MAX_SNAPSHOT_DATA - 2048:
            break
        pad += (ns.MAX_SNAPSHOT_DATA - 1024 - len(data)) * 3 // 4
    while len(data) > ns.MAX_SNAPSHOT_DATA:
        pad -= 512
        noise = noise[:pad]
        raw = json.dumps({**base, "problems": [noise]}, separators=(",", ":")).encode()
        data = _pack(raw)
    snapshot = NodeSnapshot.model_validate_json(raw)
    return {
        "encoding": "gzip+base64",
        "fingerprint": snapshot.fingerprint(),
        "scannedAt": NOW.isoformat(),
        "data": data,
    }


def _text(length: int, seed: str) -> str:
    return (seed * (length // len(seed) + 1))[:length]


def maximal_status(node: str) -> dict[str, Any]:
    """A status at every bound of the CRD: 32 GPUs, 1,024 vGPUs (64 on each of 16 GPUs),
    every string as long as admitted, every GPU with a pending switch naming 64 departing
    types, 64 capacity rows, every condition with the longest message, and the longest
    scan (:func:`maximal_snapshot`)."""
    gpus = []
    for g in range(ns.MAX_GPUS):
        vgpus = [
            {
                "id": _text(ns.ID_LENGTH - 4, "u") + f"{g:02d}{v:02d}",
                "type": _text(ns.TYPE_LENGTH, "T"),
                "resourceName": _text(ns.NAME_LENGTH, "r"),
                "holder": _text(ns.NAME_LENGTH, "h"),
                "vm": _text(ns.VM_LENGTH, "v"),
            }
            for v in range(ns.MAX_VGPUS_PER_GPU if g < ns.MAX_VGPUS // ns.MAX_VGPUS_PER_GPU else 0)
        ]
        gpus.append(
            {
                "address": _text(ns.ID_LENGTH - 2, "a") + f"{g:02d}",
                "model": _text(ns.SHORT_LENGTH, "m"),
                "layout": _text(ns.SHORT_LENGTH, "l"),
                "vgpus": vgpus,
                "switch": {
                    "state": "deferred",
                    "policy": "evacuate",
                    "departing": [
                        _text(ns.TYPE_LENGTH - 2, "d") + f"{i:02d}" for i in range(ns.MAX_DEPARTING)
                    ],
                    "withheld": ns.MAX_VGPUS_PER_GPU,
                    "message": _text(ns.SWITCH_MESSAGE_LENGTH, "w"),
                },
            }
        )
    message = _text(ns.MESSAGE_LENGTH, "x")
    short = _text(ns.SHORT_LENGTH, "s")
    return {
        "state": "success",
        "selectedConfig": {
            "name": _text(ns.NAME_LENGTH, "n"),
            "source": "label",
            "reason": message,
            "documentHash": short,
        },
        "gpus": gpus,
        "capacity": [
            {
                "resourceName": _text(ns.NAME_LENGTH - 2, "c") + f"{i:02d}",
                "total": 1,
                "free": 1,
                "withheld": 1,
            }
            for i in range(ns.MAX_RESOURCES)
        ],
        "vgpuCount": ns.MAX_VGPUS,
        "blockedCount": 0,
        "inUseKnown": True,
        "conditions": [
            {
                "type": kind,
                "status": "True",
                "reason": short,
                "message": message,
                "observedGeneration": 1,
                "lastTransitionTime": short,
            }
            for kind in ns.CONDITION_KINDS
        ],
        "lastApply": {
            "planId": short,
            "start": short,
            "end": short,
            "result": "success",
            "message": message,
        },
        "snapshot": maximal_snapshot(node),
    }


def wide_status(node: str, gpus: int = 2350) -> dict[str, Any]:
    """A status of ``gpus`` GPUs (a listing of each and a scan of them all), far beyond
    what the CRD admits: what an agent could write before the CRD had bounds."""
    scan = big_scan(node, gpus=gpus, vfs=4, types=4)
    reported = encode_snapshot_unbounded(scan)
    listing: list[dict[str, Any]] = [
        {"address": g.address, "model": g.model, "layout": g.layout.value, "vgpus": []}
        for g in scan.gpus
    ]
    return {"gpus": listing, "vgpuCount": 0, "snapshot": reported}


def encode_snapshot_unbounded(scan: NodeSnapshot) -> dict[str, Any]:
    """``status.snapshot`` for ``scan`` whatever its size (the agent refuses to report a
    scan beyond the bounds: :func:`~vgpu_state.kube.nodestate.encode_snapshot`)."""
    raw = scan.model_dump_json(exclude_defaults=True).encode()
    return {
        "encoding": "gzip+base64",
        "fingerprint": scan.fingerprint(),
        "scannedAt": NOW.isoformat(),
        "data": _pack(raw),
    }
