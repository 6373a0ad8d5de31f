"""A node's live vGPU layout as a config document (what ``vgpu-state export`` prints)."""

from __future__ import annotations

from collections import Counter

from vgpu_state.config.document import ConfigDocument, ConfigFile, Entry, NamedConfig
from vgpu_state.model.errors import UserError
from vgpu_state.model.snapshot import NodeSnapshot, SysfsInterface


class NothingToExportError(UserError):
    """The node has no layout to export (no GPU with a vGPU manager)."""


def export_document(snapshot: NodeSnapshot, name: str) -> ConfigDocument:
    """A config document (vgpu-device-manager shape) that reproduces the live layout.

    ``default: name`` makes the config the node's when nothing else selects one, so
    planning against the document says "No changes" without ``-c``. vGPUs of a type
    the driver does not name are left out. Raises :class:`NothingToExportError`
    when no GPU of the node has a vGPU manager.
    """
    layouts: list[tuple[str, dict[str, int]]] = []
    for g in snapshot.gpus:
        if g.layout is SysfsInterface.UNAVAILABLE:
            continue
        counts: Counter[str] = Counter(v.type_name for v in g.vgpus if v.type_name)
        layouts.append((str(g.address), dict(sorted(counts.items()))))
    if not layouts:
        what = "no NVIDIA GPUs" if not snapshot.gpus else "no GPU with a vGPU manager"
        raise NothingToExportError(f"nothing to export: the node has {what}")
    if len({tuple(c.items()) for _, c in layouts}) == 1 and len(layouts) == len(snapshot.gpus):
        entries = [Entry(devices="all", vgpu_devices=layouts[0][1])]
    else:
        entries = [Entry(devices=(a,), vgpu_devices=c) for a, c in layouts]
    spec = ConfigFile(
        version="v1", default=name, vgpu_configs={name: NamedConfig(entries=tuple(entries))}
    )
    return ConfigDocument(spec=spec)
