"""Resolve a selected config onto a node's GPUs: the desired layout per GPU.

An entry applies to a GPU when its ``devices`` (``all``, an index or a PCI
address) and its ``device-filter`` match **and** the GPU's model offers every
type the entry lists (a GPU of unknown model accepts the types as they are).
The last condition exists because real vgpu-device-manager configs list one
entry per model under the same device id (A2 and A16 share ``0x25B6``), each
with that model's types: without it both entries would claim both GPUs.

More than one applicable entry for one GPU is an error naming both entries;
a GPU no entry covers is *unmanaged* and is never touched. An entry whose
``devices`` or ``device-filter`` select no GPU of the node (``devices: [0, 1]``
on a one-GPU node, as vgpu-device-manager's files have) is *skipped* and listed
(``DesiredState.skipped``); ``strict`` or ``policy: {missing-gpus: error}`` make
it an error.
"""

from __future__ import annotations

from collections.abc import Sequence

from vgpu_state.catalog import Catalog, GpuModel, suggest
from vgpu_state.catalog.mig import geometry_for
from vgpu_state.config.document import ConfigDocument, Entry
from vgpu_state.config.filters import parse_device_filter
from vgpu_state.config.semantics import candidate_models, default_mode
from vgpu_state.config.typenames import canonical_type_name
from vgpu_state.model.desired import DesiredGpu, DesiredState, SkippedEntry
from vgpu_state.model.errors import ConfigError, ConfigIssue, SelectionError
from vgpu_state.model.frozen import built
from vgpu_state.model.gpumode import GpuMode
from vgpu_state.model.policy import MissingGpus
from vgpu_state.model.snapshot import Gpu, SharedParts


def gpu_model(gpu: Gpu, catalog: Catalog) -> GpuModel | None:
    """The catalog model of a GPU: its recorded model name, else its PCI ids."""
    cat = catalog
    if gpu.model:
        found = cat.model(gpu.model) or cat.find_model(gpu.model)
        if found is not None:
            return found
    return cat.model_for_pci(gpu.device_id, gpu.subsystem_device_id)


def entry_selects(entry: Entry, gpu: Gpu) -> bool:
    """``devices`` and ``device-filter`` match the GPU (types not considered)."""
    if (
        entry.devices != "all"
        and gpu.index not in entry.devices
        and (gpu.address not in entry.devices)
    ):
        return False
    return not entry.device_filter or any(
        parse_device_filter(f).matches(gpu) for f in entry.device_filter
    )


def type_fits(name: str, gpu: Gpu, model: GpuModel | None, catalog: Catalog) -> bool:
    """Can this GPU carry the type? The GPU's driver lists it, or its catalog model
    offers it, or the model may carry it though its rows lack it: a newer driver's
    type of the model's product, or any type of its product on a model whose rows
    are inferred (the driver decides when the plan creates it). A GPU of unknown
    model accepts every name."""
    if model is None:
        return True
    canon = canonical_type_name(name, catalog)
    if model.offers(canon) or gpu.offered_type(canon) is not None:
        return True
    return model in candidate_models(canon, catalog)


def entry_applies(entry: Entry, gpu: Gpu, model: GpuModel | None, catalog: Catalog) -> bool:
    return entry_selects(entry, gpu) and all(
        type_fits(name, gpu, model, catalog) for name in entry.vgpu_devices
    )


def entry_types(entry: Entry, catalog: Catalog) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for name, count in entry.vgpu_devices.items():
        canon = canonical_type_name(name, catalog)
        counts[canon] = counts.get(canon, 0) + count
    return tuple(sorted(counts.items()))


def entry_mode(
    entry: Entry, types: Sequence[tuple[str, int]], model: GpuModel | None
) -> tuple[GpuMode, tuple[tuple[str, int], ...]]:
    """The GPU's mode under ``entry`` (its ``mode``, else ``mig`` for MIG-backed types)
    and, under ``mig``, its GPU instances: the entry's ``mig-geometry``, else the fewest
    that hold the types on ``model`` (none when the model is unknown)."""
    mode = entry.mode or default_mode(name for name, _ in types)
    if mode is not GpuMode.MIG:
        return mode, ()
    if entry.mig_geometry is not None:
        return mode, tuple(sorted(entry.mig_geometry.items()))
    if model is None:
        return mode, ()
    return mode, geometry_for(model, dict(types))


