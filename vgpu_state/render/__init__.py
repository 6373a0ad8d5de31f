"""Values in words for people: a plan as Terraform-style text or versioned JSON, a
doctor report as checks and a verdict. Pure functions; the commands print what they return."""

from vgpu_state.render.doctor import render_report, render_report_json
from vgpu_state.render.plan import render_json, render_text

__all__ = ["render_json", "render_report", "render_report_json", "render_text"]
