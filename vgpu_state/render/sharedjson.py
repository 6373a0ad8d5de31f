"""JSON of many plans at once, with the text of the values they share written once.

A fleet's plans share most of their parts by identity: the GPU headers, the
capacity rows and the policy of a pool's nodes are one frozen value each, and a
vendor-VFIO GPU's steps are one tuple of :class:`~vgpu_state.model.plan.Action`
values for every GPU of a pool at one address (see ``SharedParts``). A
:class:`SharedJson` writes a plan as ``pydantic_core.to_json(plan, indent=2)``
does, byte for byte, but takes each such part's text from what it wrote before
(kept with the value itself, so an id never names another object while its
text is kept), and serialises only the parts it has not seen.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_json

_INDENT = b"  "


@functools.cache
def _plain_fields(cls: type[BaseModel]) -> tuple[tuple[str, bytes], ...] | None:
    """``cls``'s fields in order, each with its JSON key and the text before its value,
    when ``to_json`` writes every field of it as it is (no alias, no exclusion, no
    serializer of its own or computed field); ``None`` when it does not."""
    decorators = cls.__pydantic_decorators__
    if (
        decorators.field_serializers
        or decorators.model_serializers
        or decorators.computed_fields
        or cls.model_config.get("alias_generator") is not None
        or cls.model_config.get("serialize_by_alias")
    ):
        return None
    fields: list[tuple[str, bytes]] = []
    for name, info in cls.model_fields.items():
        if (
            info.exclude
            or getattr(info, "exclude_if", None) is not None
            or info.serialization_alias not in (None, name)
            or info.alias not in (None, name)
        ):
            return None
        fields.append((name, to_json(name)))
    return tuple(fields)


class SharedJson:
    """Writes plans (and documents holding them) as ``to_json(value, indent=2)`` would,
    remembering the text of the model values it wrote, by identity: a value seen again
    (a part many plans share) is not serialised again, nor is a list of such values.
    A model whose fields are all hashable (a plan's summary, its selection) is
    remembered by its class and field values. What is remembered is bounded
    (:attr:`BUDGET` bytes of text, :attr:`LIMIT` values): past either, it is forgotten."""

    BUDGET = 4 * 1024 * 1024
    LIMIT = 4096

    def __init__(self) -> None:
        self._kept: dict[tuple[int, int], tuple[BaseModel, bytes]] = {}
        self._by_value: dict[tuple[Any, ...], bytes] = {}
        self._seen: dict[int, Any] = {}
        """Items of lists written whole, by identity (kept alive while here): their text
        is remembered when they are met again."""
        self._lists: dict[tuple[int, ...], tuple[tuple[Any, ...], bytes]] = {}
        self._held = 0

    def _hold(self, size: int) -> None:
        """Count ``size`` bytes of text about to be remembered; forget everything first
        when the budget would be exceeded."""
        if self._held + size > self.BUDGET or len(self._kept) + len(self._seen) >= self.LIMIT:
            self._kept.clear()
            self._by_value.clear()
            self._seen.clear()
            self._lists.clear()
            self._held = 0
        self._held += size

    def model(self, value: BaseModel, level: int) -> bytes:
        """``value`` written at ``level`` (its first line where the writer is, each other
        line indented by ``level`` steps); remembered."""
        found = self._kept.get((id(value), level))
        if found is not None and found[0] is value:
            return found[1]
        return self._written(value, level)

    def _written(self, value: BaseModel, level: int) -> bytes:
        fields = tuple(value.__dict__.values())
        # The values' types too: equal values of other types (1 and True) read apart.
        key: tuple[Any, ...] = (type(value), level, fields, tuple(map(type, fields)))
        try:
            text = self._by_value.get(key)
        except TypeError:  # a field that is not hashable (a dict)
            key = ()
            text = None
        if text is not None:
            return text
        text = to_json(value, indent=2)
        if level:
            text = text.replace(b"\n", b"\n" + _INDENT * level)
        self._hold(len(text))
        if key:
            self._by_value[key] = text
        else:
            self._kept[(id(value), level)] = (value, text)
        return text

    def value(self, value: Any, level: int) -> bytes:
        """Any value of a plan's field at ``level``: a model (remembered), a tuple of
        models (each remembered, and the whole when all were), else serialised as it
        is."""
        if type(value) is tuple and value and isinstance(value[0], BaseModel):
            key = (level, *map(id, value))
            found = self._lists.get(key)
            if found is not None and all(map(operator.is_, found[0], value)):
                return found[1]
            return self._list(key, value, level)
        if isinstance(value, BaseModel):
            return self.model(value, level)
        if type(value) is tuple and not value:
            return b"[]"
        text = to_json(value, indent=2)
        if level and b"\n" in text:
            text = text.replace(b"\n", b"\n" + _INDENT * level)
        return text

    def _list(self, key: tuple[int, ...], value: tuple[Any, ...], level: int) -> bytes:
        kept = self._kept
        found = [kept.get((id(item), level + 1)) for item in value]
        known = [
            f[1] if f is not None and f[0] is item else None
            for f, item in zip(found, value, strict=True)
        ]
        missing = known.count(None)
        seen = self._seen
        if missing * 2 > len(known) and not any(id(item) in seen for item in value):
            # Mostly new to this writer (a node's own steps, named by its mdev UUIDs): in
            # one call. Each item's text is remembered when it is met again.
            self._hold(0)
            for item in value:
                seen[id(item)] = item
            text = to_json(value, indent=2)
            return text.replace(b"\n", b"\n" + _INDENT * level) if level else text
        texts: list[bytes] = []
        for item, done in zip(value, known, strict=True):
            if done is not None:
                texts.append(done)
            elif isinstance(item, BaseModel):
                texts.append(self._written(item, level + 1))
            else:
                texts.append(self.value(item, level + 1))
        inner = b"\n" + _INDENT * (level + 1)
        text = b"".join((b"[", inner, (b"," + inner).join(texts), b"\n", _INDENT * level, b"]"))
        if not missing:
            # Made of values met before: a list that other plans share, likely.
            self._hold(len(text))
            self._lists[key] = (value, text)
        return text

    def plan(self, value: BaseModel, level: int) -> bytes:
        """A model whose fields are written one by one (each remembered as
        :meth:`value` does): a plan, whose fields are the shared parts."""
        fields = _plain_fields(type(value))
        if fields is None:
            return self.model(value, level)
        inner = b"\n" + _INDENT * (level + 1)
        data = value.__dict__
        write = self.value
        parts = [b"{"]
        for name, key in fields:
            parts += (inner, key, b": ", write(data[name], level + 1), b",")
        parts[-1] = b"\n" + _INDENT * level + b"}"
        return b"".join(parts)

    def document(self, doc: Mapping[str, Any], last: str, level: int) -> bytes:
        """The dict ``doc`` (keys that are plain strings) whose ``last`` key comes last and
        holds a model (or ``None``), at ``level``: the other keys as ``to_json`` writes
        them, the model as :meth:`plan` does."""
        model = doc[last]
        head = to_json({**doc, last: None}, indent=2)
        if level:
            head = head.replace(b"\n", b"\n" + _INDENT * level)
        if model is None:
            return head
        prefix = b"\n" + _INDENT * (level + 1) + to_json(last) + b": "
        tail = prefix + b"null\n" + _INDENT * level + b"}"
        if not head.endswith(tail) or not isinstance(model, BaseModel):
            text = to_json(doc, indent=2)
            return text.replace(b"\n", b"\n" + _INDENT * level) if level else text
        return (
            head[: len(head) - len(tail)]
            + prefix
            + self.plan(model, level + 1)
            + b"\n"
            + _INDENT * level
            + b"}"
        )
