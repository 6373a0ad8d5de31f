"""Which config a node gets: its label, then the first matching node-selector, then default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vgpu_state.catalog import suggest
from vgpu_state.config.document import ConfigDocument
from vgpu_state.model.errors import SelectionError

DEFAULT_LABEL_KEY = "nvidia.com/vgpu.config"


@dataclass(frozen=True)
class ConfigChoice:
    config: str | None
    """``None`` when nothing selects a config: the node is left alone."""
    source: str
    """``label``, ``node-selector[N]``, ``default`` or ``none``."""
    detail: str
    """One line saying how the choice was made."""


def select(
    document: ConfigDocument,
    node_name: str,
    labels: Mapping[str, str],
    label_key: str = DEFAULT_LABEL_KEY,
) -> ConfigChoice:
    """Pick the config of node ``node_name``; raise ``SelectionError`` for an unknown label."""
    names = document.config_names
    if label_key in labels:
        value = labels[label_key]
        if value not in names:
            hint = suggest(value, names)
            tail = f"; did you mean {hint}?" if hint else f"; it defines: {', '.join(names)}"
            raise SelectionError(
                f"node {node_name}: label {label_key}={value} names no config in "
                f"{document.file}{tail}"
            )
        return ConfigChoice(value, "label", f"node label {label_key}={value}")
    for index, selector in enumerate(document.spec.node_selectors):
        if selector.matches(labels):
            source = f"node-selector[{index}]"
            where = document.location(f"node-selectors[{index}]")
            return ConfigChoice(selector.config, source, f"first matching node-selector ({where})")
    if document.spec.default is not None:
        where = document.location("default")
        return ConfigChoice(document.spec.default, "default", f"default ({where})")
    return ConfigChoice(
        None,
        "none",
        f"no label {label_key}, no node-selector matches and the file has no default",
    )
