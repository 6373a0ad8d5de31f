"""Limits on the shape of text from outside, checked before it is parsed.

Every YAML or JSON text that crosses a trust boundary (a layouts file or ConfigMap, an
admission review, a node's status, a snapshot or plan file, a simulator spec) is read
with its nesting bounded by :data:`MAX_DEPTH` levels. The JSON check here is a scan of
the text in C-speed passes (no Python loop per character) that runs before
:func:`json.loads` builds anything; the YAML check runs over the parser's events
(``vgpu_state.config.yamlnodes``). Objects are built only by these readers, or by
pydantic's JSON parser, which stops at 200 levels; none is measured again.

Why: ruamel's C composer recurses once per nesting level on the C stack without
Python's recursion guard, so a 60 KB file of 30,000 ``[`` kills the process with
SIGSEGV; CPython's JSON decoder stops at the interpreter's recursion limit (about 1,000
levels) with a ``RecursionError`` that most callers did not expect, and hands back
objects nested nearly that deep otherwise. Real documents nest fewer than 20 levels.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate, compress, count, repeat
from typing import Any

MAX_DEPTH = 64
"""Nesting levels (lists and mappings inside each other) any input may have. Real layouts
nest fewer than 15; a node's status, a fleet snapshot and a saved plan fewer than 20."""


class InputShapeError(ValueError):
    """Text or an object nested deeper, or larger, than a limit allows.

    ``line`` and ``column`` are 1-based (``0`` when the input had no text position).
    """

    def __init__(self, name: str, line: int, column: int, message: str) -> None:
        where = f"{name}:{line}:{column}" if line else name
        super().__init__(f"{where}: {message}")
        self.name = name
        self.line = line
        self.column = column
        self.message = message


def depth_message(limit: int = MAX_DEPTH) -> str:
    return (
        f"nested more than {limit} levels deep "
        "(the limit of lists and mappings inside each other)"
    )


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
"""A string; one left open runs to the end of the text. Every match attempt succeeds, so
the search never restarts inside a string (``"\\"\\"\\"…`` left open would otherwise
be scanned once per quote: quadratic)."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth_offset(text: str, limit: int = MAX_DEPTH) -> int | None:
    """The offset in ``text`` of the first ``[`` or ``{`` nested more than ``limit``
    deep (strings skipped), or ``None`` when the text nests no deeper.

    Brackets inside strings are never counted; a string left open runs to the end of
    the text (the decoder stops there with an error, never reaching what follows).
    The common case runs in regular-expression and itertools passes; only a text that
    is too deep pays for locating the offending bracket.
    """
    if text.count("[") + text.count("{") <= limit:
        return None
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if _first_past(brackets, limit) is None:
        return None
    # Same length as ``text``, strings blanked: the index of a bracket is its offset.
    return _first_past(_JSON_STRING.sub(lambda m: " " * len(m.group()), text), limit)


def _first_past(text: str, limit: int) -> int | None:
    """The index of the first bracket of ``text`` that opens level ``limit + 1``
    (lazy iterators in C: stops there, no Python loop per character)."""
    depths = accumulate(map(_DELTA.get, text, repeat(0)))
    return next(compress(count(), map((limit + 1).__eq__, depths)), None)


def line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of ``offset`` in ``text``."""
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


def check_json_text(text: str, name: str, limit: int = MAX_DEPTH) -> None:
    """Raise :class:`InputShapeError` naming ``name``, line and column when the JSON
    ``text`` nests deeper than ``limit``."""
    offset = json_depth_offset(text, limit)
    if offset is not None:
        line, column = line_column(text, offset)
        raise InputShapeError(name, line, column, depth_message(limit))


_STRUCTURE = re.compile(r"[^\[{,:]+")


def value_count(text: str) -> int:
    """At least as many as the values (and keys) the JSON ``text`` holds: its ``[``,
    ``{``, ``,`` and ``:`` outside strings, plus one."""
    return len(_STRUCTURE.sub("", _JSON_STRING.sub("", text))) + 1


def loads(
    data: str | bytes, name: str, *, limit: int = MAX_DEPTH, max_values: int | None = None
) -> Any:
    """:func:`json.loads` of ``data`` with its nesting (and, given ``max_values``, the
    number of values it builds) bounded first.

    Raises :class:`InputShapeError` (a ``ValueError``) naming ``name`` and the limit, or
    :class:`json.JSONDecodeError` for text that is not JSON; never ``RecursionError``.
    """
    if isinstance(data, bytes | bytearray):
        # As json.loads decodes bytes (UTF-8, -16 or -32, a UTF-8 byte order mark
        # skipped); a UnicodeDecodeError is a ValueError, as from json.loads.
        raw = bytes(data)
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    else:
        text = data
    check_json_text(text, name, limit)
    if max_values is not None and (values := value_count(text)) > max_values:
        raise InputShapeError(
            name, 0, 0, f"about {values} values, more than the limit of {max_values}"
        )
    try:
        return json.loads(text)
    except RecursionError:  # a caller already deep in its own stack
        raise InputShapeError(name, 0, 0, depth_message(limit)) from None