def resolve(
    document: ConfigDocument,
    config_name: str,
    gpus: Sequence[Gpu],
    node_name: str,
    source: str,
    catalog: Catalog,
    *,
    strict: bool = False,
) -> DesiredState:
    """The desired layout of node ``node_name`` under config ``config_name``.

    ``strict`` (``--strict``): an entry that selects no GPU of the node is an error,
    as under ``policy: {missing-gpus: error}``, instead of a skipped entry."""
    if config_name not in document.configs:
        hint = suggest(config_name, document.config_names)
        tail = f"; did you mean {hint}?" if hint else ""
        raise SelectionError(f"config {config_name!r} is not defined in {document.file}{tail}")
    entries = document.configs[config_name].entries
    policy = SharedParts.get(
        (document,), ("policy", config_name), lambda: document.policy_for(config_name)
    )
    desired: list[DesiredGpu] = []
    unmanaged: list[str] = []
    issues: list[ConfigIssue] = []
    used: set[int] = set()
    skipped: list[SkippedEntry] = []
    for gpu in sorted(gpus, key=lambda g: (g.index, g.address)):
        applying, wanted = _gpu_layout(document, config_name, gpu, catalog)
        used.update(applying)
        if not applying:
            unmanaged.append(gpu.address)
        elif wanted is None:
            issues.append(_overlap(document, config_name, gpu, applying[0], applying[1]))
        else:
            desired.append(wanted)
    for index, entry in enumerate(entries):
        if index in used:
            continue
        missing = _missing_gpus(entry, gpus)
        if missing is not None:
            ref = document.entry_ref(config_name, index)
            message = f"entry [{index}] of {config_name}: {missing}, skipped"
            if strict or policy.missing_gpus is MissingGpus.ERROR:
                why = "--strict" if strict else "policy missing-gpus: error"
                issues.append(_missing_issue(document, config_name, index, missing, why))
            else:
                skipped.append(SkippedEntry(
                    config=config_name, index=index, entry=ref, reason=missing, message=message
                ))  # fmt: skip
            continue
        issue = _applies_to_nothing(
            document, config_name, index, entry, gpus, unmanaged, node_name, catalog
        )
        if issue is not None:
            issues.append(issue)
    if issues:
        raise ConfigError(issues)
    # From the document's and the scan's validated values: not validated again (a fleet
    # plan resolves a layout per node).
    return built(
        DesiredState,
        node=node_name,
        config=config_name,
        selection_source=source,
        policy=policy,
        gpus=tuple(desired),
        unmanaged=tuple(unmanaged),
        skipped=tuple(skipped),
    )


def _missing_gpus(entry: Entry, gpus: Sequence[Gpu]) -> str | None:
    """Why ``entry`` selects no GPU of the node, when it selects none because the node
    lacks them: an index or address past its GPUs, a device-filter matching none.
    ``None`` when it selects a GPU, or when it is ``devices: all`` without a filter
    (that entry selects every GPU: a node without any is another error)."""
    if any(entry_selects(entry, g) for g in gpus):
        return None
    if entry.devices != "all":
        present = {g.index for g in gpus} | {g.address for g in gpus}
        absent = [str(d) for d in entry.devices if d not in present]
        if len(absent) == len(entry.devices):
            return f"no GPU {', '.join(absent)} on this node"
    if entry.device_filter:
        filters = ", ".join(entry.device_filter)
        if entry.devices != "all" and any(
            parse_device_filter(f).matches(g) for f in entry.device_filter for g in gpus
        ):
            named = ", ".join(str(d) for d in entry.devices)
            return f"device-filter {filters} matches none of GPU {named} on this node"
        return f"device-filter {filters} matches no GPU on this node"
    return None


def _missing_issue(
    document: ConfigDocument, name: str, index: int, missing: str, why: str
) -> ConfigIssue:
    path = f"vgpu-configs.{name}[{index}]"
    line, column = document.positions.get(path, (0, 0))
    return ConfigIssue(
        document.file,
        line,
        column,
        path,
        f"entry [{index}] of {name}: {missing} ({why} makes this an error; "
        "policy missing-gpus: skip skips it)",
    )


