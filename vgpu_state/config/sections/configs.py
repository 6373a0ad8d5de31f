"""``vgpu-configs``: the named layouts, their entries, and what an entry holds."""

from __future__ import annotations

import re
from typing import Any

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from vgpu_state.config.document import MAX_GPU_INSTANCES, Entry, NamedConfig, PolicySpec
from vgpu_state.config.filters import parse_device_filter
from vgpu_state.config.sections.context import LABEL_VALUE, LoadContext, choice, known_keys
from vgpu_state.config.sections.policy import policy
from vgpu_state.config.semantics import EntryFacts, check_entry
from vgpu_state.config.typenames import canonical_type_name, type_name_note
from vgpu_state.config.yamlnodes import (
    BOOL,
    INT,
    NULL,
    STR,
    describe,
    is_str,
    join,
    mapping_items,
    position,
    scalar_value,
    tag,
)
from vgpu_state.model.gpumode import GpuMode
from vgpu_state.model.pci import parse_pci_address
from vgpu_state.model.policy import Publish

ENTRY_KEYS = ("devices", "device-filter", "vgpu-devices", "publish", "mode", "mig-geometry")
PROFILE_NAME = re.compile(r"^[1-9][0-9]?g\.[0-9]{1,4}gb(\+[a-z]{1,8})?$")
"""A MIG GPU instance profile's name as ``nvidia-smi`` spells it (``1g.24gb``,
``1g.5gb+me``), without the ``MIG`` prefix."""
CONFIG_KEYS = ("entries", "policy")


def configs(
    ctx: LoadContext, root: MappingNode, node: Node | None
) -> dict[str, NamedConfig] | None:
    """The named layouts; sets ``ctx.declared`` to every name the file declares."""
    path = "vgpu-configs"
    if node is None:
        ctx.add(root, path, "missing key 'vgpu-configs'; define at least one named layout")
        return None
    if not isinstance(node, MappingNode):
        ctx.add(
            node, path, f"vgpu-configs must map config names to layouts, found {describe(node)}"
        )
        return None
    items = mapping_items(node, path, ctx.issues)
    if not items and not node.value:
        ctx.add(node, path, "vgpu-configs is empty; define at least one named layout")
    out: dict[str, NamedConfig] = {}
    ctx.declared = tuple(name for name, _, _ in items)
    for name, key_node, value in items:
        cpath = join(path, name)
        ctx.positions[cpath] = position(key_node)
        if not LABEL_VALUE.match(name) or len(name) > 63:
            ctx.add(
                key_node,
                cpath,
                f"config name {name!r} cannot be a node label value: "
                "use at most 63 letters, digits, '-', '_' or '.', starting and ending "
                "with a letter or digit",
            )
        config = _config(ctx, name, value, cpath)
        if config is not None:
            out[name] = config
    return out


def _config(ctx: LoadContext, name: str, node: Node, path: str) -> NamedConfig | None:
    own_policy: PolicySpec | None = None
    entries_node = node
    if isinstance(node, MappingNode):
        values = known_keys(ctx, node, path, CONFIG_KEYS, f"config {name!r}")
        if "policy" in values:
            own_policy = policy(ctx, values["policy"], join(path, "policy"))
        if "entries" not in values:
            ctx.add(node, path, f"config {name!r} has no 'entries' list")
            return None
        entries_node = values["entries"]
        path = join(path, "entries")
    if not isinstance(entries_node, SequenceNode):
        ctx.add(
            entries_node,
            path,
            f"config {name!r} must be a list of entries (or a "
            f"mapping with entries and policy), found {describe(entries_node)}",
        )
        return None
    if not entries_node.value:
        ctx.add(entries_node, path, f"config {name!r} has no entries")
        return None
    entries: list[Entry] = []
    for index, item in enumerate(entries_node.value):
        epath = f"{path}[{index}]"
        ctx.positions[f"vgpu-configs.{name}[{index}]"] = position(item)
        entry = _entry(ctx, item, epath)
        if entry is not None:
            entries.append(entry)
    if len(entries) != len(entries_node.value):
        return None
    return NamedConfig(entries=tuple(entries), policy=own_policy)


