"""``node-selectors`` and the config names that ``default`` and a selector give."""

from __future__ import annotations

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from vgpu_state.catalog import suggest
from vgpu_state.config.document import LABEL_OPERATORS, LabelExpression, NodeSelector
from vgpu_state.config.sections.context import LABEL_VALUE, LoadContext, known_keys
from vgpu_state.config.yamlnodes import describe, is_str, join, mapping_items, position

SELECTOR_KEYS = ("match-labels", "match-expressions", "config")
EXPRESSION_KEYS = ("key", "operator", "values")


def config_ref(
    ctx: LoadContext, node: Node | None, path: str, names: tuple[str, ...] | None
) -> str | None:
    """A config name (``default``, a selector's ``config``); one of ``names`` when known."""
    if node is None:
        return None
    if not is_str(node):
        ctx.add(node, path, f"{path} must name a config, found {describe(node)}")
        return None
    name = str(node.value)
    if names is not None and name not in names:
        hint = suggest(name, names)
        tail = f"; did you mean {hint}?" if hint else f"; defined: {', '.join(names)}"
        ctx.add(node, path, f"unknown config {name!r}{tail}")
    return name


def selectors(
    ctx: LoadContext, node: Node | None, names: tuple[str, ...] | None
) -> list[NodeSelector]:
    path = "node-selectors"
    if node is None:
        return []
    if not isinstance(node, SequenceNode):
        ctx.add(node, path, f"node-selectors must be a list, found {describe(node)}")
        return []
    out = []
    for index, item in enumerate(node.value):
        spath = f"{path}[{index}]"
        ctx.positions[spath] = position(item)
        selector = _selector(ctx, item, spath, names)
        if selector is not None:
            out.append(selector)
    return out


def _selector(
    ctx: LoadContext, node: Node, path: str, names: tuple[str, ...] | None
) -> NodeSelector | None:
    if not isinstance(node, MappingNode):
        ctx.add(
            node,
            path,
            f"a node-selector must be a mapping with config and "
            f"match-labels or match-expressions, found {describe(node)}",
        )
        return None
    values = known_keys(ctx, node, path, SELECTOR_KEYS, "a node-selector")
    before = len(ctx.issues.items)
    if "config" not in values:
        ctx.add(node, path, "missing key 'config' in this node-selector")
    config = config_ref(ctx, values.get("config"), join(path, "config"), names)
    labels = _match_labels(ctx, values.get("match-labels"), join(path, "match-labels"))
    expressions = _expressions(
        ctx, values.get("match-expressions"), join(path, "match-expressions")
    )
    if len(ctx.issues.items) != before or config is None:
        return None
    return NodeSelector(match_labels=labels, match_expressions=expressions, config=config)


def _label_value(ctx: LoadContext, node: Node, path: str) -> str | None:
    if not is_str(node):
        hint = f"; quote it: '{node.value}'" if isinstance(node, ScalarNode) else ""
        ctx.add(node, path, f"a label value must be a string, found {describe(node)}{hint}")
        return None
    text = str(node.value)
    if len(text) > 63 or not LABEL_VALUE.match(text):
        ctx.add(
            node,
            path,
            f"{text!r} is not a valid label value (at most 63 letters, "
            "digits, '-', '_' or '.', starting and ending with a letter or digit)",
        )
        return None
    return text


def _match_labels(ctx: LoadContext, node: Node | None, path: str) -> dict[str, str]:
    if node is None:
        return {}
    if not isinstance(node, MappingNode):
        ctx.add(node, path, f"match-labels must map label keys to values, found {describe(node)}")
        return {}
    out = {}
    for key, _, value in mapping_items(node, path, ctx.issues):
        text = _label_value(ctx, value, join(path, key))
        if text is not None:
            out[key] = text
    return out


def _expressions(ctx: LoadContext, node: Node | None, path: str) -> tuple[LabelExpression, ...]:
    if node is None:
        return ()
    if not isinstance(node, SequenceNode):
        ctx.add(node, path, f"match-expressions must be a list, found {describe(node)}")
        return ()
    out = []
    for index, item in enumerate(node.value):
        expr = _expression(ctx, item, f"{path}[{index}]")
        if expr is not None:
            out.append(expr)
    return tuple(out)


def _expression(ctx: LoadContext, node: Node, path: str) -> LabelExpression | None:
    if not isinstance(node, MappingNode):
        ctx.add(
            node,
            path,
            f"a match-expression must be a mapping with key, operator "
            f"and values, found {describe(node)}",
        )
        return None
    values = known_keys(ctx, node, path, EXPRESSION_KEYS, "a match-expression")
    before = len(ctx.issues.items)
    for required in ("key", "operator"):
        if required not in values:
            ctx.add(node, path, f"missing key {required!r} in this match-expression")
    label_key = values.get("key")
    if label_key is not None and not (is_str(label_key) and label_key.value):
        ctx.add(
            label_key,
            join(path, "key"),
            f"key must be a label key, found {describe(label_key)}",
        )
    operator = values.get("operator")
    op = str(operator.value) if operator is not None and is_str(operator) else None
    if operator is not None and op not in LABEL_OPERATORS:
        hint = suggest(op, LABEL_OPERATORS) if op else None
        tail = f"; did you mean {hint}?" if hint else ""
        ctx.add(
            operator,
            join(path, "operator"),
            f"operator must be one of "
            f"{', '.join(LABEL_OPERATORS)}, found {describe(operator)}{tail}",
        )
    label_values: list[str] = []
    vnode = values.get("values")
    vpath = join(path, "values")
    if vnode is not None and not isinstance(vnode, SequenceNode):
        ctx.add(vnode, vpath, f"values must be a list of strings, found {describe(vnode)}")
    elif vnode is not None:
        for index, item in enumerate(vnode.value):
            text = _label_value(ctx, item, f"{vpath}[{index}]")
            if text is not None:
                label_values.append(text)
    if op in ("In", "NotIn") and not (isinstance(vnode, SequenceNode) and vnode.value):
        ctx.add(
            vnode or node,
            vpath if vnode else path,
            f"operator {op} needs a non-empty list of values",
        )
    if op in ("Exists", "DoesNotExist") and isinstance(vnode, SequenceNode) and vnode.value:
        ctx.add(vnode, vpath, f"operator {op} takes no values; remove them")
    if len(ctx.issues.items) != before or label_key is None or op is None:
        return None
    return LabelExpression(
        key=str(label_key.value),
        operator=op,
        values=tuple(label_values),
    )
