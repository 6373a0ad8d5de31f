"""A config document back to YAML that loads to an equal document."""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML

from vgpu_state.config.document import ConfigDocument, Entry, NamedConfig, PolicySpec


def _policy(policy: PolicySpec) -> dict[str, Any]:
    return policy.model_dump(mode="json", by_alias=True, exclude_none=True)


def _entry(entry: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "devices": entry.devices if entry.devices == "all" else list(entry.devices)
    }
    if len(entry.device_filter) == 1:
        out["device-filter"] = entry.device_filter[0]
    elif entry.device_filter:
        out["device-filter"] = list(entry.device_filter)
    out["vgpu-devices"] = dict(entry.vgpu_devices)
    if entry.publish is not None:
        out["publish"] = entry.publish.value
    if entry.mode is not None:
        out["mode"] = entry.mode.value
    if entry.mig_geometry is not None:
        out["mig-geometry"] = dict(entry.mig_geometry)
    return out


def _config(config: NamedConfig) -> Any:
    entries = [_entry(e) for e in config.entries]
    if config.policy is None:
        return entries
    return {"policy": _policy(config.policy), "entries": entries}


def to_data(document: ConfigDocument) -> dict[str, Any]:
    """Plain data in the file's shape (keys as written in YAML)."""
    spec = document.spec
    data: dict[str, Any] = {"version": spec.version}
    if spec.policy is not None:
        data["policy"] = _policy(spec.policy)
    if spec.default is not None:
        data["default"] = spec.default
    if spec.node_selectors:
        data["node-selectors"] = [
            s.model_dump(mode="json", by_alias=True, exclude_defaults=True)
            for s in spec.node_selectors
        ]
    data["vgpu-configs"] = {name: _config(c) for name, c in spec.vgpu_configs.items()}
    return data


def dump(document: ConfigDocument) -> str:
    """YAML text of ``document``; ``load_text(dump(d)) == d``."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
    stream = io.StringIO()
    yaml.dump(to_data(document), stream)
    return stream.getvalue()