def _entry(ctx: LoadContext, node: Node, path: str) -> Entry | None:
    if not isinstance(node, MappingNode):
        ctx.add(
            node,
            path,
            f"an entry must be a mapping with devices and vgpu-devices, found {describe(node)}",
        )
        return None
    values = known_keys(ctx, node, path, ENTRY_KEYS, "an entry")
    before = len(ctx.issues.items)
    for required in ("devices", "vgpu-devices"):
        if required not in values:
            ctx.add(node, path, f"missing key {required!r} in this entry")
    devices = (
        _devices(ctx, values["devices"], join(path, "devices")) if "devices" in values else None
    )
    filters = (
        _filters(ctx, values["device-filter"], join(path, "device-filter"))
        if "device-filter" in values
        else ()
    )
    counts = (
        _vgpu_devices(ctx, values["vgpu-devices"], join(path, "vgpu-devices"))
        if "vgpu-devices" in values
        else None
    )
    publish = (
        choice(ctx, values["publish"], join(path, "publish"), Publish)
        if "publish" in values
        else None
    )
    mode = choice(ctx, values["mode"], join(path, "mode"), GpuMode) if "mode" in values else None
    geometry = (
        _mig_geometry(ctx, values["mig-geometry"], join(path, "mig-geometry"))
        if "mig-geometry" in values
        else None
    )
    if len(ctx.issues.items) != before or devices is None or counts is None:
        return None
    facts = EntryFacts(
        path=path,
        node=node,
        filters=filters,
        types=counts,
        types_node=values["vgpu-devices"],
        mode=mode,
        mode_node=values.get("mode"),
        geometry=geometry,
        geometry_node=values.get("mig-geometry"),
    )
    check_entry(facts, ctx.catalog, ctx.issues)
    return Entry(
        devices=devices,
        device_filter=tuple(str(f) for f, _ in filters),
        vgpu_devices={name: count for name, (count, _, _) in counts.items()},
        publish=publish,
        mode=mode,
        mig_geometry=(
            {name: count for name, (count, _, _) in geometry.items()}
            if geometry is not None
            else None
        ),
    )


def _devices(ctx: LoadContext, node: Node, path: str) -> str | tuple[int | str, ...] | None:
    expected = "devices must be 'all' or a list of GPU indices and PCI addresses"
    if isinstance(node, ScalarNode):
        if is_str(node) and node.value == "all":
            return "all"
        ctx.add(node, path, f"{expected}, found {describe(node)}")
        return None
    if not isinstance(node, SequenceNode):
        ctx.add(node, path, f"{expected}, found {describe(node)}")
        return None
    if not node.value:
        ctx.add(node, path, "devices is an empty list; it selects no GPU")
        return None
    out: list[int | str] = []
    seen: dict[int | str, int] = {}
    for index, item in enumerate(node.value):
        ipath = f"{path}[{index}]"
        device = _device(ctx, item, ipath)
        if device is None:
            continue
        if device in seen:
            ctx.add(item, ipath, f"GPU {device} is listed twice (first on line {seen[device]})")
            continue
        seen[device] = position(item)[0]
        out.append(device)
    return tuple(out) if len(out) == len(node.value) else None


def _device(ctx: LoadContext, node: Node, path: str) -> int | str | None:
    if isinstance(node, ScalarNode) and tag(node) == INT:
        value = scalar_value(node)
        if isinstance(value, int) and value >= 0:
            return value
        ctx.add(node, path, f"a GPU index must be 0 or more, found {node.value}")
        return None
    if is_str(node):
        try:
            return parse_pci_address(str(node.value))
        except ValueError as exc:
            ctx.add(node, path, str(exc))
            return None
    ctx.add(node, path, f"a device must be a GPU index or a PCI address, found {describe(node)}")
    return None


