"""Checks of one entry against the catalog, wherever the GPU model is known.

The models an entry can lay out are those whose catalog rows have all of its
types (a type name may belong to several models: ``DC-16Q`` is a type of the
RTX PRO 6000 and of the RTX PRO 4500, with different limits), narrowed by the
device-filter. A model whose rows are inferred (incomplete) may carry a type
of its product that its rows lack: the node's driver decides, and anything the
catalog says about such a model is a warning. Checks, per model: the types
belong to one model, which the device-filter selects; time-sliced and
MIG-backed types do not mix; time-sliced types share one framebuffer size
(series of the same size may mix); counts fit. An entry that fits one of its
models is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ruamel.yaml.nodes import Node

from vgpu_state.catalog import Catalog, GpuModel, VgpuType, parse_type_name
from vgpu_state.catalog.capacity import check_fit
from vgpu_state.config.filters import DeviceFilter
from vgpu_state.config.typenames import name_product
from vgpu_state.config.yamlnodes import Issues, join


@dataclass(frozen=True)
class EntryFacts:
    path: str
    node: Node
    filters: tuple[tuple[DeviceFilter, Node], ...]
    types: dict[str, tuple[int, Node, Node]]
    """type name as written → (count, key node, count node)."""
    types_node: Node


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
        if id(m) in offering
        or (m.inferred and product is not None and product in m.products)
    )


@dataclass
class _Verdict:
    """What the checks say about one entry on one candidate model."""

    model: GpuModel
    problems: list[tuple[Node, str, str]]
    """(node, path, message) that make the entry impossible on this model."""
    lacking: list[tuple[Node, str, str]]
    """Types the catalog knows elsewhere that this model's (inferred) rows lack."""

    @property
    def fits(self) -> bool:
        return not self.problems and not self.lacking


MIG_UNSUPPORTED = (
    "vgpu-state does not lay out MIG-backed vGPUs (it neither turns on MIG mode nor "
    "creates GPU instances): planning a GPU this entry selects fails; "
    "see docs/config.md#what-vgpu-state-does-not-do"
)
"""Why a MIG-backed type in a layout is a warning here and a planning error on a node."""

EQUAL_SIZE_ONLY = (
    "vgpu-state keeps GPUs in the driver's equal-size mode (mixed-size mode is not supported)"
)


def check_entry(facts: EntryFacts, catalog: Catalog, issues: Issues) -> None:
    vpath = join(facts.path, "vgpu-devices")
    for name, (_, key_node, _) in facts.types.items():
        parsed = parse_type_name(name)
        if parsed is not None and parsed.is_mig:
            issues.warn(key_node, join(vpath, name), f"{name} is MIG-backed: {MIG_UNSUPPORTED}")
    per_name = {name: ms for name in facts.types if (ms := candidate_models(name, catalog))}
    candidates: tuple[GpuModel, ...] | None = None
    for ms in per_name.values():
        candidates = ms if candidates is None else tuple(m for m in candidates if m in ms)
    if candidates is None:
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
    if any(v.fits for v in verdicts):
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
    if known:
        problems = _fit_problems(label, model, known, vpath)
    if not problems:
        problems = _family_size_problems(known, family, vpath)
    return _Verdict(model=model, problems=problems, lacking=lacking)


def _family_size_problems(
    known: list[tuple[str, VgpuType, int, Node, Node]],
    family: list[tuple[str, Node]],
    vpath: str,
) -> list[tuple[Node, str, str]]:
    """A type the model's rows lack still states its size: one framebuffer size per GPU."""
    if not family or any(t.is_mig for _, t, *_ in known):
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
                    f"{other[1]} ({other[0]} MiB) and {name} ({size} MiB) in one entry: vGPUs "
                    "on one GPU share one framebuffer size (series of the same size may mix); "
                    + EQUAL_SIZE_ONLY,
                )
            ]
        sizes.setdefault(size, name)
    return []


def _fit_problems(
    label: str,
    model: GpuModel,
    known: list[tuple[str, VgpuType, int, Node, Node]],
    vpath: str,
) -> list[tuple[Node, str, str]]:
    out: list[tuple[Node, str, str]] = []
    mig = [k for k in known if k[1].is_mig]
    sliced = [k for k in known if not k[1].is_mig]
    if mig and sliced:
        return [
            (
                sliced[0][3],
                join(vpath, sliced[0][0]),
                f"{sliced[0][0]} is time-sliced and {mig[0][0]} is MIG-backed; one GPU runs "
                "either kind, not both",
            )
        ]
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
    if fit.over_type:
        return out
    if sliced:
        if fit.mixed_sizes:
            sizes = sorted({t.framebuffer_mib for _, t, *_ in sliced})
            first = next(k for k in sliced if k[1].framebuffer_mib == sizes[0])
            other = next(k for k in sliced if k[1].framebuffer_mib != sizes[0])
            return [
                (
                    other[3],
                    join(vpath, other[0]),
                    f"{first[0]} ({first[1].framebuffer_mib} MiB) and {other[0]} "
                    f"({other[1].framebuffer_mib} MiB) in one entry: vGPUs on one GPU share "
                    "one framebuffer size (series of the same size may mix); " + EQUAL_SIZE_ONLY,
                )
            ]
        if fit.over_total is not None:
            total, limit, size = fit.over_total
            out.append(
                (
                    sliced[0][3],
                    vpath,
                    f"{total} vGPUs of {size} MiB exceed {limit}, the most one {label} holds",
                )
            )
    if mig:
        slices = max(
            (t.max_instances * (t.mig_slices or 1) for t in model.types if t.is_mig), default=0
        )
        used = sum(count * (t.mig_slices or 1) for _, t, count, *_ in mig)
        if used > slices:
            out.append(
                (
                    mig[0][3],
                    vpath,
                    f"the MIG-backed types use {used} slices; one {label} has {slices}",
                )
            )
    return out
