"""Checks of one entry against the catalog, wherever the GPU model is known.

The models an entry can lay out are those whose catalog rows have all of its
types (a type name may belong to several models: ``DC-16Q`` is a type of the
RTX PRO 6000 and of the RTX PRO 4500, with different limits), narrowed by the
device-filter. A model whose rows are inferred (incomplete) may carry a type
of its product that its rows lack: the node's driver decides, and anything the
catalog says about such a model is a warning. Checks, per model: the types
belong to one model, which the device-filter selects; time-sliced and
MIG-backed types do not mix; the entry's ``mode`` suits its types; time-sliced
types share one framebuffer size (series of the same size may mix) unless the
entry asks for the model's mixed-size mode, where they must fit its slots
(``catalog.placement``); MIG-backed types fit GPU instances of the model
(``catalog.mig``, the entry's ``mig-geometry`` or the fewest that hold them);
counts fit. An entry that fits one of its models is accepted; one whose layout
rests on an inferred rule (GPU instances, mixed-size slots) gets a note saying
so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from ruamel.yaml.nodes import Node

from vgpu_state.catalog import Catalog, GpuModel, VgpuType, parse_type_name
from vgpu_state.catalog.capacity import check_fit
from vgpu_state.catalog.mig import (
    geometry_fits,
    geometry_for,
    geometry_holds,
    mig_capable,
    mig_profiles,
    mixed_size_capable,
    profile_named,
    suggest_profile,
)
from vgpu_state.catalog.placement import Placement, place
from vgpu_state.config.filters import DeviceFilter
from vgpu_state.config.typenames import name_product
from vgpu_state.config.yamlnodes import Issues, join
from vgpu_state.model.gpumode import GpuMode


@dataclass(frozen=True)
class EntryFacts:
    path: str
    node: Node
    filters: tuple[tuple[DeviceFilter, Node], ...]
    types: dict[str, tuple[int, Node, Node]]
    """type name as written → (count, key node, count node)."""
    types_node: Node
    mode: GpuMode | None = None
    """The entry's ``mode`` as written (``None``: left out)."""
    mode_node: Node | None = None
    geometry: dict[str, tuple[int, Node, Node]] | None = None
    """``mig-geometry``: profile (lower case) → (count, key node, count node)."""
    geometry_node: Node | None = None

    @property
    def is_mig(self) -> bool:
        """Its types are MIG-backed (some of them; mixing is an error of its own)."""
        return any(_is_mig(name) for name in self.types)

    @property
    def effective_mode(self) -> GpuMode:
        """The written ``mode``, else ``mig`` for MIG-backed types, else time-sliced."""
        if self.mode is not None:
            return self.mode
        return GpuMode.MIG if self.is_mig else GpuMode.TIME_SLICED


def _is_mig(name: str) -> bool:
    parsed = parse_type_name(name)
    return parsed is not None and parsed.is_mig


def default_mode(type_names: Iterable[str]) -> GpuMode:
    """The mode of an entry that leaves ``mode`` out: ``mig`` for MIG-backed types."""
    return GpuMode.MIG if any(_is_mig(n) for n in type_names) else GpuMode.TIME_SLICED


def filter_models(f: DeviceFilter, catalog: Catalog) -> tuple[GpuModel, ...]:
    """The models a filter can select (several when a device id is shared)."""
    if f.subsystem_device_id is not None:
        found = catalog.model_for_pci(f.device_id, f.subsystem_device_id)
        candidates = catalog.models_for_device(f.device_id)
        if found is not None and (
            len(candidates) == 1 or f.subsystem_device_id in found.subsystem_device_ids
        ):
            return (found,)
        return candidates if len(candidates) == 1 else ()
    return catalog.models_for_device(f.device_id)


def family_models(name: str, catalog: Catalog) -> tuple[GpuModel, ...]:
    """The models whose type names share this name's product part (``A2`` of a newer
    driver's ``A2-3Q``; ``DC`` names types of two Blackwell models)."""
    product = name_product(name)
    if product is None:
        return ()
    return tuple(m for m in catalog.models if product in m.products)


