"""``policy``: at the top level and in a config (``in-use``, ``prune``, ``sriov`` …)."""

from __future__ import annotations

import re
from typing import Any

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from vgpu_state.config.document import (
    MAX_EVACUATION_MOVES,
    MAX_EVACUATION_TIMEOUT,
    MIN_EVACUATION_TIMEOUT,
    EvacuationSpec,
    PolicySpec,
    TopEvacuationSpec,
    TopPolicySpec,
    duration_seconds,
)
from vgpu_state.config.sections.context import LoadContext, choice, known_keys
from vgpu_state.config.yamlnodes import BOOL, INT, describe, is_str, join, scalar_value, tag
from vgpu_state.model.policy import InUsePolicy, MissingGpus, Publish, SriovPolicy

POLICY_KEYS = (
    "in-use",
    "prune",
    "sriov",
    "max-unavailable",
    "publish",
    "missing-gpus",
    "evacuation",
)
EVACUATION_KEYS = ("max-in-flight", "max-per-node", "timeout", "restart")
_DURATION = re.compile(r"^([0-9]{1,6})([smh])$")


def policy(ctx: LoadContext, node: Node, path: str) -> PolicySpec | None:
    """A config's own ``policy`` mapping."""
    fields = _policy_fields(ctx, node, path, top=False)
    return PolicySpec(**fields) if fields is not None else None


def top_policy(ctx: LoadContext, node: Node, path: str) -> TopPolicySpec | None:
    """The top-level ``policy`` mapping (it alone sets ``evacuation.max-in-flight``)."""
    fields = _policy_fields(ctx, node, path, top=True)
    return TopPolicySpec(**fields) if fields is not None else None


def _policy_fields(ctx: LoadContext, node: Node, path: str, *, top: bool) -> dict[str, Any] | None:
    if not isinstance(node, MappingNode):
        ctx.add(
            node,
            path,
            "policy must be a mapping with in-use, prune, sriov, max-unavailable, publish, "
            "missing-gpus or evacuation, "
            f"found {describe(node)}",
        )
        return None
    fields: dict[str, Any] = {}
    for key, value in known_keys(ctx, node, path, POLICY_KEYS, "policy").items():
        kpath = join(path, key)
        if key == "in-use":
            fields["in_use"] = choice(ctx, value, kpath, InUsePolicy)
        elif key == "sriov":
            fields["sriov"] = choice(ctx, value, kpath, SriovPolicy)
        elif key == "publish":
            fields["publish"] = choice(ctx, value, kpath, Publish)
        elif key == "missing-gpus":
            fields["missing_gpus"] = choice(ctx, value, kpath, MissingGpus)
        elif key == "prune":
            fields["prune"] = _bool(ctx, value, kpath)
        elif key == "evacuation":
            fields["evacuation"] = evacuation(ctx, value, kpath, top=top)
        else:
            fields["max_unavailable"] = _whole(ctx, value, kpath, 1, None)
    if any(v is None for v in fields.values()):
        return None
    return fields


def evacuation(
    ctx: LoadContext, node: Node, path: str, *, top: bool = False
) -> EvacuationSpec | None:
    """``evacuation:`` of a policy: ``in-use: evacuate``'s limits. ``max-in-flight`` counts
    fleet-wide, so only the top-level policy (``top``) may set it."""
    if not isinstance(node, MappingNode):
        ctx.add(
            node,
            path,
            "evacuation must be a mapping with max-in-flight, max-per-node, timeout or "
            f"restart, found {describe(node)}",
        )
        return None
    fields: dict[str, Any] = {}
    for key, value in known_keys(ctx, node, path, EVACUATION_KEYS, "evacuation").items():
        kpath = join(path, key)
        if key == "max-in-flight":
            if not top:
                ctx.add(
                    value,
                    kpath,
                    f"max-in-flight (found {describe(value)}) counts VMs moving at once across "
                    "the whole fleet, so only the top-level policy sets it; move it to "
                    "policy.evacuation at the top of the file",
                )
                fields["max_in_flight"] = None
                continue
            fields["max_in_flight"] = _whole(ctx, value, kpath, 0, MAX_EVACUATION_MOVES)
        elif key == "max-per-node":
            fields["max_per_node"] = _whole(ctx, value, kpath, 1, MAX_EVACUATION_MOVES)
        elif key == "restart":
            fields["restart"] = _bool(ctx, value, kpath)
        else:
            fields["timeout"] = _duration(ctx, value, kpath)
    if any(v is None for v in fields.values()):
        return None
    return TopEvacuationSpec(**fields) if top else EvacuationSpec(**fields)


def _bool(ctx: LoadContext, node: Node, path: str) -> bool | None:
    if isinstance(node, ScalarNode) and tag(node) == BOOL:
        return bool(scalar_value(node))
    key = path.rsplit(".", 1)[-1]
    ctx.add(node, path, f"{key} must be true or false, found {describe(node)}")
    return None


def _whole(ctx: LoadContext, node: Node, path: str, low: int, high: int | None) -> int | None:
    """A whole number from ``low`` to ``high`` (no upper bound when ``None``)."""
    number = scalar_value(node) if isinstance(node, ScalarNode) else None
    if (
        tag(node) == INT
        and isinstance(number, int)
        and not isinstance(number, bool)
        and low <= number
        and (high is None or number <= high)
    ):
        return number
    key = path.rsplit(".", 1)[-1]
    if high is None:
        bound = f"a whole number of {low} or more"
    else:
        bound = f"a whole number from {low} to {high}"
    ctx.add(node, path, f"{key} must be {bound}, found {describe(node)}")
    return None


def _duration(ctx: LoadContext, node: Node, path: str) -> str | None:
    """A duration (``90s``, ``10m``, ``1h``) from 10s to 24h, kept as written."""
    low, high = _text(MIN_EVACUATION_TIMEOUT), _text(MAX_EVACUATION_TIMEOUT)
    key = path.rsplit(".", 1)[-1]
    text = str(node.value) if is_str(node) else None
    if text is None or _DURATION.match(text) is None:
        hint = f"; did you mean {node.value}s?" if tag(node) == INT else ""
        ctx.add(
            node,
            path,
            f"{key} must be a duration such as 90s, 10m or 1h (a whole number with s, m or "
            f"h), found {describe(node)}{hint}",
        )
        return None
    seconds = duration_seconds(text)
    if not MIN_EVACUATION_TIMEOUT <= seconds <= MAX_EVACUATION_TIMEOUT:
        ctx.add(node, path, f"{key} must be from {low} to {high}, found {describe(node)}")
        return None
    return text


def _text(seconds: int) -> str:
    """``10s``, ``24h``: a bound as a duration."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"
