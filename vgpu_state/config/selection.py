"""Which config a node gets: its label, then the first matching node-selector, then the
file's default, then ``--default-config``."""

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
    """``label``, ``node-selector[N]``, ``default``, ``default-config`` or ``none``."""
    detail: str
    """One line saying how the choice was made."""


def check_default_config(document: ConfigDocument, default_config: str | None) -> None:
    """Raise ``SelectionError`` when ``--default-config`` names no config of the file."""
    names = document.config_names
    if default_config is None or default_config in names:
        return
    hint = suggest(default_config, names)
    tail = f"; did you mean {hint}?" if hint else f"; it defines: {', '.join(names)}"
    raise SelectionError(
        f"--default-config {default_config} names no config in {document.file}{tail}"
    )


def select(
    document: ConfigDocument,
    node_name: str,
    labels: Mapping[str, str],
    label_key: str = DEFAULT_LABEL_KEY,
    default_config: str | None = None,
) -> ConfigChoice:
    """Pick the config of node ``node_name``; raise ``SelectionError`` for an unknown label.

    ``default_config`` (``--default-config``, ``$DEFAULT_VGPU_CONFIG``) is the config of
    a node that neither its label nor a node-selector chooses when the file has no
    ``default:`` (the file's own key comes first). It must name a config of the file.
    """
    names = document.config_names
    check_default_config(document, default_config)
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
    if default_config is not None:
        return ConfigChoice(
            default_config,
            "default-config",
            f"no label {label_key}, no node-selector matches and the file has no default: "
            f"--default-config {default_config}",
        )
    return ConfigChoice(
        None,
        "none",
        f"no label {label_key}, no node-selector matches and the file has no default",
    )
