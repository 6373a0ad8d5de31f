"""GPUs in MIG mode or mixed-size mode as the host's sysfs shows them, for a GPU whose
modes were not read with ``nvidia-smi`` (vgpu-state changes a mode only where it
reads it: docs/plan.md, "GPU modes").

Sysfs shows MIG mode only through type names: the driver lists MIG-backed types, or
a vGPU of one exists. It does not show mixed-size mode either; a GPU whose vGPUs
have different framebuffer sizes must be in it.

Each function returns the sentences a user reads, empty when all is well.
"""

from __future__ import annotations

from vgpu_state.catalog import parse_type_name
from vgpu_state.model.snapshot import Gpu, SharedParts

MIG_LIMITATION = (
    "vgpu-state lays out a GPU in MIG mode only when it reads the GPU's modes "
    "with nvidia-smi (--nvidia-smi PATH)"
)
MIXED_SIZE_LIMITATION = (
    "vgpu-state lays out a GPU in mixed-size mode only when it reads the GPU's modes "
    "with nvidia-smi (--nvidia-smi PATH)"
)


def is_mig_backed(name: str | None) -> bool:
    """A MIG-backed type name (``A100-1-5C``); False for time-sliced and unparsable names."""
    parsed = parse_type_name(name) if name else None
    return parsed is not None and parsed.is_mig


def name_framebuffer_mib(name: str | None) -> int | None:
    """A time-sliced type's framebuffer from its name (``0`` GB is 512 MiB); None otherwise."""
    parsed = parse_type_name(name) if name else None
    if parsed is None or parsed.is_mig:
        return None
    return parsed.framebuffer_gb * 1024 or 512


def _mig_listed(gpu: Gpu) -> list[str]:
    """The MIG-backed names among a GPU's type lists (the same lists on every GPU of a
    fleet's nodes of one hardware model: see ``SharedParts``)."""

    def compute() -> list[str]:
        listed = (
            {t.name for t in gpu.offered}
            | {t.name for vf in gpu.vfs for t in vf.creatable}
            | {t.name for t in gpu.pf_creatable}
        )
        return sorted(n for n in listed if is_mig_backed(n))

    return list(SharedParts.get((gpu.offered, gpu.vfs, gpu.pf_creatable), ("mig",), compute))


def host_modes(gpu: Gpu) -> list[str]:
    """Why this GPU, whose modes were not read, is in a mode vgpu-state cannot manage
    without reading it (MIG, mixed-size); empty if none."""
    out: list[str] = []
    mig_vgpus = sorted({v.type_name or "" for v in gpu.vgpus if is_mig_backed(v.type_name)})
    mig_listed = _mig_listed(gpu)
    if mig_vgpus or mig_listed:
        seen = (
            f"it holds MIG-backed vGPUs ({', '.join(mig_vgpus)})"
            if mig_vgpus
            else f"the driver lists MIG-backed types ({', '.join(mig_listed[:3])}"
            f"{', …' if len(mig_listed) > 3 else ''})"
        )
        out.append(f"the GPU is in MIG mode: {seen}; {MIG_LIMITATION}")
    sizes: dict[int, str] = {}
    for v in gpu.vgpus:
        size = name_framebuffer_mib(v.type_name)
        if size is not None:
            sizes.setdefault(size, v.type_name or "")
    if len(sizes) > 1:
        listed_sizes = ", ".join(f"{sizes[s]} {s} MiB" for s in sorted(sizes))
        out.append(
            f"the GPU is in mixed-size mode: its vGPUs have different framebuffer sizes "
            f"({listed_sizes}); {MIXED_SIZE_LIMITATION}"
        )
    return out
