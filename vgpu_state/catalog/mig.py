"""MIG GPU instance (GI) profiles, derived from a model's MIG-backed vGPU types.

No source lists which GI profile each MIG-backed vGPU type lives in, nor how
many GIs of each profile fit one GPU; they are derived here from the catalog's
type limits. Everything in this module is an INFERENCE (reference:
nvidia-sysfs.md §5.4): validate and plan say so, and a real driver's answers
(``nvidia-smi mig -lgi``, a refused ``-cgi``) win over it.

The rule, for a model's MIG-backed type ``<P>-<g>-<N><series>[ME]``:

* the model has ``S`` compute slices: the largest ``g`` among its MIG-backed
  types (A100: 7, A30: 4, RTX PRO 6000 Blackwell: 4);
* a type whose ``max_instances`` is at most ``S // g`` has a GI profile of its
  own: one vGPU per GI, GI memory = the type's framebuffer, ``max_instances``
  GIs per GPU;
* any other type shares the GI of the largest-framebuffer MIG-backed type
  with the same ``g`` (and the same ``ME`` suffix), holding
  ``max_instances / (GIs of that profile per GPU)`` vGPUs per GI
  (``Max Instances = Max Instances Per GI × GIs`` held for every MIG-backed type
  of an RTX PRO 6000 Blackwell, §5.4);
* the profile's name is ``{g}g.{GI memory // 1024}gb``, with ``+me`` for the
  ``ME`` (media engine) types: ``DC-1-24Q`` → ``1g.24gb``, ``DC-1-12Q`` →
  ``1g.24gb`` (2 per GI), ``A100-1-5CME`` → ``1g.5gb+me``.

A set of GIs (a *geometry*) fits one GPU when no profile exceeds its own
per-GPU count, the compute slices add up to at most ``S`` and the GI memory to
at most the GPU's framebuffer. Memory is counted in units of the smallest GI's
memory, each GI rounded to whole units: the profile names are nominal (an
H100 NVL holds four ``1g.24gb`` GIs, 96 GiB by name, in 94 GB), and the
driver's own counts (``max_instances``) must fit. A GI holds vGPUs of one
framebuffer size only; Q, A, B and C series of that size may share it
[REPORTED §5.4].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vgpu_state.catalog.catalog import GpuModel, VgpuType, suggest
from vgpu_state.catalog.names import parse_type_name

ME_SUFFIX = "ME"
"""The type-name suffix of MIG-backed types whose GI has the media engines."""


@dataclass(frozen=True)
class GiProfile:
    """A MIG GPU instance profile of one model (as ``nvidia-smi mig -lgip`` names it)."""

    name: str
    """``1g.24gb``, ``1g.5gb+me``."""
    slices: int
    """Compute slices (the ``g``)."""
    memory_mib: int
    """Nominal memory: the framebuffer of the largest type it holds."""
    max_per_gpu: int
    """GIs of this profile one GPU holds when it holds no other GI."""


@dataclass(frozen=True)
class _MigFacts:
    """A model's derived MIG facts (computed once per model)."""

    slices: int
    memory_unit_mib: int
    memory_units: int
    profiles: tuple[GiProfile, ...]
    by_type: Mapping[str, tuple[GiProfile, int]]
    """Type name → (its GI profile, vGPUs of it one GI holds)."""


def mig_capable(model: GpuModel) -> bool:
    """The model has MIG-backed vGPU types (the catalog lists some)."""
    return any(t.is_mig for t in model.types)


def mixed_size_capable(model: GpuModel) -> bool:
    """The model runs the driver's mixed-size (heterogeneous) mode.

    INFERENCE: the vendor-VFIO generation (Ada, Hopper, Blackwell) does, older
    models do not; the catalog's ``models.csv`` marks them (column
    ``mixed_size``: ``inferred``)."""
    return bool(model.mixed_size)


