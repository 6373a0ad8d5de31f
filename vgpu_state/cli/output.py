"""Terminal output: the plan text with colour on a TTY (rich), plain otherwise."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.text import Text

STYLES = {"+": "green", "-": "red", "~": "yellow", "!": "bold magenta", "#": "bold"}


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, highlight=False, soft_wrap=True)


def print_plan_text(text: str, out: Console | None = None) -> None:
    c = out or console()
    for line in text.rstrip("\n").split("\n"):
        stripped = line.lstrip()
        style = STYLES.get(stripped[:1], "")
        if line.startswith("Plan:") or line.startswith("No changes."):
            style = "bold"
        c.print(Text(line, style=style))
