"""The in-use set (vGPUs that pods or VMs hold), in the same key form as the snapshot."""

from __future__ import annotations

from collections.abc import Mapping

from vgpu_state.model.ids import is_canonical_uuid
from vgpu_state.model.pci import parse_pci_address
from vgpu_state.model.snapshot import NodeSnapshot


def normalise_key(key: str) -> str:
    """An mdev UUID in lower case, a PCI address in its canonical long form."""
    text = key.strip()
    if is_canonical_uuid(text.lower()):
        return text.lower()
    try:
        return parse_pci_address(text)
    except ValueError:
        return text


def normalise_in_use(
    held: Mapping[str, str], snapshot: NodeSnapshot
) -> tuple[dict[str, str], list[str]]:
    """``held`` with normalised keys, and a warning for each key that matches no vGPU."""
    if not held:
        return {}, []
    keys = {v.key for g in snapshot.gpus for v in g.vgpus}
    out: dict[str, str] = {}
    warnings: list[str] = []
    for key, holder in held.items():
        norm = normalise_key(key)
        out[norm] = holder
        if norm not in keys:
            warnings.append(f"in-use key {key!r} (held by {holder}) matches no vGPU on this node")
    return out, warnings
