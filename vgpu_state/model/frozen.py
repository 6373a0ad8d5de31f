"""The one base of every frozen pydantic model of vgpu-state.

Domain values (``vgpu_state.model``), the config file's models, the simulator's
spec and the cluster resources all derive from :class:`Frozen`; a base that
needs more (aliases) adds only those settings to its own ``model_config``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable pydantic model that rejects unknown fields (``frozen``, ``extra="forbid"``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Tolerant(BaseModel):
    """A model of an envelope read from the API server (a list page, an item's metadata):
    keys it does not know are dropped, not errors. Only for the wrapping; what is
    believed of a node's report is validated by the :class:`Frozen` models inside."""

    model_config = ConfigDict(extra="ignore")


M = TypeVar("M", bound=Frozen)

_set = object.__setattr__
_UNSET = object()


@functools.cache
def _shape(
    cls: type[Frozen],
) -> tuple[dict[str, Any], tuple[str, ...], tuple[tuple[str, Callable[[], Any]], ...]]:
    """``cls``'s fields in order, each with its default (a marker when it has none), its
    required fields, and its fields with a default factory."""
    template: dict[str, Any] = {}
    required: list[str] = []
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, info in cls.model_fields.items():
        template[name] = _UNSET
        if info.default_factory is not None:
            factories.append((name, cast("Callable[[], Any]", info.default_factory)))
        elif info.is_required():
            required.append(name)
        else:
            template[name] = info.default
    return template, tuple(required), tuple(factories)


def built(cls: type[M], /, **values: Any) -> M:
    """An instance of ``cls`` made of ``values`` that are already of their fields' types
    (taken from validated models, or made by the code that calls this), without
    validating them again: what ``model_construct`` does, in a fraction of its time, for
    the values a fleet's plans are made of (hundreds of thousands). Fields not given
    take their defaults; a required field not given, or an unknown one, raises
    ``TypeError``.
    """
    template, required, factories = _shape(cls)
    # The template's keys first, in the fields' order, each replaced by its value if given.
    data = {**template, **values}
    if len(data) != len(template):
        unknown = sorted(set(values) - template.keys())
        raise TypeError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
    for name in required:
        if name not in values:
            raise TypeError(f"{cls.__name__}: field {name!r} is required")
    for name, factory in factories:
        if name not in values:
            data[name] = factory()
    model = cls.__new__(cls)
    _set(model, "__dict__", data)
    _set(model, "__pydantic_fields_set__", set(values))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model
