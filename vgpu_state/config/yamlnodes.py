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
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    ScalarEvent,
)
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from vgpu_state.model.bounded import MAX_DEPTH, depth_message
from vgpu_state.model.errors import ConfigIssue

STR = "tag:yaml.org,2002:str"
INT = "tag:yaml.org,2002:int"
BOOL = "tag:yaml.org,2002:bool"
NULL = "tag:yaml.org,2002:null"
FLOAT = "tag:yaml.org,2002:float"
MERGE = "tag:yaml.org,2002:merge"


MAX_ISSUES = 1000
"""Problems of one file kept with their message; past this each further one is counted
only (a 1 MiB list of one GPU repeated held 350,000 messages, 450 MB)."""
MORE = ConfigIssue("", 0, 0, "", "")
"""Stands for a problem past :data:`MAX_ISSUES` (the lists keep their length, so a section
still sees that it found problems)."""


@dataclass
class Issues:
    """Collects every problem of one file; positions are 1-based. The first
    :data:`MAX_ISSUES` problems and warnings are kept; the rest are counted
    (:func:`listed`)."""

    file: str
    items: list[ConfigIssue] = field(default_factory=list)
    warnings: list[ConfigIssue] = field(default_factory=list)
    """Things to look at that do not make the file invalid (errors under ``strict``)."""
    notes: list[ConfigIssue] = field(default_factory=list)
    """Information about a valid part (a layout that rests on an inferred rule); never
    errors, not even under ``strict``."""

    def at(self, node: Node | None, path: str, message: str) -> None:
        line, column = position(node)
        self._add(self.items, line, column, path, message)

    def warn(self, node: Node | None, path: str, message: str) -> None:
        line, column = position(node)
        self._add(self.warnings, line, column, path, message)

    def note(self, node: Node | None, path: str, message: str) -> None:
        line, column = position(node)
        self._add(self.notes, line, column, path, message)

    def at_position(self, line: int, column: int, path: str, message: str) -> None:
        self._add(self.items, line, column, path, message)

    def _add(self, to: list[ConfigIssue], line: int, column: int, path: str, msg: str) -> None:
        if len(to) < MAX_ISSUES:
            to.append(ConfigIssue(self.file, line, column, path, msg))
        else:
            to.append(MORE)


def listed(file: str, issues: list[ConfigIssue], what: str = "problems") -> list[ConfigIssue]:
    """``issues`` in line order, those past :data:`MAX_ISSUES` said in one last line."""
    kept = sorted((i for i in issues if i is not MORE), key=lambda i: (i.line, i.column))
    more = len(issues) - len(kept)
    if more:
        last = kept[-1].line if kept else 1
        message = f"... and {more} more {what} (the first {len(kept)} are listed)"
        kept.append(ConfigIssue(file, last, 1, "", message))
    return kept


def position(node: Node | None) -> tuple[int, int]:
    if node is None:
        return 1, 1
    mark = node.start_mark
    return int(mark.line) + 1, int(mark.column) + 1


def tag(node: Node) -> str:
    """The node's full tag. A tag the resolver gave (no handle, nothing %-escaped) is its
    suffix as it is: ruamel's ``node.tag`` decodes and caches a new string per node, a
    character at a time (40 MB and seconds for 150,000 scalars)."""
    ctag = getattr(node, "ctag", None)
    suffix = getattr(ctag, "suffix", None)
    if getattr(ctag, "handle", 1) is None and isinstance(suffix, str) and "%" not in suffix:
        return suffix
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


MAX_NODES = 150_000
"""YAML nodes (scalars, lists, mappings) a document may have, every alias counted as the
nodes it repeats: an alias bomb of a few KB is refused before anything walks it, and
composing stays within ~60 MB. Layouts have about 108,000 nodes per MiB, so a ConfigMap
(at most 1 MiB) of real layouts fits."""

PURE_MESSAGES_BYTES = 256 * 1024
"""A text the C parser refuses is parsed again by the pure-Python parser, whose messages
say more, when it is at most this large; a larger one gets the C parser's message (the
pure parser takes seconds per MiB)."""


