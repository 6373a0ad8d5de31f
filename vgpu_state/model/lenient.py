"""Reading what a newer version wrote: drop the keys a model does not know, at every level.

The models are strict (unknown keys are errors) because a person writes
configs. A status another agent wrote is different: during a rolling upgrade a
newer agent adds fields, and an older reader must still read what it knows.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel


def known_fields(model: type[BaseModel], data: Any) -> Any:
    """``data`` with every key ``model`` (and its nested models) does not know left out."""
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for keys, strip in _fields(model):
        for key in keys:
            if key in data:
                out[key] = strip(data[key])
                break
    return out


_Strip = Callable[[Any], Any]


def _keep(value: Any) -> Any:
    return value


@functools.cache
def _fields(model: type[BaseModel]) -> tuple[tuple[tuple[str, ...], _Strip], ...]:
    """Each field of ``model``: the keys it is read from (alias first), and how its value
    is stripped (worked out once per model: a fleet's reports are read many times)."""
    return tuple(
        (tuple(k for k in (info.alias, name) if k is not None), _stripper(info.annotation))
        for name, info in model.model_fields.items()
    )


def _stripper(annotation: Any) -> _Strip:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return functools.partial(known_fields, annotation)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (Union, types.UnionType):
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1:
            return functools.partial(_model_if_dict, models[0])
        return _keep
    if origin in (tuple, list) and args:
        return functools.partial(_each, _stripper(args[0]))
    return _keep


def _model_if_dict(model: type[BaseModel], value: Any) -> Any:
    return known_fields(model, value) if isinstance(value, dict) else value


def _each(strip: _Strip, value: Any) -> Any:
    if not isinstance(value, list):
        return value
    if strip is _keep:
        return list(value)
    return [strip(v) for v in value]
