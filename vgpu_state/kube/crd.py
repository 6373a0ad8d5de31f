"""The ``VGPUNodeState`` CustomResourceDefinition, generated from the status models.

``scripts/gen_crd.py`` writes it to ``schemas/vgpunodestate.crd.yaml``; a test
fails when the file is stale. Pydantic's JSON Schema is turned into a
structural OpenAPI v3 schema as the API server requires: references inlined,
optional fields as plain (omittable) properties, no titles, and lists keyed
like Kubernetes lists (conditions by ``type``, GPUs by ``address``, capacity
by ``resourceName``). The models' bounds (``max_length``) become ``maxItems`` and
``maxLength``, and the status's CEL rule (``x-kubernetes-validations``) is kept: the
API server refuses a status beyond them when it is written.
"""

from __future__ import annotations

from typing import Any

from vgpu_state.kube.nodestate import (
    GROUP,
    KIND,
    NAME_LENGTH,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    VGPUNodeStateStatus,
)

JsonSchema = dict[str, Any]

_LIST_KEYS = {"conditions": "type", "gpus": "address", "capacity": "resourceName", "vgpus": "id"}

PRINTER_COLUMNS: tuple[JsonSchema, ...] = (
    {
        "name": "Config",
        "type": "string",
        "jsonPath": ".status.selectedConfig.name",
        "description": "The selected config.",
    },
    {
        "name": "State",
        "type": "string",
        "jsonPath": ".status.state",
        "description": "pending, success or failed.",
    },
    {
        "name": "Mode",
        "type": "string",
        "jsonPath": ".status.mode",
        "description": "The agent's mode: enforce or plan-only.",
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "description": "The Ready condition's reason: Ready, or why the last reconcile failed "
        "(e.g. NoGpus, HostUnreadable, ConfigInvalid).",
    },
    {
        "name": "vGPUs",
        "type": "integer",
        "jsonPath": ".status.vgpuCount",
        "description": "vGPUs on the node.",
    },
    {
        "name": "Blocked",
        "type": "integer",
        "jsonPath": ".status.blockedCount",
        "description": "Blocked items of the last plan.",
    },
    {
        "name": "Allocatable",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="KubeletAllocatable")].status',
        "description": "Does the kubelet offer what the device plugin advertises? "
        "(the KubeletAllocatable condition)",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


def status_schema() -> JsonSchema:
    raw = VGPUNodeStateStatus.model_json_schema(by_alias=True, mode="serialization")
    defs = raw.pop("$defs", {})
    schema: JsonSchema = _structural(raw, defs, None)
    return schema


def _structural(node: Any, defs: dict[str, Any], key: str | None) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs, key) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs, key)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            return _structural({**options[0], **rest}, defs, key)
    out: JsonSchema = {}
    for k, v in node.items():
        if k in ("title", "default"):
            continue
        if k == "const":
            out["enum"] = [v]
            continue
        if k == "properties":
            out[k] = {name: _structural(sub, defs, name) for name, sub in v.items()}
            continue
        out[k] = _structural(v, defs, key)
    if out.get("type") == "array" and "prefixItems" in out:  # fixed tuples: none expected
        raise ValueError(f"{key}: fixed-length tuples cannot be a Kubernetes list")
    if out.get("type") == "array" and key in _LIST_KEYS:
        out["x-kubernetes-list-type"] = "map"
        out["x-kubernetes-list-map-keys"] = [_LIST_KEYS[key]]
        items = out.get("items", {})
        required = set(items.get("required", []))
        required.add(_LIST_KEYS[key])
        items["required"] = sorted(required)
    if "properties" in out:
        # A structural schema may not combine properties with additionalProperties;
        # the API server prunes unknown fields instead.
        out.pop("additionalProperties", None)
    return out


def crd() -> JsonSchema:
    """The CustomResourceDefinition document."""
    status = status_schema()
    status["description"] = "What the node has and how its last reconcile went."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": list(PRINTER_COLUMNS),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "The vGPU state of one node, named after the node.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "nodeName": {
                                            "type": "string",
                                            "maxLength": NAME_LENGTH,
                                            "description": "The node this object describes.",
                                        }
                                    },
                                },
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }
