"""Checks of one entry against the catalog, wherever the GPU model is known.

The model of an entry is known from its types (every catalog type belongs to
one model) or, failing that, from a device-filter that names exactly one
model. Checks: the types belong to one model, which the device-filter
selects; time-sliced and MIG-backed types do not mix; time-sliced types share
one framebuffer size (series of the same size may mix); counts fit.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    filter_node: Node | None
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


def _label(model: GpuModel) -> str:
    return model.short_name


def family_model(name: str, catalog: Catalog) -> GpuModel | None:
    """The model a type name belongs to: the catalog's, else the model whose types
    share the name's product part (``A2`` of a newer driver's ``A2-3Q``)."""
    t = catalog.type(name)
    if t is not None:
        return catalog.model(t.model)
    product = name_product(name)
    if product is None:
        return None
    for m in catalog.models:
        if m.short_name == product:
            return m
    return None


def check_entry(facts: EntryFacts, catalog: Catalog, issues: Issues) -> None:
    known: list[tuple[str, VgpuType, int, Node, Node]] = []
    family: list[tuple[str, GpuModel, Node]] = []
    for name, (count, key_node, count_node) in facts.types.items():
        t = catalog.type(name)
        if t is not None:
            known.append((name, t, count, key_node, count_node))
            continue
        m = family_model(name, catalog)
        if m is not None:
            family.append((name, m, key_node))
    vpath = join(facts.path, "vgpu-devices")

    type_models: dict[str, str] = {}
    for name, t, *_ in known:
        type_models.setdefault(t.model, name)
    for name, m, _ in family:
        type_models.setdefault(m.name, name)
    if len(type_models) > 1:
        listed = ", ".join(
            f"{name} ({_label(_model(catalog, m))})" for m, name in type_models.items()
        )
        issues.at(
            facts.types_node,
            vpath,
            f"types of different GPU models in one entry: "
            f"{listed}; an entry lays out one kind of GPU",
        )
        return

    model: GpuModel | None = _model(catalog, next(iter(type_models))) if type_models else None
    if facts.filters:
        per_filter = [filter_models(f, catalog) for f, _ in facts.filters]
        selectable = {m.name for models in per_filter for m in models}
        if model is not None and all(per_filter) and model.name not in selectable:
            f, fnode = facts.filters[0]
            names = ", ".join(sorted(_label(_model(catalog, m)) for m in selectable))
            fpath = join(facts.path, "device-filter")
            issues.at(
                fnode,
                fpath,
                f"device-filter {str(f)!r} selects {names}, but "
                f"{type_models[model.name]} is a type of {_label(model)}",
            )
            return
        if model is None and len(selectable) == 1 and all(per_filter):
            model = _model(catalog, next(iter(selectable)))
    if model is None:
        return
    if known:
        _check_fit(model, known, vpath, issues)
    _check_family_sizes(known, family, vpath, issues)


def _check_family_sizes(
    known: list[tuple[str, VgpuType, int, Node, Node]],
    family: list[tuple[str, GpuModel, Node]],
    vpath: str,
    issues: Issues,
) -> None:
    """A type the catalog lacks still states its size: one framebuffer size per GPU."""
    if not family or any(t.is_mig for _, t, *_ in known):
        return
    sizes: dict[int, str] = {t.framebuffer_mib: n for n, t, *_ in known}
    for name, _, key_node in family:
        parsed = parse_type_name(name)
        if parsed is None or parsed.is_mig:
            continue
        size = parsed.framebuffer_gb * 1024 or 512
        other = next(((s, n) for s, n in sizes.items() if s != size), None)
        if other is not None:
            issues.at(
                key_node,
                join(vpath, name),
                f"{other[1]} ({other[0]} MiB) and {name} ({size} MiB) in one entry: vGPUs on "
                "one GPU share one framebuffer size (series of the same size may mix)",
            )
            return
        sizes.setdefault(size, name)


def _model(catalog: Catalog, name: str) -> GpuModel:
    found = catalog.model(name)
    assert found is not None
    return found


def _check_fit(
    model: GpuModel, known: list[tuple[str, VgpuType, int, Node, Node]], vpath: str, issues: Issues
) -> None:
    label = _label(model)
    mig = [k for k in known if k[1].is_mig]
    sliced = [k for k in known if not k[1].is_mig]
    if mig and sliced:
        issues.at(
            sliced[0][3],
            join(vpath, sliced[0][0]),
            f"{sliced[0][0]} is time-sliced and {mig[0][0]} is MIG-backed; one GPU runs "
            "either kind, not both",
        )
        return
    fit = check_fit([(t, count) for _, t, count, *_ in known])
    for name, t, count, _, count_node in known:
        if (t, count) in fit.over_type:
            issues.at(
                count_node,
                join(vpath, name),
                f"{name}: {count} exceeds {t.max_instances}, the most one {label} holds",
            )
    if fit.over_type:
        return
    if sliced:
        if fit.mixed_sizes:
            sizes = sorted({t.framebuffer_mib for _, t, *_ in sliced})
            first = next(k for k in sliced if k[1].framebuffer_mib == sizes[0])
            other = next(k for k in sliced if k[1].framebuffer_mib != sizes[0])
            issues.at(
                other[3],
                join(vpath, other[0]),
                f"{first[0]} ({first[1].framebuffer_mib} MiB) and {other[0]} "
                f"({other[1].framebuffer_mib} MiB) in one entry: vGPUs on one GPU share "
                "one framebuffer size (series of the same size may mix)",
            )
            return
        if fit.over_total is not None:
            total, limit, size = fit.over_total
            issues.at(
                sliced[0][3],
                vpath,
                f"{total} vGPUs of {size} MiB exceed {limit}, the most one {label} holds",
            )
    if mig:
        slices = max(
            (t.max_instances * (t.mig_slices or 1) for t in model.types if t.is_mig), default=0
        )
        used = sum(count * (t.mig_slices or 1) for _, t, count, *_ in mig)
        if used > slices:
            issues.at(
                mig[0][3],
                vpath,
                f"the MIG-backed types use {used} slices; one {label} has {slices}",
            )
