"""What every section of a config file shares while it is checked."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from vgpu_state.catalog import Catalog, suggest
from vgpu_state.config.yamlnodes import (
    BOOL,
    Issues,
    describe,
    is_str,
    join,
    mapping_items,
    scalar_value,
    tag,
)

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
"""A Kubernetes label value (config names are label values too; at most 63 characters)."""

E = TypeVar("E", bound=StrEnum)


@dataclass
class LoadContext:
    """One file being checked: its issues, the catalog, and where its parts are."""

    issues: Issues
    catalog: Catalog
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Key path (``vgpu-configs.a10[0]``, ``node-selectors[1]``, ``default``) → (line, column)."""
    declared: tuple[str, ...] = ()
    """Every config name the file declares, including ones whose layout has errors."""

    def add(self, node: Node | None, path: str, message: str) -> None:
        self.issues.at(node, path, message)


def unknown_key(key: str, allowed: tuple[str, ...], where: str) -> str:
    """The message for a key ``where`` does not take: the nearest allowed key, or all."""
    hint = suggest(key, allowed)
    if hint is not None:
        return f"unknown key {key!r} in {where}; did you mean {hint}?"
    return f"unknown key {key!r} in {where}; expected one of: {', '.join(allowed)}"


def known_keys(
    ctx: LoadContext, node: MappingNode, path: str, allowed: tuple[str, ...], where: str
) -> dict[str, Node]:
    """The values of ``node``'s keys that are in ``allowed``, in the file's order.

    Every other key is reported at its own position as unknown ``where`` (``an
    entry``, ``policy`` …) with the nearest allowed key, so each section of the
    file reports a misspelt key the same way. Duplicate and non-scalar keys are
    reported by :func:`~vgpu_state.config.yamlnodes.mapping_items`.
    """
    values: dict[str, Node] = {}
    for key, key_node, value in mapping_items(node, path, ctx.issues):
        if key in allowed:
            values[key] = value
        else:
            ctx.add(key_node, join(path, key), unknown_key(key, allowed, where))
    return values


def choice(ctx: LoadContext, node: Node, path: str, kind: type[E]) -> E | None:
    """A value of the string enum ``kind`` (``in-use``, ``sriov``, ``publish``)."""
    allowed = tuple(m.value for m in kind)
    key = path.rsplit(".", 1)[-1]
    if is_str(node) and node.value in allowed:
        return kind(node.value)
    hint = suggest(str(node.value), allowed) if is_str(node) else None
    if isinstance(node, ScalarNode) and tag(node) == BOOL and "off" in allowed:
        hint = "off" if scalar_value(node) is False else None
    tail = f"; did you mean {hint}?" if hint else ""
    ctx.add(node, path, f"{key} must be one of {', '.join(allowed)}, found {describe(node)}{tail}")
    return None
