"""A node's live vGPU layout as a config document (what ``vgpu-state export`` prints)."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from vgpu_state.catalog import parse_type_name
from vgpu_state.config.document import ConfigDocument, ConfigFile, Entry, NamedConfig
from vgpu_state.config.semantics import default_mode
from vgpu_state.model.errors import UserError
from vgpu_state.model.gpumode import GpuMode
from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SysfsInterface


class NothingToExportError(UserError):
    """The node has no layout to export (no GPU with a vGPU manager)."""


def export_document(snapshot: NodeSnapshot, name: str) -> ConfigDocument:
    """A config document (vgpu-device-manager shape) that reproduces the live layout.

    ``default: name`` makes the config the node's when nothing else selects one, so
    planning against the document says "No changes" without ``-c``. vGPUs of a type
    the driver does not name are left out. A GPU whose vGPUs have different
    framebuffer sizes gets ``mode: mixed-size``; one read in MIG mode with GPU
    instances gets them as ``mig-geometry``. Raises :class:`NothingToExportError`
    when no GPU of the node has a vGPU manager.
    """
    layouts: list[tuple[str, _Layout]] = []
    for g in snapshot.gpus:
        if g.layout is SysfsInterface.UNAVAILABLE:
            continue
        counts: Counter[str] = Counter(v.type_name for v in g.vgpus if v.type_name)
        layouts.append((str(g.address), _layout(g, dict(sorted(counts.items())))))
    if not layouts:
        what = "no NVIDIA GPUs" if not snapshot.gpus else "no GPU with a vGPU manager"
        raise NothingToExportError(f"nothing to export: the node has {what}")
    if len({repr(c) for _, c in layouts}) == 1 and len(layouts) == len(snapshot.gpus):
        entries = [_entry("all", layouts[0][1])]
    else:
        entries = [_entry((a,), c) for a, c in layouts]
    spec = ConfigFile(
        version="v1", default=name, vgpu_configs={name: NamedConfig(entries=tuple(entries))}
    )
    return ConfigDocument(spec=spec)


_Layout = tuple[dict[str, int], GpuMode | None, dict[str, int] | None]
"""A GPU's vGPU counts, its mode where the types alone do not imply it, and its GPU
instances under MIG mode."""


def _layout(gpu: Gpu, counts: dict[str, int]) -> _Layout:
    """What reproduces ``gpu``: ``mode: mixed-size`` for vGPUs of different framebuffer
    sizes (or a GPU read in that mode), ``mig-geometry`` for the GPU instances read."""
    sizes = {
        p.framebuffer_gb
        for name in counts
        if (p := parse_type_name(name)) is not None and not p.is_mig
    }
    read = gpu.modes.mode if gpu.modes is not None else None
    mode = read if read is not None and read is not default_mode(counts) else None
    if mode is None and len(sizes) > 1:
        mode = GpuMode.MIXED_SIZE
    geometry = None
    if gpu.modes is not None and gpu.modes.mig and gpu.modes.gpu_instances:
        geometry = dict(sorted(gpu.modes.gi_counts().items()))
    return counts, mode, geometry


def _entry(devices: Literal["all"] | tuple[str, ...], layout: _Layout) -> Entry:
    counts, mode, geometry = layout
    return Entry(devices=devices, vgpu_devices=counts, mode=mode, mig_geometry=geometry)