def candidate_models(name: str, catalog: Catalog) -> tuple[GpuModel, ...]:
    """The models that may carry a type name, in catalog order: those whose catalog
    rows have it, and models with inferred rows of the same product (their rows are
    incomplete: the node's driver decides); for a name no model has, the models of
    its product.

    Answered once per (catalog, name): a layouts file names the same types in many
    entries, and each answer walks every model of the catalog."""
    return _candidate_models(catalog, name)


@lru_cache(maxsize=4096)
def _candidate_models(catalog: Catalog, name: str) -> tuple[GpuModel, ...]:
    offering = {id(m) for m in catalog.models_offering(name)}
    if not offering:
        return family_models(name, catalog)
    product = name_product(name)
    return tuple(
        m
        for m in catalog.models
        if id(m) in offering or (m.inferred and product is not None and product in m.products)
    )


@dataclass
class _Verdict:
    """What the checks say about one entry on one candidate model."""

    model: GpuModel
    problems: list[tuple[Node, str, str]]
    """(node, path, message) that make the entry impossible on this model."""
    lacking: list[tuple[Node, str, str]]
    """Types the catalog knows elsewhere that this model's (inferred) rows lack."""
    inferred: str | None = None
    """What of the layout rests on an inferred rule (a note), when it fits."""

    @property
    def fits(self) -> bool:
        return not self.problems and not self.lacking


EXPERIMENTAL = "experimental: inferred, not verified on hardware"
"""How validate, plan and the docs mark a layout that rests on an inferred rule."""

MIXED_SIZE_MODELS = "Ada, Hopper and Blackwell GPUs, by inference"
"""The models with the driver's mixed-size mode, as messages say it."""


def check_entry(facts: EntryFacts, catalog: Catalog, issues: Issues) -> None:
    vpath = join(facts.path, "vgpu-devices")
    before = len(issues.items)
    _check_mode(facts, vpath, issues)
    if len(issues.items) != before:
        return
    per_name = {name: ms for name in facts.types if (ms := candidate_models(name, catalog))}
    candidates: tuple[GpuModel, ...] | None = None
    for ms in per_name.values():
        candidates = ms if candidates is None else tuple(m for m in candidates if m in ms)
    if candidates is None:
        _check_without_types(facts, catalog, issues)
        return
    if not candidates:
        groups: dict[tuple[GpuModel, ...], str] = {}
        for name, ms in per_name.items():
            groups.setdefault(_owners(name, ms, catalog), name)
        listed = ", ".join(
            f"{name} ({_labels(catalog, models)})" for models, name in groups.items()
        )
        issues.at(
            facts.types_node,
            vpath,
            f"types of different GPU models in one entry: "
            f"{listed}; an entry lays out one kind of GPU",
        )
        return
    if facts.filters:
        per_filter = [filter_models(f, catalog) for f, _ in facts.filters]
        selectable = {m.name for models in per_filter for m in models}
        if all(per_filter):
            chosen = tuple(m for m in candidates if m.name in selectable)
            if not chosen:
                f, fnode = facts.filters[0]
                names = ", ".join(
                    sorted(catalog.label(m) for m in catalog.models if m.name in selectable)
                )
                name, ms = next(
                    (n, ms) for n, ms in per_name.items() if not {m.name for m in ms} & selectable
                )
                issues.at(
                    fnode,
                    join(facts.path, "device-filter"),
                    f"device-filter {str(f)!r} selects {names}, but {name} is a type of "
                    f"{_labels(catalog, _owners(name, ms, catalog))}",
                )
                return
            candidates = chosen
    verdicts = [_verdict(facts, m, catalog, vpath) for m in candidates]
    fitting = next((v for v in verdicts if v.fits), None)
    if fitting is not None:
        if fitting.inferred is not None:
            issues.note(facts.node, facts.path, f"{EXPERIMENTAL}: {fitting.inferred}")
        return
    if len(verdicts) == 1 and not verdicts[0].model.inferred:
        for node, path, message in verdicts[0].problems:
            issues.at(node, path, message)
        return
    if all(not v.model.inferred for v in verdicts):
        # Several models have every type: the entry fits none of them.
        v = verdicts[0]
        for node, path, message in v.problems:
            issues.at(node, path, message)
        return
    for v in verdicts:
        advisory = (
            f" ({catalog.label(v.model)}'s catalog rows are inferred; the node's driver decides)"
            if v.model.inferred
            else ""
        )
        for node, path, message in v.lacking:
            issues.warn(node, path, message)
        for node, path, message in v.problems:
            issues.warn(node, path, message + advisory)


