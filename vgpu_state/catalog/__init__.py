"""GPU models and their vGPU types; type-name parsing."""

from vgpu_state.catalog.catalog import (
    SYNTHETIC_TYPE_ID_BASE,
    Catalog,
    GpuModel,
    VgpuType,
    default_catalog,
    suggest,
)
from vgpu_state.catalog.names import (
    ParsedTypeName,
    parse_type_name,
    short_type_name,
    type_sort_key,
)

__all__ = [
    "SYNTHETIC_TYPE_ID_BASE",
    "Catalog",
    "GpuModel",
    "ParsedTypeName",
    "VgpuType",
    "default_catalog",
    "parse_type_name",
    "short_type_name",
    "suggest",
    "type_sort_key",
]
