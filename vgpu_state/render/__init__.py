"""Values in words for people: a plan as Terraform-style text or versioned JSON, a
doctor report as checks and a verdict. Pure functions; the commands print what they return.

Each name loads its module when first asked for (``vgpu_state.render.plan`` alone does not
load the doctor's checks)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vgpu_state.render.doctor import render_report, render_report_json
    from vgpu_state.render.plan import render_json, render_text

_MODULES = {
    "render_json": "vgpu_state.render.plan",
    "render_report": "vgpu_state.render.doctor",
    "render_report_json": "vgpu_state.render.doctor",
    "render_text": "vgpu_state.render.plan",
}

__all__ = ["render_json", "render_report", "render_report_json", "render_text"]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
