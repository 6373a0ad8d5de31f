"""Pure planner: desired layout + node snapshot + in-use list -> ordered, frozen Plan."""

from vgpu_state.planner.compare import differences
from vgpu_state.planner.expected import expected_snapshot
from vgpu_state.planner.identity import derived_uuid
from vgpu_state.planner.plan import plan

__all__ = ["derived_uuid", "differences", "expected_snapshot", "plan"]
