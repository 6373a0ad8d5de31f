"""Reading what a newer version wrote: drop the keys a model does not know, at every level.

The models are strict (unknown keys are errors) because a person writes
configs. A status another agent wrote is different: during a rolling upgrade a
newer agent adds fields, and an older reader must still read what it knows.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel


def known_fields(model: type[BaseModel], data: Any) -> Any:
    """``data`` with every key ``model`` (and its nested models) does not know left out."""
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        for key in (info.alias, name):
            if key is not None and key in data:
                out[key] = _strip(info.annotation, data[key])
                break
    return out


def _strip(annotation: Any, value: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return known_fields(annotation, value)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (Union, types.UnionType):
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1 and isinstance(value, dict):
            return known_fields(models[0], value)
        return value
    if origin in (tuple, list) and isinstance(value, list) and args:
        return [_strip(args[0], v) for v in value]
    return value