def _gpu_layout(
    document: ConfigDocument, config_name: str, gpu: Gpu, catalog: Catalog
) -> tuple[tuple[int, ...], DesiredGpu | None]:
    """The indexes of the config's entries that apply to ``gpu`` and, when one does, the
    GPU's desired layout. The same for every GPU of one hardware model at one index and
    address (a fleet's nodes of one pool): remembered by the GPU's identifying fields and
    its type list (see ``SharedParts``)."""

    def compute() -> tuple[tuple[int, ...], DesiredGpu | None]:
        entries = document.configs[config_name].entries
        model = gpu_model(gpu, catalog)
        applying = tuple(i for i, e in enumerate(entries) if entry_applies(e, gpu, model, catalog))
        if len(applying) != 1:
            return applying, None
        index = applying[0]
        policy = document.policy_for(config_name)
        types = entry_types(entries[index], catalog)
        mode, geometry = entry_mode(entries[index], types, model)
        return applying, DesiredGpu(
            address=gpu.address,
            index=gpu.index,
            model=model.name if model is not None else gpu.model,
            types=types,
            entry=document.entry_ref(config_name, index),
            publish=entries[index].publish or policy.publish,
            mode=mode,
            mig_geometry=geometry,
        )

    key = (
        "layout",
        config_name,
        gpu.index,
        gpu.address,
        gpu.vendor_id,
        gpu.device_id,
        gpu.subsystem_vendor_id,
        gpu.subsystem_device_id,
        gpu.model,
    )
    return SharedParts.get((document, catalog, gpu.offered), key, compute)


def _gpu_list(gpus: Sequence[Gpu], catalog: Catalog) -> str:
    if not gpus:
        return "the node has no NVIDIA GPUs"
    parts = []
    for g in sorted(gpus, key=lambda g: (g.index, g.address)):
        model = gpu_model(g, catalog)
        label = model.short_name if model is not None else (g.model or "unknown model")
        parts.append(f"GPU {g.index} {g.address} {label}")
    return "the node has " + ", ".join(parts)


def _applies_to_nothing(
    document: ConfigDocument,
    name: str,
    index: int,
    entry: Entry,
    gpus: Sequence[Gpu],
    unmanaged: Sequence[str],
    node_name: str,
    catalog: Catalog,
) -> ConfigIssue | None:
    """An entry of the selected config that lays out no GPU is a silent no-op: an error.

    Not an error: an entry whose GPUs all take another entry (A2 and A16 entries under
    one shared filter). An entry that selects no GPU here (an index past the node's
    GPUs, a ``device-filter`` matching none) never gets here: it is skipped and listed
    (see :func:`_missing_gpus`).
    """
    selected = [g for g in gpus if entry_selects(entry, g)]
    types = ", ".join(f"{t}: {c}" for t, c in entry.vgpu_devices.items()) or "{}"
    if selected:
        left = [g for g in selected if g.address in unmanaged]
        if not left:
            return None
        why = "; ".join(_why_not(entry, g, catalog) for g in left)
    elif entry.device_filter or not entry.vgpu_devices:
        return None
    else:
        why = "no GPU to lay out"  # devices: all (a list naming absent GPUs is skipped)
    path = f"vgpu-configs.{name}[{index}]"
    line, column = document.positions.get(path, (0, 0))
    return ConfigIssue(
        document.file,
        line,
        column,
        path,
        f"entry [{index}] of config {name!r} ({types}) applies to no GPU on node "
        f"{node_name or '(unnamed)'}: {why}; {_gpu_list(gpus, catalog)}",
    )


def _why_not(entry: Entry, gpu: Gpu, catalog: Catalog) -> str:
    model = gpu_model(gpu, catalog)
    label = model.short_name if model is not None else (gpu.model or "unknown model")
    missing = [n for n in entry.vgpu_devices if not type_fits(n, gpu, model, catalog)]
    return f"GPU {gpu.index} {gpu.address} ({label}) does not offer {', '.join(missing)}"


def _overlap(document: ConfigDocument, name: str, gpu: Gpu, first: int, second: int) -> ConfigIssue:
    path = f"vgpu-configs.{name}[{second}]"
    line, column = document.positions.get(path, (1, 1))
    first_line = document.positions.get(f"vgpu-configs.{name}[{first}]", (1, 1))[0]
    return ConfigIssue(
        document.file,
        line,
        column,
        path,
        f"GPU {gpu.address} (index {gpu.index}) matches two entries of config {name!r}: "
        f"[{first}] on line {first_line} and [{second}] on line {line}; make their devices "
        "or device-filter disjoint",
    )
