"""Injected faults: the errno values and delays a spec asks for, counted per operation."""

from __future__ import annotations

from dataclasses import dataclass

from vgpu_state.sim.spec import (
    FaultSpec,
)


@dataclass
class FaultState:
    spec: FaultSpec
    seen: int = 0
    fired: bool = False


@dataclass(frozen=True)
class FaultEffect:
    delay_seconds: float = 0.0
    errno: int | None = None