def _check_mode(facts: EntryFacts, vpath: str, issues: Issues) -> None:
    """What needs no model: MIG-backed and time-sliced types do not mix, ``mode`` suits
    the types, ``mig-geometry`` only under ``mig``."""
    mig = [n for n in facts.types if _is_mig(n)]
    sliced = [n for n in facts.types if not _is_mig(n) and parse_type_name(n) is not None]
    if mig and sliced:
        issues.at(
            facts.types[sliced[0]][1],
            join(vpath, sliced[0]),
            f"{sliced[0]} is time-sliced and {mig[0]} is MIG-backed; one GPU runs either "
            "kind, not both",
        )
        return
    mpath = join(facts.path, "mode")
    if facts.mode is GpuMode.MIG and sliced:
        issues.at(
            facts.mode_node,
            mpath,
            f"mode: mig lays out MIG-backed types, and {sliced[0]} is time-sliced; "
            "leave mode out or write time-sliced",
        )
    elif facts.mode is not None and facts.mode is not GpuMode.MIG and mig:
        issues.at(
            facts.mode_node,
            mpath,
            f"mode: {facts.mode} lays out time-sliced types, and {mig[0]} is MIG-backed; "
            "leave mode out or write mig",
        )
    if facts.geometry is not None and facts.effective_mode is not GpuMode.MIG:
        issues.at(
            facts.geometry_node,
            join(facts.path, "mig-geometry"),
            f"mig-geometry sets GPU instances for MIG-backed types (mode: mig); this "
            f"entry's mode is {facts.effective_mode}",
        )


def _check_without_types(facts: EntryFacts, catalog: Catalog, issues: Issues) -> None:
    """An entry that names no type the catalog places (``vgpu-devices: {}``) may still set
    a mode: its ``mig-geometry`` is checked on the models its device-filter selects."""
    mode = facts.effective_mode
    if mode is GpuMode.TIME_SLICED:
        return
    models = {m.name: m for f, _ in facts.filters for m in filter_models(f, catalog)}
    if mode is GpuMode.MIG and models and not any(mig_capable(m) for m in models.values()):
        label = catalog.label(next(iter(models.values())))
        issues.at(
            facts.mode_node or facts.node,
            join(facts.path, "mode"),
            f"mode: mig: the {label} has no MIG-backed vGPU types",
        )
        return
    if mode is GpuMode.MIG and facts.geometry is not None:
        geometry = tuple(sorted((n, c) for n, (c, _, _) in facts.geometry.items()))
        reasons = [why for m in models.values() if (why := geometry_fits(m, geometry))]
        if models and len(reasons) == len(models):
            issues.at(
                facts.geometry_node or facts.node,
                join(facts.path, "mig-geometry"),
                f"mig-geometry: {reasons[0]}",
            )
            return
        checked = "" if models else " (no device-filter names the GPU model: not checked)"
        note = _gi_note(geometry, given=True) + checked
    elif mode is GpuMode.MIG:
        note = "MIG mode without GPU instances"
    else:
        if models and not any(mixed_size_capable(m) for m in models.values()):
            label = catalog.label(next(iter(models.values())))
            issues.at(
                facts.mode_node or facts.node,
                join(facts.path, "mode"),
                f"mode: mixed-size: the {label} has no mixed-size mode (the driver has it "
                f"for {MIXED_SIZE_MODELS})",
            )
            return
        note = MIXED_SIZE_NOTE
    issues.note(facts.node, facts.path, f"{EXPERIMENTAL}: {note}")


