"""Pure planner: desired layout + node snapshot + in-use list -> ordered, frozen Plan."""
