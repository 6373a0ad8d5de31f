"""The one error document of ``-o json`` (docs/cli.md, "Errors"), and the exit code of
every failure: 1.

With ``-o json`` a failing command prints, on stdout, exactly::

    {"error": {"reason": "ConfigInvalid", "kind": "user", "message": "...",
               "issues": [{"file": "...", "line": 3, "column": 7, "path": "...",
                           "message": "..."}]}}

``reason``: the stable CamelCase code (:class:`~vgpu_state.model.errors.Reason`, or
``UsageError`` for a command line click refused, ``Failed`` for a refusal of the
command itself, ``OSError``, ``Internal`` for a bug); ``kind``: ``user``, ``host``,
``transient``, ``usage`` or ``internal``; ``issues``: the positions in an input
file (empty when there are none). The text form goes to stderr either way.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import NoReturn

import click

from vgpu_state.model.errors import ConfigIssue as Issue

EXIT_ERROR = 1
"""Every error, usage errors too (click's own 2 is mapped to it)."""


def error_document(
    reason: str, kind: str, message: str, issues: Iterable[Issue] = ()
) -> dict[str, object]:
    """The error as ``-o json`` prints it."""
    return {
        "error": {
            "reason": reason,
            "kind": kind,
            "message": message,
            "issues": [
                {
                    "file": i.file,
                    "line": i.line,
                    "column": i.column,
                    "path": i.path,
                    "message": i.message,
                }
                for i in issues
            ],
        }
    }


def json_output() -> bool:
    """The running command was given ``-o json``."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.params.get("output") == "json":
            return True
        ctx = ctx.parent
    return False


def print_error_document(
    reason: str, kind: str, message: str, issues: Iterable[Issue] = ()
) -> None:
    click.echo(json.dumps(error_document(reason, kind, message, issues), indent=2))


def report(
    reason: str,
    kind: str,
    message: str,
    *,
    issues: Sequence[Issue] = (),
    text: Sequence[str] | None = None,
) -> NoReturn:
    """Print the error (``text`` lines on stderr, default ``error: message``; with
    ``-o json`` also the error document on stdout) and exit 1."""
    if json_output():
        print_error_document(reason, kind, message, issues)
    for line in text if text is not None else [f"error: {message}"]:
        click.echo(line, err=True)
    sys.exit(EXIT_ERROR)
