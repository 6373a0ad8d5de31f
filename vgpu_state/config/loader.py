"""Load a config file: YAML with positions → checked ``ConfigDocument``.

Every problem in a file is collected first and raised together as one
``ConfigError``; nothing else escapes (``load_text`` turns any unexpected
failure into an issue too). This module checks the top level; each section has
its own module under ``vgpu_state.config.sections``, and every section reports
unknown keys through ``sections.context.known_keys``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from vgpu_state.catalog import Catalog
from vgpu_state.config.document import ConfigDocument, ConfigFile
from vgpu_state.config.sections.configs import configs
from vgpu_state.config.sections.context import LoadContext, known_keys
from vgpu_state.config.sections.policy import top_policy
from vgpu_state.config.sections.selectors import config_ref, selectors
from vgpu_state.config.yamlnodes import (
    Issues,
    compose,
    describe,
    gc_paused,
    is_str,
    listed,
    position,
)
from vgpu_state.inputfiles import InputFileError, read_input
from vgpu_state.model.errors import ConfigError

MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""The largest config file read (NVIDIA's full example config is about 60 KiB)."""

TOP_KEYS = ("version", "vgpu-configs", "node-selectors", "default", "policy")


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
    driver decides); with ``strict`` they are errors. Its ``notes`` say which
    layouts rest on an inferred rule (MIG GPU instances, mixed-size placement);
    ``strict`` leaves them notes.
    """
    issues = Issues(filename)
    document: ConfigDocument | None = None
    with gc_paused():
        root = compose(text, issues)
        if not issues.items:
            try:
                document = _document(LoadContext(issues, catalog), root)
            except (RecursionError, ValueError, TypeError) as exc:
                issues.at_position(1, 1, "", f"cannot read the config: {exc}")
    if strict:
        issues.items.extend(issues.warnings)
    if issues.items or document is None:
        raise ConfigError(listed(filename, issues.items))
    warnings = listed(filename, issues.warnings, "warnings")
    notes = listed(filename, issues.notes, "notes")
    return replace(document, warnings=tuple(warnings), notes=tuple(notes))


def _single(filename: str, message: str) -> list[Any]:
    issues = Issues(filename)
    issues.at_position(1, 1, "", message)
    return issues.items


def _document(ctx: LoadContext, root: Node | None) -> ConfigDocument | None:
    if root is None:
        ctx.issues.at_position(
            1, 1, "", "the file is empty; expected a mapping with version: v1 and vgpu-configs"
        )
        return None
    if not isinstance(root, MappingNode):
        ctx.add(root, "", f"expected a mapping at the top level, found {describe(root)}")
        return None
    values = known_keys(ctx, root, "", TOP_KEYS, "the top level")
    for key, value in values.items():
        ctx.positions[key] = position(value)

    version = _version(ctx, root, values.get("version"))
    named = configs(ctx, root, values.get("vgpu-configs"))
    names = ctx.declared if named is not None else None
    node_selectors = selectors(ctx, values.get("node-selectors"), names)
    default = config_ref(ctx, values.get("default"), "default", names)
    top = top_policy(ctx, values["policy"], "policy") if "policy" in values else None
    if ctx.issues.items or named is None or version is None:
        return None
    spec = ConfigFile(
        version="v1",
        vgpu_configs=named,
        node_selectors=tuple(node_selectors),
        default=default,
        policy=top,
    )
    return ConfigDocument(spec=spec, file=ctx.issues.file, positions=ctx.positions)


def _version(ctx: LoadContext, root: MappingNode, node: Node | None) -> str | None:
    if node is None:
        ctx.add(root, "version", "missing key 'version'; add version: v1")
        return None
    if not (isinstance(node, ScalarNode) and is_str(node) and node.value == "v1"):
        ctx.add(node, "version", f"unsupported version {describe(node)}; expected v1")
        return None
    return "v1"
