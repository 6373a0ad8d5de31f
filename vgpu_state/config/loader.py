"""Load a config file: YAML with positions → checked ``ConfigDocument``.

Every problem in a file is collected first and raised together as one
``ConfigError``; nothing else escapes (``load_text`` turns any unexpected
failure into an issue too).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from vgpu_state.catalog import Catalog, suggest
from vgpu_state.config.document import (
    LABEL_OPERATORS,
    ConfigDocument,
    ConfigFile,
    Entry,
    LabelExpression,
    NamedConfig,
    NodeSelector,
    PolicySpec,
)
from vgpu_state.config.filters import parse_device_filter
from vgpu_state.config.semantics import EntryFacts, check_entry
from vgpu_state.config.typenames import canonical_type_name, type_name_note
from vgpu_state.config.yamlnodes import (
    BOOL,
    INT,
    NULL,
    STR,
    Issues,
    compose,
    describe,
    gc_paused,
    is_str,
    join,
    mapping_items,
    position,
    scalar_value,
    tag,
)
from vgpu_state.model.errors import ConfigError
from vgpu_state.model.files import InputFileError, read_input
from vgpu_state.model.pci import parse_pci_address
from vgpu_state.model.policy import InUsePolicy, Publish, SriovPolicy

MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""The largest config file read (NVIDIA's full example config is about 60 KiB)."""

