"""The simulated driver's MIG GPU instance profiles, derived from a model's MIG-backed types.

For a MIG-backed type ``<P>-<g>-<N><series>[suffix]`` on a model whose largest
``g`` is ``S`` (the GPU's compute slices): a type with ``max_instances <= S // g``
has a GPU instance profile of its own (one vGPU per instance, instance memory =
its framebuffer); any other type shares the instance of the largest-framebuffer
type with the same ``g`` and suffix, ``max_instances`` divided among the
instances of that profile that fit. The profile is named ``<g>g.<GiB>gb``
(``+me`` for ``ME`` types). This is an inference from published counts (the
driver's own instance profiles are not in any table), and a real driver's
``nvidia-smi`` answers win over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from vgpu_state.catalog import GpuModel, VgpuType, parse_type_name

_SUFFIX_NAMES = {"ME": "+me", "MEALL": "+me.all", "NOME": "-me"}


@dataclass(frozen=True)
class GiProfile:
    """A GPU instance profile: its name, compute slices, memory and how many fit one GPU."""

    name: str
    slices: int
    memory_mib: int
    max_per_gpu: int


def _family(t: VgpuType) -> tuple[int, str]:
    parsed = parse_type_name(t.name)
    suffix = parsed.suffix if parsed is not None and parsed.suffix != "GFX" else ""
    return (t.mig_slices or 0, suffix)


def total_slices(types: tuple[VgpuType, ...]) -> int:
    """The GPU's compute slices: the largest ``g`` among its MIG-backed types (0: no MIG)."""
    return max((t.mig_slices or 0 for t in types if t.is_mig), default=0)


@lru_cache(maxsize=64)
def _profiles(types: tuple[VgpuType, ...]) -> dict[str, tuple[GiProfile, int]]:
    """Each MIG-backed type's (profile, vGPUs per instance), by type name."""
    s = total_slices(types)
    found: dict[str, tuple[GiProfile, int]] = {}
    mig = [t for t in types if t.is_mig]
    for t in mig:
        g = t.mig_slices or 1
        fits = max(s // g, 1)
        family = [x for x in mig if _family(x) == _family(t)]
        if t.max_instances <= fits:
            host = t
        else:
            host = max(family, key=lambda x: (x.framebuffer_mib, -x.max_instances))
        host_count = min(host.max_instances, fits)
        suffix = _SUFFIX_NAMES.get(_family(t)[1], "")
        profile = GiProfile(
            name=f"{g}g.{host.framebuffer_mib // 1024}gb{suffix}",
            slices=g,
            memory_mib=host.framebuffer_mib,
            max_per_gpu=host_count,
        )
        per_gi = 1 if host is t else max(t.max_instances // max(host_count, 1), 1)
        found[t.name] = (profile, per_gi)
    return found


def gi_profile_for(model: GpuModel, type_name: str) -> tuple[GiProfile, int] | None:
    """The GPU instance profile a MIG-backed type of ``model`` lives in, and how many
    vGPUs of that type one instance holds; ``None`` for a time-sliced or unknown type."""
    t = model.type(type_name)
    if t is None or not t.is_mig:
        return None
    return _profiles(model.types).get(t.name)


def mig_profiles(model: GpuModel) -> tuple[GiProfile, ...]:
    """Every GPU instance profile of ``model``, by slices then memory."""
    seen = {p.name: p for p, _ in _profiles(model.types).values()}
    return tuple(sorted(seen.values(), key=lambda p: (p.slices, p.memory_mib, p.name)))