def _owners(name: str, ms: tuple[GpuModel, ...], catalog: Catalog) -> tuple[GpuModel, ...]:
    """The models a name is "a type of" in messages: those whose rows list it."""
    return catalog.models_offering(name) or ms


def _labels(catalog: Catalog, models: tuple[GpuModel, ...]) -> str:
    return " or ".join(catalog.label(m) for m in models)


def _verdict(facts: EntryFacts, model: GpuModel, catalog: Catalog, vpath: str) -> _Verdict:
    known: list[tuple[str, VgpuType, int, Node, Node]] = []
    family: list[tuple[str, Node]] = []
    lacking: list[tuple[Node, str, str]] = []
    label = catalog.label(model)
    for name, (count, key_node, count_node) in facts.types.items():
        t = model.type(name)
        if t is not None:
            known.append((name, t, count, key_node, count_node))
            continue
        family.append((name, key_node))
        if catalog.knows(name):
            lacking.append(
                (
                    key_node,
                    join(vpath, name),
                    f"{name} is not among the catalog's types of {label}, whose rows are "
                    "inferred (incomplete); the node's driver decides whether it offers it",
                )
            )
    problems: list[tuple[Node, str, str]] = []
    inferred: str | None = None
    if facts.mode is GpuMode.MIXED_SIZE and not mixed_size_capable(model):
        problems = [
            (
                facts.mode_node or facts.node,
                join(facts.path, "mode"),
                f"mode: mixed-size: the {label} has no mixed-size mode (the driver has it "
                f"for {MIXED_SIZE_MODELS})",
            )
        ]
    if known and not problems:
        problems, inferred = _fit_problems(facts, label, model, known, vpath)
    if not problems:
        problems = _family_size_problems(facts, label, model, known, family, vpath)
    if facts.effective_mode is GpuMode.MIXED_SIZE and inferred is None and not problems:
        inferred = MIXED_SIZE_NOTE
    return _Verdict(model=model, problems=problems, lacking=lacking, inferred=inferred)


MIXED_SIZE_NOTE = (
    "mixed-size mode; where vGPUs of different sizes go (slots of the framebuffer, "
    "each size on its own boundary) is a model of the driver's placement"
)


def _two_sizes(first: tuple[str, int], other: tuple[str, int], label: str, model: GpuModel) -> str:
    """Why two framebuffer sizes in an entry without ``mode: mixed-size`` are refused."""
    head = (
        f"{first[0]} ({first[1]} MiB) and {other[0]} ({other[1]} MiB) in one entry: vGPUs "
        "on one GPU share one framebuffer size (series of the same size may mix) unless "
        "the GPU is in mixed-size mode; "
    )
    if mixed_size_capable(model):
        return head + "add mode: mixed-size to this entry"
    return head + (
        f"the {label} has no mixed-size mode (the driver has it for {MIXED_SIZE_MODELS})"
    )


def _family_size_problems(
    facts: EntryFacts,
    label: str,
    model: GpuModel,
    known: list[tuple[str, VgpuType, int, Node, Node]],
    family: list[tuple[str, Node]],
    vpath: str,
) -> list[tuple[Node, str, str]]:
    """A type the model's rows lack still states its size: one framebuffer size per GPU
    (outside mixed-size mode)."""
    if not family or any(t.is_mig for _, t, *_ in known):
        return []
    if facts.effective_mode is GpuMode.MIXED_SIZE:
        return []
    sizes: dict[int, str] = {t.framebuffer_mib: n for n, t, *_ in known}
    for name, key_node in family:
        parsed = parse_type_name(name)
        if parsed is None or parsed.is_mig:
            continue
        size = parsed.framebuffer_gb * 1024 or 512
        other = next(((s, n) for s, n in sizes.items() if s != size), None)
        if other is not None:
            return [
                (
                    key_node,
                    join(vpath, name),
                    _two_sizes((other[1], other[0]), (name, size), label, model),
                )
            ]
        sizes.setdefault(size, name)
    return []


