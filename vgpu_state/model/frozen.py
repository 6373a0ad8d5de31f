"""The one base of every frozen pydantic model of vgpu-state.

Domain values (``vgpu_state.model``), the config file's models, the simulator's
spec and the cluster resources all derive from :class:`Frozen`; a base that
needs more (aliases) adds only those settings to its own ``model_config``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable pydantic model that rejects unknown fields (``frozen``, ``extra="forbid"``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
