"""YAML text → ruamel node tree with positions, and small helpers to read it.

The loader composes the YAML into nodes (no Python objects yet) so that every
key and value keeps its line and column, duplicate keys stay visible, and the
original text of a scalar (``0x223610DE`` unquoted) is still at hand.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from vgpu_state.model.errors import ConfigIssue

STR = "tag:yaml.org,2002:str"
INT = "tag:yaml.org,2002:int"
BOOL = "tag:yaml.org,2002:bool"
NULL = "tag:yaml.org,2002:null"
FLOAT = "tag:yaml.org,2002:float"
MERGE = "tag:yaml.org,2002:merge"


@dataclass
class Issues:
    """Collects every problem of one file; positions are 1-based."""

    file: str
    items: list[ConfigIssue] = field(default_factory=list)
    warnings: list[ConfigIssue] = field(default_factory=list)
    """Things to look at that do not make the file invalid (errors under ``strict``)."""

    def at(self, node: Node | None, path: str, message: str) -> None:
        line, column = position(node)
        self.items.append(ConfigIssue(self.file, line, column, path, message))

    def warn(self, node: Node | None, path: str, message: str) -> None:
        line, column = position(node)
        self.warnings.append(ConfigIssue(self.file, line, column, path, message))

    def at_position(self, line: int, column: int, path: str, message: str) -> None:
        self.items.append(ConfigIssue(self.file, line, column, path, message))


def position(node: Node | None) -> tuple[int, int]:
    if node is None:
        return 1, 1
    mark = node.start_mark
    return int(mark.line) + 1, int(mark.column) + 1


def tag(node: Node) -> str:
    return str(node.tag)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: its full passes over a growing node tree
    made loading a config of megabytes quadratic. Nothing built here is cyclic garbage."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class ReusedAnchorError(MarkedYAMLError):
    """An anchor named a second time in one document."""

    def __init__(self, anchor: str, first: Any, second: Any) -> None:
        super().__init__(problem=f"found duplicate anchor {anchor!r}", problem_mark=second)
        self.anchor = anchor
        self.first = first
        self.second = second

    def message(self) -> str:
        return (
            f"anchor &{self.anchor} is already defined on line {int(self.first.line) + 1}, "
            f"column {int(self.first.column) + 1}; give each anchor its own name"
        )


class _OneAnchorComposer(Composer):
    """The composer, with an anchor defined twice an error instead of ruamel's
    ``ReusedAnchorWarning`` (an alias would silently mean the later node)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if not self.parser.check_event(AliasEvent):
            event = self.parser.peek_event()
            anchor = event.anchor
            if anchor is not None and anchor in self.anchors:
                first = self.anchors[anchor].start_mark
                raise ReusedAnchorError(str(anchor), first, event.start_mark)
        return super().compose_node(parent, index)


class YamlProblem(Exception):
    """Why a text is not a usable YAML document; ``line`` and ``column`` are 1-based."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(f"{line}:{column}: {message}")
        self.line = line
        self.column = column
        self.message = message


def safe_yaml(*, pure: bool) -> YAML:
    """ruamel's safe loader that refuses an anchor defined twice (the pure-Python
    composer only warns; ruamel's C parser refuses it already)."""
    yaml = YAML(typ="safe", pure=pure)
    yaml.Composer = _OneAnchorComposer  # used unless ruamel's C parser composes
    return yaml


def compose_text(text: str) -> Node | None:
    """Compose ``text`` into a node tree, or raise :class:`YamlProblem`.

    The tree is composed by ruamel's C parser (libyaml, about 10x faster than the
    pure-Python one) when it is installed. A document the C parser refuses is
    composed again by the pure-Python parser, whose messages name the problem.
    An anchor defined twice is refused by both.
    """
    try:
        fast: Node | None = safe_yaml(pure=False).compose(text)
        return fast
    except Exception:
        pass
    try:
        node: Node | None = safe_yaml(pure=True).compose(text)
    except ReusedAnchorError as exc:
        mark = exc.second
        raise YamlProblem(int(mark.line) + 1, int(mark.column) + 1, exc.message()) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (int(mark.line) + 1, int(mark.column) + 1) if mark else (1, 1)
        parts = [p for p in (exc.context, exc.problem) if p]
        problem = ", ".join(parts) or "syntax error"
        raise YamlProblem(line, column, f"not valid YAML: {problem}") from None
    except (YAMLError, ValueError, RecursionError) as exc:
        raise YamlProblem(1, 1, f"not valid YAML: {exc}") from None
    return node


def compose(text: str, issues: Issues) -> Node | None:
    """Compose ``text`` (see :func:`compose_text`) with the garbage collector paused;
    a document that is not usable YAML becomes an issue and ``None``."""
    with gc_paused():
        try:
            return compose_text(text)
        except YamlProblem as problem:
            issues.at_position(problem.line, problem.column, "", problem.message)
            return None


def scalar_value(node: ScalarNode) -> Any:
    """The Python value of a scalar under the YAML 1.2 core schema."""
    text = str(node.value)
    kind = tag(node)
    if kind == INT:
        digits = text.replace("_", "")
        try:
            return int(digits, 0)
        except ValueError:
            try:
                return int(digits, 10)
            except ValueError:
                return text
    if kind == BOOL:
        return text.lower() == "true"
    if kind == NULL:
        return None
    if kind == FLOAT:
        try:
            return float(text.replace("_", ""))
        except ValueError:
            return text
    return text


def describe(node: Node) -> str:
    """A short rendering of a node's value for messages: ``'abc'``, ``7``, ``a list``."""
    if isinstance(node, ScalarNode):
        value = scalar_value(node)
        if value is None:
            return "nothing (null)"
        if isinstance(value, bool):
            return f"{str(value).lower()} (a boolean)"
        if isinstance(value, int | float):
            return str(node.value)
        return repr(str(node.value))
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return "an unsupported value"


def is_str(node: Node) -> bool:
    return isinstance(node, ScalarNode) and tag(node) == STR


def mapping_items(node: MappingNode, path: str, issues: Issues) -> list[tuple[str, Node, Node]]:
    """(key text, key node, value node) of a mapping; duplicates and odd keys become issues."""
    seen: dict[str, Node] = {}
    items: list[tuple[str, Node, Node]] = []
    for key_node, value_node in node.value:
        if not isinstance(key_node, ScalarNode):
            issues.at(key_node, path, f"a key must be a plain name, found {describe(key_node)}")
            continue
        if tag(key_node) == MERGE:
            issues.at(key_node, path, "merge keys (<<) are not supported; write the keys out")
            continue
        key = str(key_node.value)
        if key in seen:
            first = position(seen[key])[0]
            issues.at(
                key_node,
                join(path, key),
                f"duplicate key {key!r} (first defined on line {first})",
            )
            continue
        seen[key] = key_node
        items.append((key, key_node, value_node))
    return items


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