class ShapeLimitError(MarkedYAMLError):
    """A document nested deeper, or with more nodes, than the limits allow."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(problem=message, problem_mark=mark)
        self.limit_message = message


def too_many_nodes_message(limit: int) -> str:
    return (
        f"more than {limit} YAML nodes, aliases counted as what they repeat "
        "(the limit of a document's size)"
    )


class _ShapeCounter:
    """Depth and node count of an event stream, aliases expanded, checked per event."""

    def __init__(self, max_depth: int, max_nodes: int) -> None:
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.nodes = 0
        self.open: list[tuple[int, Any]] = []  # (nodes before the collection, its anchor)
        self.sizes: dict[Any, int] = {}

    def event(self, event: Any) -> None:
        if isinstance(event, ScalarEvent):
            self._add(1, event)
            if event.anchor is not None:
                self.sizes[event.anchor] = 1
        elif isinstance(event, CollectionStartEvent):
            if len(self.open) >= self.max_depth:
                raise ShapeLimitError(depth_message(self.max_depth), event.start_mark)
            self.open.append((self.nodes, event.anchor))
            self._add(1, event)
        elif isinstance(event, CollectionEndEvent):
            if self.open:
                before, anchor = self.open.pop()
                if anchor is not None:
                    self.sizes[anchor] = self.nodes - before
        elif isinstance(event, AliasEvent):
            self._add(self.sizes.get(event.anchor, 1), event)

    def _add(self, n: int, event: Any) -> None:
        self.nodes += n
        if self.nodes > self.max_nodes:
            raise ShapeLimitError(too_many_nodes_message(self.max_nodes), event.start_mark)


def check_shape(yaml: YAML, text: str, max_depth: int, max_nodes: int) -> None:
    """Run ``yaml``'s parser over ``text`` (events only: no recursion, nothing built) and
    raise :class:`ShapeLimitError` at the first event past a limit. Syntax errors are
    raised as the parser raises them."""
    counter = _ShapeCounter(max_depth, max_nodes)
    events = yaml.parse(text)
    try:
        for event in events:
            counter.event(event)
    finally:
        events.close()


class _OneAnchorComposer(Composer):
    """The composer, with an anchor defined twice an error instead of ruamel's
    ``ReusedAnchorWarning`` (an alias would silently mean the later node), and the
    shape limits checked as it goes (its recursion stays within :data:`MAX_DEPTH`)."""

    _shape: _ShapeCounter | None = None

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self._shape is None:
            self._shape = _ShapeCounter(MAX_DEPTH, MAX_NODES)
        event = self.parser.peek_event()
        if not isinstance(event, AliasEvent):
            anchor = event.anchor
            if anchor is not None and anchor in self.anchors:
                first = self.anchors[anchor].start_mark
                raise ReusedAnchorError(str(anchor), first, event.start_mark)
        self._shape.event(event)
        node = super().compose_node(parent, index)
        if isinstance(event, CollectionStartEvent):
            self._shape.event(CollectionEndEvent())
        return node


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
    pure-Python one) when it is installed, after a pass over the parser's events has
    checked the nesting depth (:data:`MAX_DEPTH`) and the node count
    (:data:`MAX_NODES`): the C composer recurses on the C stack without a guard, so a
    deeply nested text would crash the process. A document the C parser refuses is
    composed again by the pure-Python parser, whose messages name the problem, when it
    is at most :data:`PURE_MESSAGES_BYTES`; a larger one gets the C parser's message.
    An anchor defined twice is refused by both.
    """
    fast_error: Exception
    try:
        fast_yaml = safe_yaml(pure=False)
        check_shape(fast_yaml, text, MAX_DEPTH, MAX_NODES)
        fast: Node | None = safe_yaml(pure=False).compose(text)
        return fast
    except ShapeLimitError as exc:
        raise _problem(exc) from None
    except Exception as exc:  # composed again below for a better message
        fast_error = exc
    if len(text) > PURE_MESSAGES_BYTES and isinstance(fast_error, MarkedYAMLError):
        raise _problem(fast_error) from None
    try:
        node: Node | None = safe_yaml(pure=True).compose(text)
    except ShapeLimitError as exc:
        raise _problem(exc) from None
    except ReusedAnchorError as exc:
        mark = exc.second
        raise YamlProblem(int(mark.line) + 1, int(mark.column) + 1, exc.message()) from None
    except MarkedYAMLError as exc:
        raise _problem(exc) from None
    except (YAMLError, ValueError, RecursionError) as exc:
        raise YamlProblem(1, 1, f"not valid YAML: {exc}") from None
    return node


def _problem(exc: MarkedYAMLError) -> YamlProblem:
    mark = exc.problem_mark or exc.context_mark
    line, column = (int(mark.line) + 1, int(mark.column) + 1) if mark else (1, 1)
    if isinstance(exc, ShapeLimitError):
        return YamlProblem(line, column, exc.limit_message)
    parts = [p for p in (exc.context, exc.problem) if p]
    problem = ", ".join(parts) or "syntax error"
    return YamlProblem(line, column, f"not valid YAML: {problem}")


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