def gi_profile_for(model: GpuModel, type_name: str) -> tuple[GiProfile, int] | None:
    """The GI profile a MIG-backed type of ``model`` lives in, and how many vGPUs of
    it one GI holds; ``None`` for a time-sliced type or one the model lacks."""
    t = model.type(type_name)
    if t is None or not t.is_mig:
        return None
    return _facts(model).by_type.get(t.name)


def mig_profiles(model: GpuModel) -> tuple[GiProfile, ...]:
    """The model's GI profiles, by slices then memory then name; ``()`` without MIG."""
    return _facts(model).profiles


def mig_slices(model: GpuModel) -> int:
    """The model's compute slices (the largest ``g`` of its MIG-backed types); 0 without
    MIG."""
    return _facts(model).slices


def profile_named(model: GpuModel, name: str) -> GiProfile | None:
    """The model's GI profile of that name (``MIG `` prefix and case ignored)."""
    wanted = name.strip().removeprefix("MIG ").strip().lower()
    for p in mig_profiles(model):
        if p.name == wanted:
            return p
    return None


def suggest_profile(model: GpuModel, name: str) -> str | None:
    """The model's profile name closest to ``name``, if any is close."""
    return suggest(name, [p.name for p in mig_profiles(model)])


def geometry_for(model: GpuModel, types: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """The fewest GIs that hold ``types`` (type name → count): per profile, sorted
    by profile name. Types of one framebuffer size share GIs (any series); types
    that are not MIG-backed types of the model take no GI."""
    needed: dict[str, int] = {}
    for group in _groups(model, types):
        needed[group.profile.name] = needed.get(group.profile.name, 0) + group.gis
    return tuple(sorted(needed.items()))


def geometry_fits(model: GpuModel, geometry: Sequence[tuple[str, int]]) -> str | None:
    """``None`` when one GPU of ``model`` holds these GIs (profile name → count), else
    why not (inferred; see the module's rule)."""
    facts = _facts(model)
    if not facts.profiles:
        return f"the {model.name} has no MIG-backed vGPU types (no GPU instances)"
    slices = units = 0
    for name, count in geometry:
        profile = profile_named(model, name)
        if profile is None:
            hint = suggest_profile(model, name)
            tail = f"; did you mean {hint}?" if hint else ""
            known = ", ".join(p.name for p in facts.profiles)
            return f"the {model.name} has no GPU instance profile {name!r} ({known}){tail}"
        if count < 0:
            return f"{name}: {count} GPU instances"
        if count > profile.max_per_gpu:
            return (
                f"{count} × {profile.name} exceed {profile.max_per_gpu}, the most one "
                f"{model.name} holds"
            )
        slices += count * profile.slices
        units += count * _units(facts, profile)
    if slices > facts.slices:
        return (
            f"the GPU instances ({_listed(geometry)}) take {slices} compute slices; "
            f"one {model.name} has {facts.slices}"
        )
    if units > facts.memory_units:
        return (
            f"the GPU instances ({_listed(geometry)}) take {units} memory slices of "
            f"{facts.memory_unit_mib} MiB; one {model.name} has {facts.memory_units}"
        )
    return None


def geometry_holds(
    model: GpuModel, geometry: Sequence[tuple[str, int]], types: Mapping[str, int]
) -> str | None:
    """``None`` when GIs of ``geometry`` hold ``types`` (each GI one framebuffer size,
    at most its per-GI count of each), else why not."""
    have = {name.strip().lower(): count for name, count in geometry}
    wants: dict[str, list[_Group]] = {}
    for group in _groups(model, types):
        wants.setdefault(group.profile.name, []).append(group)
    for name, groups in sorted(wants.items()):
        total = sum(g.gis for g in groups)
        if total <= have.get(name, 0):
            continue
        parts = "; ".join(
            ", ".join(f"{n}: {c} ({group.per_gi} per GPU instance)" for n, c in group.types)
            + f" need {group.gis}"
            for group in groups
        )
        return (
            f"the types need {total} GPU instance{'s' if total != 1 else ''} {name} "
            f"({parts}; one framebuffer size per GPU instance); mig-geometry has "
            f"{have.get(name, 0)}"
        )
    return None


def _listed(geometry: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{name}: {count}" for name, count in geometry)


def _units(facts: _MigFacts, profile: GiProfile) -> int:
    return max(1, round(profile.memory_mib / facts.memory_unit_mib))


@dataclass(frozen=True)
class _Group:
    """vGPUs of one framebuffer size in GIs of one profile."""

    profile: GiProfile
    framebuffer_mib: int
    types: tuple[tuple[str, int], ...]
    """(type name, count) of this size."""
    per_gi: int
    """vGPUs one GI holds (the smallest per-GI count among the types)."""

    @property
    def gis(self) -> int:
        return math.ceil(sum(c for _, c in self.types) / self.per_gi)


def _groups(model: GpuModel, types: Mapping[str, int]) -> list[_Group]:
    """The wanted vGPUs by (profile, framebuffer size), in the order first named."""
    found: dict[tuple[str, int], _Group] = {}
    for name, count in types.items():
        t = model.type(name)
        at = gi_profile_for(model, name)
        if t is None or at is None or count <= 0:
            continue
        profile, per_gi = at
        key = (profile.name, t.framebuffer_mib)
        old = found.get(key)
        if old is None:
            found[key] = _Group(profile, t.framebuffer_mib, ((name, count),), per_gi)
        else:
            found[key] = _Group(
                profile, t.framebuffer_mib, (*old.types, (name, count)), min(old.per_gi, per_gi)
            )
    return list(found.values())


def _family(t: VgpuType) -> str:
    parsed = parse_type_name(t.name)
    return ME_SUFFIX if parsed is not None and parsed.suffix.startswith(ME_SUFFIX) else ""


def _profile_name(slices: int, memory_mib: int, family: str) -> str:
    return f"{slices}g.{memory_mib // 1024}gb" + ("+me" if family == ME_SUFFIX else "")


_FACTS: dict[int, tuple[GpuModel, _MigFacts]] = {}


def _facts(model: GpuModel) -> _MigFacts:
    """The model's facts, derived once per model object (a catalog's models live as
    long as the process; hashing a model hashes all its types)."""
    cached = _FACTS.get(id(model))
    if cached is not None and cached[0] is model:
        return cached[1]
    facts = _derive(model)
    if len(_FACTS) > 1024:
        _FACTS.clear()
    _FACTS[id(model)] = (model, facts)
    return facts


def _derive(model: GpuModel) -> _MigFacts:
    mig = [t for t in model.types if t.is_mig and t.mig_slices]
    if not mig:
        return _MigFacts(0, 0, 0, (), {})
    total = max(t.mig_slices or 0 for t in mig)
    own: dict[str, GiProfile] = {}
    by_type: dict[str, tuple[GiProfile, int]] = {}
    for t in mig:
        g = t.mig_slices or 1
        if t.max_instances <= total // g:
            name = _profile_name(g, t.framebuffer_mib, _family(t))
            profile = GiProfile(name, g, t.framebuffer_mib, t.max_instances)
            own.setdefault(name, profile)
            by_type[t.name] = (own[name], 1)
    for t in mig:
        if t.name in by_type:
            continue
        g = t.mig_slices or 1
        hosts = [
            h for h in mig if h.mig_slices == g and _family(h) == _family(t) and h.name in by_type
        ]
        if not hosts:
            continue
        host = max(hosts, key=lambda h: (h.framebuffer_mib, h.name))
        profile = by_type[host.name][0]
        by_type[t.name] = (profile, max(1, t.max_instances // profile.max_per_gpu))
    profiles = tuple(sorted(own.values(), key=lambda p: (p.slices, p.memory_mib, p.name)))
    unit = min(p.memory_mib for p in profiles)
    return _MigFacts(
        slices=total,
        memory_unit_mib=unit,
        memory_units=max(1, round(model.framebuffer_mib / unit)),
        profiles=profiles,
        by_type=by_type,
    )
