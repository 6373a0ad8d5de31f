"""The Node: its labels (which config it wants) and the keys vgpu-state writes back.

vgpu-state writes exactly these keys, with a JSON merge patch that names no
other key, so labels and annotations of other controllers are never touched:

* the vgpu-device-manager state label ``nvidia.com/vgpu.config.state``
  (``pending`` while an apply runs, then ``success`` or ``failed``);
* annotations with the applied config name, the config document's hash and
  the last plan's one-line summary.

With ``--gpu-operator`` the agent also moves the GPU Operator's two sandbox
labels between ``true`` and ``paused-for-vgpu-change`` and keeps the annotation
``vgpu-state.io/paused-operands`` (:mod:`vgpu_state.kube.gpuoperator`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpu_state.kube.api import JsonObject, KubeApi, path_of
from vgpu_state.model.status import ConfigState

STATE_LABEL = "nvidia.com/vgpu.config.state"
APPLIED_CONFIG_ANNOTATION = "vgpu-state.io/applied-config"
CONFIG_HASH_ANNOTATION = "vgpu-state.io/config-hash"
LAST_PLAN_ANNOTATION = "vgpu-state.io/last-plan"


def node_path(name: str) -> str:
    return path_of("", "v1", "nodes", name)


def read_node(api: KubeApi, name: str) -> JsonObject:
    return api.get(node_path(name))


def labels_of(node: Mapping[str, Any]) -> dict[str, str]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def annotations_of(node: Mapping[str, Any]) -> dict[str, str]:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return {str(k): str(v) for k, v in annotations.items()}


def state_patch(
    state: ConfigState | None = None,
    *,
    applied_config: str | None = None,
    config_hash: str | None = None,
    plan_summary: str | None = None,
) -> JsonObject:
    """The merge patch for the state label and annotations; keys left ``None`` are not sent."""
    metadata: JsonObject = {}
    if state is not None:
        metadata["labels"] = {STATE_LABEL: state.value}
    annotations = {
        key: value
        for key, value in (
            (APPLIED_CONFIG_ANNOTATION, applied_config),
            (CONFIG_HASH_ANNOTATION, config_hash),
            (LAST_PLAN_ANNOTATION, plan_summary),
        )
        if value is not None
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata} if metadata else {}


def write_state(
    api: KubeApi,
    name: str,
    state: ConfigState | None = None,
    *,
    applied_config: str | None = None,
    config_hash: str | None = None,
    plan_summary: str | None = None,
    current: Mapping[str, Any] | None = None,
) -> JsonObject | None:
    """Merge-patch the state label and annotations onto the Node; returns the Node.

    ``current``: the Node as last read; when it already carries every value,
    nothing is sent (``None`` is returned), so a steady node costs no write.
    """
    patch = state_patch(
        state, applied_config=applied_config, config_hash=config_hash, plan_summary=plan_summary
    )
    if not patch or (current is not None and already_holds(current, patch)):
        return None
    return api.patch(node_path(name), patch, "merge")


def already_holds(node: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """``node`` already carries every label and annotation of a :func:`state_patch`."""
    metadata = patch.get("metadata") or {}
    labels = labels_of(node)
    annotations = annotations_of(node)
    return all(labels.get(k) == v for k, v in (metadata.get("labels") or {}).items()) and all(
        annotations.get(k) == v for k, v in (metadata.get("annotations") or {}).items()
    )