def _fit_problems(
    facts: EntryFacts,
    label: str,
    model: GpuModel,
    known: list[tuple[str, VgpuType, int, Node, Node]],
    vpath: str,
) -> tuple[list[tuple[Node, str, str]], str | None]:
    """What makes the known types impossible on ``model``, and (when nothing does)
    which inferred rule the layout rests on."""
    out: list[tuple[Node, str, str]] = []
    mig = [k for k in known if k[1].is_mig]
    sliced = [k for k in known if not k[1].is_mig]
    fit = check_fit([(t, count) for _, t, count, *_ in known])
    for name, t, count, _, count_node in known:
        if (t, count) in fit.over_type:
            out.append(
                (
                    count_node,
                    join(vpath, name),
                    f"{name}: {count} exceeds {t.max_instances}, the most one {label} holds",
                )
            )
    if out:
        return out, None
    if mig:
        return _mig_problems(facts, label, model, mig, vpath)
    if facts.effective_mode is GpuMode.MIXED_SIZE:
        result = place(model, {t.name: count for _, t, count, *_ in sliced})
        if not isinstance(result, Placement):
            return [(facts.types_node, vpath, f"mode: mixed-size: {result}")], None
        return [], MIXED_SIZE_NOTE
    if fit.mixed_sizes:
        sizes = sorted({t.framebuffer_mib for _, t, *_ in sliced})
        first = next(k for k in sliced if k[1].framebuffer_mib == sizes[0])
        other = next(k for k in sliced if k[1].framebuffer_mib != sizes[0])
        message = _two_sizes(
            (first[0], first[1].framebuffer_mib), (other[0], other[1].framebuffer_mib), label, model
        )
        return [(other[3], join(vpath, other[0]), message)], None
    if fit.over_total is not None:
        total, limit, size = fit.over_total
        out.append(
            (
                sliced[0][3],
                vpath,
                f"{total} vGPUs of {size} MiB exceed {limit}, the most one {label} holds",
            )
        )
    return out, None


def _mig_problems(
    facts: EntryFacts,
    label: str,
    model: GpuModel,
    mig: list[tuple[str, VgpuType, int, Node, Node]],
    vpath: str,
) -> tuple[list[tuple[Node, str, str]], str | None]:
    """MIG-backed types on ``model``: the GPU instances (``mig-geometry`` or the fewest
    that hold them) fit the GPU and hold the types."""
    counts = {t.name: count for _, t, count, *_ in mig}
    gpath = join(facts.path, "mig-geometry")
    if facts.geometry is None:
        geometry = geometry_for(model, counts)
        why = geometry_fits(model, geometry)
        if why is not None:
            listed = ", ".join(f"{p}: {n}" for p, n in geometry)
            return [
                (
                    facts.types_node,
                    vpath,
                    f"the MIG-backed types need GPU instances {listed} on one {label}: {why}",
                )
            ], None
        return [], _gi_note(geometry, given=False)
    for name, (_, key_node, _) in facts.geometry.items():
        if profile_named(model, name) is None:
            hint = suggest_profile(model, name)
            known = ", ".join(p.name for p in mig_profiles(model))
            tail = f"; did you mean {hint}?" if hint else ""
            return [
                (
                    key_node,
                    join(gpath, name),
                    f"the {label} has no GPU instance profile {name} ({known}){tail}",
                )
            ], None
    geometry = tuple(sorted((name, count) for name, (count, _, _) in facts.geometry.items()))
    why = geometry_fits(model, geometry) or geometry_holds(model, geometry, counts)
    if why is not None:
        return [(facts.geometry_node or facts.node, gpath, f"mig-geometry: {why}")], None
    return [], _gi_note(geometry, given=True)


def _gi_note(geometry: tuple[tuple[str, int], ...], *, given: bool) -> str:
    listed = ", ".join(f"{p}: {n}" for p, n in geometry) or "none"
    source = "mig-geometry" if given else "the fewest that hold the types"
    return (
        f"MIG-backed vGPUs in GPU instances {listed} ({source}); the GPU instance "
        "profiles and how many fit one GPU are derived from the catalog's type limits"
    )