def _filters(ctx: LoadContext, node: Node, path: str) -> tuple[Any, ...]:
    """The filters of an entry; ``""``, ``[]`` and ``null`` mean every GPU (as in
    vgpu-device-manager), like leaving the key out."""
    items: list[tuple[Node, str]] = []
    if isinstance(node, ScalarNode) and (
        tag(node) == NULL or (tag(node) == STR and not str(node.value).strip())
    ):
        return ()
    if isinstance(node, ScalarNode) and tag(node) != BOOL and scalar_value(node) is not None:
        items.append((node, path))
    elif isinstance(node, SequenceNode):
        items.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    else:
        ctx.add(
            node,
            path,
            "device-filter must be a string 0xDDDDVVVV[:0xSSSSVVVV] or a "
            f"list of them, found {describe(node)}",
        )
        return ()
    out = []
    for item, ipath in items:
        if not isinstance(item, ScalarNode) or tag(item) == BOOL:
            ctx.add(
                item,
                ipath,
                f"a device-filter must be a string such as 0x223610DE, found {describe(item)}",
            )
            continue
        try:
            out.append((parse_device_filter(str(item.value)), item))
        except ValueError as exc:
            ctx.add(item, ipath, str(exc))
    return tuple(out)


def _vgpu_devices(
    ctx: LoadContext, node: Node, path: str
) -> dict[str, tuple[int, Node, Node]] | None:
    if not isinstance(node, MappingNode):
        ctx.add(
            node,
            path,
            "vgpu-devices must map vGPU type names to counts "
            f"(use {{}} for no vGPUs), found {describe(node)}",
        )
        return None
    counts: dict[str, tuple[int, Node, Node]] = {}
    canonical: dict[str, tuple[str, Node]] = {}
    ok = True
    for name, key_node, value in mapping_items(node, path, ctx.issues):
        tpath = join(path, name)
        note = type_name_note(name, ctx.catalog)
        if note is not None and note.warning:
            ctx.issues.warn(key_node, tpath, note.message)
        elif note is not None:
            ctx.add(key_node, tpath, note.message)
            ok = False
        count = scalar_value(value) if isinstance(value, ScalarNode) else None
        if not (
            isinstance(value, ScalarNode)
            and tag(value) == INT
            and isinstance(count, int)
            and count > 0
        ):
            ctx.add(
                value,
                tpath,
                f"the count of {name} must be a whole number of 1 or more, found {describe(value)}",
            )
            ok = False
            continue
        canon = canonical_type_name(name, ctx.catalog)
        if canon in canonical:
            first_name, first_node = canonical[canon]
            ctx.add(
                key_node,
                tpath,
                f"type {canon} is listed twice (also as "
                f"{first_name!r} on line {position(first_node)[0]})",
            )
            ok = False
            continue
        canonical[canon] = (name, key_node)
        counts[name] = (count, key_node, value)
    return counts if ok else None


def _mig_geometry(
    ctx: LoadContext, node: Node, path: str
) -> dict[str, tuple[int, Node, Node]] | None:
    """``mig-geometry``: GPU instance profile → count (whether the GPU's model has the
    profile is checked with the types, see ``semantics``)."""
    if not isinstance(node, MappingNode) or not node.value:
        ctx.add(
            node,
            path,
            "mig-geometry must map GPU instance profiles to counts, e.g. {1g.24gb: 4}, "
            f"found {describe(node) if not isinstance(node, MappingNode) else 'an empty mapping'}",
        )
        return None
    out: dict[str, tuple[int, Node, Node]] = {}
    ok = True
    for name, key_node, value in mapping_items(node, path, ctx.issues):
        ppath = join(path, name)
        canon = name.strip().removeprefix("MIG ").strip().lower()
        if not PROFILE_NAME.match(canon):
            ctx.add(
                key_node,
                ppath,
                f"{name!r} is not a GPU instance profile; write it as nvidia-smi does, "
                "e.g. 1g.24gb or 1g.5gb+me",
            )
            ok = False
            continue
        count = scalar_value(value) if isinstance(value, ScalarNode) else None
        if not (
            isinstance(value, ScalarNode)
            and tag(value) == INT
            and isinstance(count, int)
            and 0 < count <= MAX_GPU_INSTANCES
        ):
            ctx.add(
                value,
                ppath,
                f"the count of {name} must be a whole number from 1 to {MAX_GPU_INSTANCES}, "
                f"found {describe(value)}",
            )
            ok = False
            continue
        if canon in out:
            ctx.add(key_node, ppath, f"GPU instance profile {canon} is listed twice")
            ok = False
            continue
        out[canon] = (count, key_node, value)
    return out if ok else None
