"""Terminal output: the plan text with colour on a TTY (rich), plain otherwise.

rich is imported only when a terminal will show the colours, so piped and
scripted runs (``-o json``, ``| tee``) do not pay for loading it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

STYLES = {"+": "green", "-": "red", "~": "yellow", "!": "bold magenta", "#": "bold"}


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, highlight=False, soft_wrap=True)


def print_plan_text(text: str, out: Console | None = None) -> None:
    if out is None and not sys.stdout.isatty():
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