TOP_KEYS = ("version", "vgpu-configs", "node-selectors", "default", "policy")
ENTRY_KEYS = ("devices", "device-filter", "vgpu-devices", "publish")
CONFIG_KEYS = ("entries", "policy")
POLICY_KEYS = ("in-use", "prune", "sriov", "max-unavailable", "publish")
SELECTOR_KEYS = ("match-labels", "match-expressions", "config")
EXPRESSION_KEYS = ("key", "operator", "values")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def load_file(path: str | Path, *, catalog: Catalog, strict: bool = False) -> ConfigDocument:
    """Load and check the config file at ``path`` (``-`` is not special here).

    ``catalog``: the GPU models and vGPU types the checks use.
    ``strict``: warnings (type names the catalog does not know) are errors too.
    """
    name = str(path)
    try:
        data = read_input(name, MAX_CONFIG_BYTES, "config")
    except InputFileError as exc:
        message = str(exc).removeprefix(f"{name}: ")
        raise ConfigError(_single(name, message)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(_single(name, f"not a UTF-8 text file: {exc.reason}")) from None
    return load_text(text, name, catalog=catalog, strict=strict)


def load_text(
    text: str, filename: str = "<config>", *, catalog: Catalog, strict: bool = False
) -> ConfigDocument:
    """Load and check config ``text``; ``filename`` is used in messages.

    The document's ``warnings`` list what the catalog cannot vouch for (the node's
    driver decides); with ``strict`` they are errors.
    """
    issues = Issues(filename)
    document: ConfigDocument | None = None
    with gc_paused():
        root = compose(text, issues)
        if not issues.items:
            try:
                document = _Loader(issues, catalog).document(root)
            except (RecursionError, ValueError, TypeError) as exc:
                issues.at_position(1, 1, "", f"cannot read the config: {exc}")
    if strict:
        issues.items.extend(issues.warnings)
    if issues.items or document is None:
        raise ConfigError(sorted(issues.items, key=lambda i: (i.line, i.column)))
    warnings = sorted(issues.warnings, key=lambda i: (i.line, i.column))
    return replace(document, warnings=tuple(warnings))


def _single(filename: str, message: str) -> list[Any]:
    issues = Issues(filename)
    issues.at_position(1, 1, "", message)
    return issues.items


def _unknown_key(key: str, allowed: tuple[str, ...], where: str) -> str:
    hint = suggest(key, allowed)
    if hint is not None:
        return f"unknown key {key!r} in {where}; did you mean {hint}?"
    return f"unknown key {key!r} in {where}; expected one of: {', '.join(allowed)}"


class _Loader:
    def __init__(self, issues: Issues, catalog: Catalog) -> None:
        self.issues = issues
        self.catalog = catalog
        self.positions: dict[str, tuple[int, int]] = {}
        self.declared: tuple[str, ...] = ()
        """Every config name the file declares, including ones whose layout has errors."""

    def add(self, node: Node | None, path: str, message: str) -> None:
        self.issues.at(node, path, message)

    # top level -----------------------------------------------------------------
    def document(self, root: Node | None) -> ConfigDocument | None:
        if root is None:
            self.issues.at_position(
                1, 1, "", "the file is empty; expected a mapping with version: v1 and vgpu-configs"
            )
            return None
        if not isinstance(root, MappingNode):
            self.add(root, "", f"expected a mapping at the top level, found {describe(root)}")
            return None
        values: dict[str, Node] = {}
        for key, key_node, value in mapping_items(root, "", self.issues):
            if key not in TOP_KEYS:
                self.add(key_node, key, _unknown_key(key, TOP_KEYS, "the top level"))
                continue
            values[key] = value
            self.positions[key] = position(value)

        version = self._version(root, values.get("version"))
        configs = self._configs(root, values.get("vgpu-configs"))
        names = self.declared if configs is not None else None
        selectors = self._selectors(values.get("node-selectors"), names)
        default = self._config_ref(values.get("default"), "default", names)
        policy = self._policy(values["policy"], "policy") if "policy" in values else None
        if self.issues.items or configs is None or version is None:
            return None
        spec = ConfigFile(
            version="v1",
            vgpu_configs=configs,
            node_selectors=tuple(selectors),
            default=default,
            policy=policy,
        )
        return ConfigDocument(spec=spec, file=self.issues.file, positions=self.positions)

    def _version(self, root: MappingNode, node: Node | None) -> str | None:
        if node is None:
            self.add(root, "version", "missing key 'version'; add version: v1")
            return None
        if not (isinstance(node, ScalarNode) and is_str(node) and node.value == "v1"):
            self.add(node, "version", f"unsupported version {describe(node)}; expected v1")
            return None
        return "v1"

    # vgpu-configs ----------------------------------------------------------------
    def _configs(self, root: MappingNode, node: Node | None) -> dict[str, NamedConfig] | None:
        path = "vgpu-configs"
        if node is None:
            self.add(root, path, "missing key 'vgpu-configs'; define at least one named layout")
            return None
        if not isinstance(node, MappingNode):
            self.add(
                node, path, f"vgpu-configs must map config names to layouts, found {describe(node)}"
            )
            return None
        items = mapping_items(node, path, self.issues)
        if not items and not node.value:
            self.add(node, path, "vgpu-configs is empty; define at least one named layout")
        configs: dict[str, NamedConfig] = {}
        self.declared = tuple(name for name, _, _ in items)
        for name, key_node, value in items:
            cpath = join(path, name)
            self.positions[cpath] = position(key_node)
            if not _LABEL_VALUE.match(name) or len(name) > 63:
                self.add(
                    key_node,
                    cpath,
                    f"config name {name!r} cannot be a node label value: "
                    "use at most 63 letters, digits, '-', '_' or '.', starting and ending "
                    "with a letter or digit",
                )
            config = self._config(name, value, cpath)
            if config is not None:
                configs[name] = config
        return configs

    def _config(self, name: str, node: Node, path: str) -> NamedConfig | None:
        policy: PolicySpec | None = None
        entries_node: Node | None = node
        if isinstance(node, MappingNode):
            entries_node = None
            for key, key_node, value in mapping_items(node, path, self.issues):
                if key == "entries":
                    entries_node = value
                elif key == "policy":
                    policy = self._policy(value, join(path, "policy"))
                else:
                    self.add(
                        key_node,
                        join(path, key),
                        _unknown_key(key, CONFIG_KEYS, f"config {name!r}"),
                    )
            if entries_node is None:
                self.add(node, path, f"config {name!r} has no 'entries' list")
                return None
            path = join(path, "entries")
        if entries_node is None:
            return None
        if not isinstance(entries_node, SequenceNode):
            self.add(
                entries_node,
                path,
                f"config {name!r} must be a list of entries (or a "
                f"mapping with entries and policy), found {describe(entries_node)}",
            )
            return None
        if not entries_node.value:
            self.add(entries_node, path, f"config {name!r} has no entries")
            return None
        entries: list[Entry] = []
        for index, item in enumerate(entries_node.value):
            epath = f"{path}[{index}]"
            self.positions[f"vgpu-configs.{name}[{index}]"] = position(item)
            entry = self._entry(item, epath)
            if entry is not None:
                entries.append(entry)
        if len(entries) != len(entries_node.value):
            return None
        return NamedConfig(entries=tuple(entries), policy=policy)

    def _entry(self, node: Node, path: str) -> Entry | None:
        if not isinstance(node, MappingNode):
            self.add(
                node,
                path,
                f"an entry must be a mapping with devices and vgpu-devices, found {describe(node)}",
            )
            return None
        values: dict[str, Node] = {}
        for key, key_node, value in mapping_items(node, path, self.issues):
            if key in ENTRY_KEYS:
                values[key] = value
            else:
                self.add(key_node, join(path, key), _unknown_key(key, ENTRY_KEYS, "an entry"))
        before = len(self.issues.items)
        for required in ("devices", "vgpu-devices"):
            if required not in values:
                self.add(node, path, f"missing key {required!r} in this entry")
        devices = (
            self._devices(values["devices"], join(path, "devices"))
            if ("devices" in values)
            else None
        )
        filters = (
            self._filters(values["device-filter"], join(path, "device-filter"))
            if ("device-filter" in values)
            else ()
        )
        counts = (
            self._vgpu_devices(values["vgpu-devices"], join(path, "vgpu-devices"))
            if ("vgpu-devices" in values)
            else None
        )
        publish = (
            self._choice(values["publish"], join(path, "publish"), Publish)
            if ("publish" in values)
            else None
        )
        if len(self.issues.items) != before or devices is None or counts is None:
            return None
        facts = EntryFacts(
            path=path,
            node=node,
            filters=filters,
            filter_node=values.get("device-filter"),
            types=counts,
            types_node=values["vgpu-devices"],
        )
        check_entry(facts, self.catalog, self.issues)
        return Entry(
            devices=devices,
            device_filter=tuple(str(f) for f, _ in filters),
            vgpu_devices={name: count for name, (count, _, _) in counts.items()},
            publish=publish,
        )

    def _devices(self, node: Node, path: str) -> str | tuple[int | str, ...] | None:
        expected = "devices must be 'all' or a list of GPU indices and PCI addresses"
        if isinstance(node, ScalarNode):
            if is_str(node) and node.value == "all":
                return "all"
            self.add(node, path, f"{expected}, found {describe(node)}")
            return None
        if not isinstance(node, SequenceNode):
            self.add(node, path, f"{expected}, found {describe(node)}")
            return None
        if not node.value:
            self.add(node, path, "devices is an empty list; it selects no GPU")
            return None
        out: list[int | str] = []
        seen: dict[int | str, int] = {}
        for index, item in enumerate(node.value):
            ipath = f"{path}[{index}]"
            device = self._device(item, ipath)
            if device is None:
                continue
            if device in seen:
                self.add(
                    item, ipath, f"GPU {device} is listed twice (first on line {seen[device]})"
                )
                continue
            seen[device] = position(item)[0]
            out.append(device)
        return tuple(out) if len(out) == len(node.value) else None

    def _device(self, node: Node, path: str) -> int | str | None:
        if isinstance(node, ScalarNode) and tag(node) == INT:
            value = scalar_value(node)
            if isinstance(value, int) and value >= 0:
                return value
            self.add(node, path, f"a GPU index must be 0 or more, found {node.value}")
            return None
        if is_str(node):
            try:
                return parse_pci_address(str(node.value))
            except ValueError as exc:
                self.add(node, path, str(exc))
                return None
        self.add(
            node, path, f"a device must be a GPU index or a PCI address, found {describe(node)}"
        )
        return None

    def _filters(self, node: Node, path: str) -> tuple[Any, ...]:
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
            self.add(
                node,
                path,
                "device-filter must be a string 0xDDDDVVVV[:0xSSSSVVVV] or a "
                f"list of them, found {describe(node)}",
            )
            return ()
        out = []
        for item, ipath in items:
            if not isinstance(item, ScalarNode) or tag(item) == BOOL:
                self.add(
                    item,
                    ipath,
                    f"a device-filter must be a string such as 0x223610DE, found {describe(item)}",
                )
                continue
            try:
                out.append((parse_device_filter(str(item.value)), item))
            except ValueError as exc:
                self.add(item, ipath, str(exc))
        return tuple(out)

    def _vgpu_devices(self, node: Node, path: str) -> dict[str, tuple[int, Node, Node]] | None:
        if not isinstance(node, MappingNode):
            self.add(
                node,
                path,
                "vgpu-devices must map vGPU type names to counts "
                f"(use {{}} for no vGPUs), found {describe(node)}",
            )
            return None
        counts: dict[str, tuple[int, Node, Node]] = {}
        canonical: dict[str, tuple[str, Node]] = {}
        ok = True
        for name, key_node, value in mapping_items(node, path, self.issues):
            tpath = join(path, name)
            note = type_name_note(name, self.catalog)
            if note is not None and note.warning:
                self.issues.warn(key_node, tpath, note.message)
            elif note is not None:
                self.add(key_node, tpath, note.message)
                ok = False
            count = scalar_value(value) if isinstance(value, ScalarNode) else None
            if not (
                isinstance(value, ScalarNode)
                and tag(value) == INT
                and isinstance(count, int)
                and count > 0
            ):
                self.add(
                    value,
                    tpath,
                    f"the count of {name} must be a whole number of 1 or "
                    f"more, found {describe(value)}",
                )
                ok = False
                continue
            canon = canonical_type_name(name, self.catalog)
            if canon in canonical:
                first_name, first_node = canonical[canon]
                self.add(
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

    # policy ----------------------------------------------------------------------
    def _policy(self, node: Node, path: str) -> PolicySpec | None:
        if not isinstance(node, MappingNode):
            self.add(
                node,
                path,
                "policy must be a mapping with in-use, prune, sriov, max-unavailable or publish, "
                f"found {describe(node)}",
            )
            return None
        fields: dict[str, Any] = {}
        for key, key_node, value in mapping_items(node, path, self.issues):
            kpath = join(path, key)
            if key == "in-use":
                fields["in_use"] = self._choice(value, kpath, InUsePolicy)
            elif key == "sriov":
                fields["sriov"] = self._choice(value, kpath, SriovPolicy)
            elif key == "publish":
                fields["publish"] = self._choice(value, kpath, Publish)
            elif key == "prune":
                if isinstance(value, ScalarNode) and tag(value) == BOOL:
                    fields["prune"] = scalar_value(value)
                else:
                    self.add(value, kpath, f"prune must be true or false, found {describe(value)}")
            elif key == "max-unavailable":
                number = scalar_value(value) if isinstance(value, ScalarNode) else None
                if tag(value) == INT and isinstance(number, int) and number >= 1:
                    fields["max_unavailable"] = number
                else:
                    self.add(
                        value,
                        kpath,
                        "max-unavailable must be a whole number of 1 or more, "
                        f"found {describe(value)}",
                    )
            else:
                self.add(key_node, kpath, _unknown_key(key, POLICY_KEYS, "policy"))
        if any(v is None for v in fields.values()):
            return None
        return PolicySpec(**fields)

    def _choice(
        self, node: Node, path: str, kind: type[InUsePolicy] | type[SriovPolicy] | type[Publish]
    ) -> Any:
        allowed = tuple(m.value for m in kind)
        key = path.rsplit(".", 1)[-1]
        if is_str(node) and node.value in allowed:
            return kind(node.value)
        hint = suggest(str(node.value), allowed) if is_str(node) else None
        if isinstance(node, ScalarNode) and tag(node) == BOOL and "off" in allowed:
            hint = "off" if scalar_value(node) is False else None
        tail = f"; did you mean {hint}?" if hint else ""
        self.add(
            node, path, f"{key} must be one of {', '.join(allowed)}, found {describe(node)}{tail}"
        )
        return None

    # selection -------------------------------------------------------------------
    def _config_ref(
        self, node: Node | None, path: str, names: tuple[str, ...] | None
    ) -> str | None:
        if node is None:
            return None
        if not is_str(node):
            self.add(node, path, f"{path} must name a config, found {describe(node)}")
            return None
        name = str(node.value)
        if names is not None and name not in names:
            hint = suggest(name, names)
            tail = f"; did you mean {hint}?" if hint else f"; defined: {', '.join(names)}"
            self.add(node, path, f"unknown config {name!r}{tail}")
        return name

    def _selectors(self, node: Node | None, names: tuple[str, ...] | None) -> list[NodeSelector]:
        path = "node-selectors"
        if node is None:
            return []
        if not isinstance(node, SequenceNode):
            self.add(node, path, f"node-selectors must be a list, found {describe(node)}")
            return []
        out = []
        for index, item in enumerate(node.value):
            spath = f"{path}[{index}]"
            self.positions[spath] = position(item)
            selector = self._selector(item, spath, names)
            if selector is not None:
                out.append(selector)
        return out

    def _selector(
        self, node: Node, path: str, names: tuple[str, ...] | None
    ) -> NodeSelector | None:
        if not isinstance(node, MappingNode):
            self.add(
                node,
                path,
                f"a node-selector must be a mapping with config and "
                f"match-labels or match-expressions, found {describe(node)}",
            )
            return None
        values: dict[str, Node] = {}
        for key, key_node, value in mapping_items(node, path, self.issues):
            if key in SELECTOR_KEYS:
                values[key] = value
            else:
                self.add(
                    key_node, join(path, key), _unknown_key(key, SELECTOR_KEYS, "a node-selector")
                )
        before = len(self.issues.items)
        if "config" not in values:
            self.add(node, path, "missing key 'config' in this node-selector")
        config = self._config_ref(values.get("config"), join(path, "config"), names)
        labels = self._match_labels(values.get("match-labels"), join(path, "match-labels"))
        expressions = self._expressions(
            values.get("match-expressions"), join(path, "match-expressions")
        )
        if len(self.issues.items) != before or config is None:
            return None
        return NodeSelector(match_labels=labels, match_expressions=expressions, config=config)

    def _label_value(self, node: Node, path: str) -> str | None:
        if not is_str(node):
            hint = f"; quote it: '{node.value}'" if isinstance(node, ScalarNode) else ""
            self.add(node, path, f"a label value must be a string, found {describe(node)}{hint}")
            return None
        text = str(node.value)
        if len(text) > 63 or not _LABEL_VALUE.match(text):
            self.add(
                node,
                path,
                f"{text!r} is not a valid label value (at most 63 letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit)",
            )
            return None
        return text

    def _match_labels(self, node: Node | None, path: str) -> dict[str, str]:
        if node is None:
            return {}
        if not isinstance(node, MappingNode):
            self.add(
                node, path, f"match-labels must map label keys to values, found {describe(node)}"
            )
            return {}
        out = {}
        for key, _, value in mapping_items(node, path, self.issues):
            text = self._label_value(value, join(path, key))
            if text is not None:
                out[key] = text
        return out

    def _expressions(self, node: Node | None, path: str) -> tuple[LabelExpression, ...]:
        if node is None:
            return ()
        if not isinstance(node, SequenceNode):
            self.add(node, path, f"match-expressions must be a list, found {describe(node)}")
            return ()
        out = []
        for index, item in enumerate(node.value):
            expr = self._expression(item, f"{path}[{index}]")
            if expr is not None:
                out.append(expr)
        return tuple(out)

    def _expression(self, node: Node, path: str) -> LabelExpression | None:
        if not isinstance(node, MappingNode):
            self.add(
                node,
                path,
                f"a match-expression must be a mapping with key, operator "
                f"and values, found {describe(node)}",
            )
            return None
        values: dict[str, Node] = {}
        for key, key_node, value in mapping_items(node, path, self.issues):
            if key in EXPRESSION_KEYS:
                values[key] = value
            else:
                self.add(
                    key_node,
                    join(path, key),
                    _unknown_key(key, EXPRESSION_KEYS, "a match-expression"),
                )
        before = len(self.issues.items)
        for required in ("key", "operator"):
            if required not in values:
                self.add(node, path, f"missing key {required!r} in this match-expression")
        label_key = values.get("key")
        if label_key is not None and not (is_str(label_key) and label_key.value):
            self.add(
                label_key,
                join(path, "key"),
                f"key must be a label key, found {describe(label_key)}",
            )
        operator = values.get("operator")
        op = str(operator.value) if operator is not None and is_str(operator) else None
        if operator is not None and op not in LABEL_OPERATORS:
            hint = suggest(op, LABEL_OPERATORS) if op else None
            tail = f"; did you mean {hint}?" if hint else ""
            self.add(
                operator,
                join(path, "operator"),
                f"operator must be one of "
                f"{', '.join(LABEL_OPERATORS)}, found {describe(operator)}{tail}",
            )
        label_values: list[str] = []
        vnode = values.get("values")
        vpath = join(path, "values")
        if vnode is not None and not isinstance(vnode, SequenceNode):
            self.add(vnode, vpath, f"values must be a list of strings, found {describe(vnode)}")
        elif vnode is not None:
            for index, item in enumerate(vnode.value):
                text = self._label_value(item, f"{vpath}[{index}]")
                if text is not None:
                    label_values.append(text)
        if op in ("In", "NotIn") and not (isinstance(vnode, SequenceNode) and vnode.value):
            self.add(
                vnode or node,
                vpath if vnode else path,
                f"operator {op} needs a non-empty list of values",
            )
        if op in ("Exists", "DoesNotExist") and isinstance(vnode, SequenceNode) and vnode.value:
            self.add(vnode, vpath, f"operator {op} takes no values; remove them")
        if len(self.issues.items) != before or label_key is None or op is None:
            return None
        return LabelExpression(
            key=str(label_key.value),
            operator=op,
            values=tuple(label_values),
        )
