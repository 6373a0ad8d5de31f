"""``policy``: at the top level and in a config (``in-use``, ``prune``, ``sriov`` …)."""

from __future__ import annotations

from typing import Any

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from vgpu_state.config.document import PolicySpec
from vgpu_state.config.sections.context import LoadContext, choice, known_keys
from vgpu_state.config.yamlnodes import BOOL, INT, describe, join, scalar_value, tag
from vgpu_state.model.policy import InUsePolicy, MissingGpus, Publish, SriovPolicy

POLICY_KEYS = ("in-use", "prune", "sriov", "max-unavailable", "publish", "missing-gpus")


def policy(ctx: LoadContext, node: Node, path: str) -> PolicySpec | None:
    if not isinstance(node, MappingNode):
        ctx.add(
            node,
            path,
            "policy must be a mapping with in-use, prune, sriov, max-unavailable, publish "
            "or missing-gpus, "
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
            if isinstance(value, ScalarNode) and tag(value) == BOOL:
                fields["prune"] = scalar_value(value)
            else:
                ctx.add(value, kpath, f"prune must be true or false, found {describe(value)}")
        else:
            number = scalar_value(value) if isinstance(value, ScalarNode) else None
            if tag(value) == INT and isinstance(number, int) and number >= 1:
                fields["max_unavailable"] = number
            else:
                ctx.add(
                    value,
                    kpath,
                    "max-unavailable must be a whole number of 1 or more, "
                    f"found {describe(value)}",
                )
    if any(v is None for v in fields.values()):
        return None
    return PolicySpec(**fields)
