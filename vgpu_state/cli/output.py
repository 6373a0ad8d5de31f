"""Terminal output: the plan text with colour on a TTY (rich), plain otherwise.

rich is imported only when a terminal will show the colours, so piped and
scripted runs (``-o json``, ``| tee``) do not pay for loading it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

STYLES = {"+": "green", "-": "red", "~": "yellow", "!": "bold magenta", "#": "bold"}


def no_color() -> bool:
    """``NO_COLOR`` (any value; ``vgpu-state --no-color`` sets it): no colour, no bold."""
    return bool(os.environ.get("NO_COLOR"))


def console(stderr: bool = False, **options: Any) -> Console:
    """A rich console on stdout (or stderr); with ``NO_COLOR`` it writes no escape codes."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    options.setdefault("highlight", False)
    if no_color():
        options["color_system"] = None
    options.setdefault("soft_wrap", True)
    return Console(file=stream, **options)


def print_plan_text(text: str, out: Console | None = None) -> None:
    if out is None and (not sys.stdout.isatty() or no_color()):
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    from rich.text import Text

    c = out or console()
    for line in text.rstrip("\n").split("\n"):
        stripped = line.lstrip()
        style = STYLES.get(stripped[:1], "")
        if line.startswith("Plan:") or line.startswith("No changes."):
            style = "bold"
        c.print(Text(line, style=style))
