"""Config language: YAML with positions, validation, node selection, resolution onto GPUs.

Public API::

    load_file(path, *, catalog) -> ConfigDocument
    load_text(text, filename, *, catalog) -> ConfigDocument
    dump(document) -> str
    select(document, node_name, labels, label_key="nvidia.com/vgpu.config") -> ConfigChoice
    resolve(document, config_name, gpus, node_name, source, catalog) -> DesiredState
    json_schema() -> dict

``docs/config.md`` is the language reference.
"""

from vgpu_state.config.document import (
    ConfigDocument,
    ConfigFile,
    Entry,
    LabelExpression,
    NamedConfig,
    NodeSelector,
    PolicySpec,
)
from vgpu_state.config.dump import dump
from vgpu_state.config.filters import DeviceFilter, parse_device_filter
from vgpu_state.config.loader import load_file, load_text
from vgpu_state.config.resolution import gpu_model, resolve
from vgpu_state.config.schema import json_schema, json_schema_text
from vgpu_state.config.selection import (
    DEFAULT_LABEL_KEY,
    ConfigChoice,
    check_default_config,
    select,
)
from vgpu_state.config.source import FileConfigSource, StaticConfigSource
from vgpu_state.config.typenames import canonical_type_name, type_name_problem

__all__ = [
    "DEFAULT_LABEL_KEY",
    "ConfigChoice",
    "ConfigDocument",
    "ConfigFile",
    "DeviceFilter",
    "Entry",
    "FileConfigSource",
    "LabelExpression",
    "NamedConfig",
    "NodeSelector",
    "PolicySpec",
    "StaticConfigSource",
    "canonical_type_name",
    "check_default_config",
    "dump",
    "gpu_model",
    "json_schema",
    "json_schema_text",
    "load_file",
    "load_text",
    "parse_device_filter",
    "resolve",
    "select",
    "type_name_problem",
]
