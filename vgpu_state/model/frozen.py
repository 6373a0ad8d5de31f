"""The one base of every frozen domain value."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable pydantic model that rejects unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
