"""Reading input files that other people write: regular files only, with a size cap.

Configs, saved plans, simulator specs and in-use lists are read through
:func:`read_input`; the in-use list's format is here too (:func:`parse_in_use_list`),
for the CLI's ``--in-use-file`` and the agent's alike. A FIFO, a device (``/dev/zero``)
or a directory is refused before anything is read, so no input can make vgpu-state
hang or fill memory.
"""

from __future__ import annotations

import json
import os
import stat

from vgpu_state.model import bounded
from vgpu_state.model.errors import Reason, UserError

MiB = 1024 * 1024


class InputFileError(UserError):
    """An input file cannot be used: missing, not a regular file, too large, unreadable."""

    default_reason = Reason.INPUT_INVALID


def read_input(path: str, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises :class:`InputFileError` naming the file and what is wrong with it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise InputFileError(f"{path}: cannot read the file: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = file_kind(st.st_mode)
            raise InputFileError(
                f"{path}: the {what} must be a regular file, not {kind}"
                + (" (use - to read standard input)" if kind == "a FIFO" else "")
            )
        if st.st_size > limit:
            raise InputFileError(
                f"{path}: the {what} is {st.st_size} bytes, more than the limit of {_size(limit)}"
            )
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise InputFileError(f"{path}: the {what} is more than the limit of {_size(limit)}")
        return b"".join(chunks)
    except OSError as e:
        raise InputFileError(f"{path}: cannot read the file: {e.strerror}") from None
    finally:
        os.close(fd)


MAX_IN_USE_BYTES = 4 * MiB
"""The largest in-use list read."""


def parse_in_use_list(text: str, name: str) -> dict[str, str]:
    """The holders an in-use list names: vGPU key (mdev UUID or VF address) -> holder.

    The list is a JSON object ``{"KEY": "HOLDER"}``, or lines ``KEY [HOLDER]`` (``#``
    starts a comment; a key alone is held by "an unnamed holder"). Raises
    :class:`InputFileError` naming ``name``, and the line and column of bad JSON.
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            loaded = bounded.loads(stripped, name)
        except json.JSONDecodeError as e:
            raise InputFileError(f"{name}:{e.lineno}:{e.colno}: {e.msg}") from None
        except bounded.InputShapeError as e:
            raise InputFileError(str(e)) from None
        if not isinstance(loaded, dict):
            raise InputFileError(f"{name}: expected a JSON object {{key: holder}}")
        return {str(k): str(v) for k, v in loaded.items()}
    held: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, holder = line.partition(" ")
            held[key] = holder.strip() or "an unnamed holder"
    return held


def read_in_use_list(path: str) -> dict[str, str]:
    """The in-use list in the file ``path`` (:func:`parse_in_use_list`), read as every
    input file is: a regular file, at most :data:`MAX_IN_USE_BYTES`, UTF-8."""
    data = read_input(path, MAX_IN_USE_BYTES, "in-use list")
    return parse_in_use_list(decode_utf8(data, path, "in-use list"), path)


def read_stream(stream: object, limit: int, what: str, name: str = "<stdin>") -> bytes:
    """At most ``limit`` bytes from a binary stream (standard input)."""
    read = getattr(stream, "read")  # noqa: B009
    data = read(limit + 1)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if len(data) > limit:
        raise InputFileError(f"{name}: the {what} is more than the limit of {_size(limit)}")
    assert isinstance(data, bytes)
    return data


def decode_utf8(data: bytes, path: str, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(
            f"{path}: the {what} is not UTF-8 text (invalid byte at offset {e.start})"
        ) from None


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n} bytes"


def file_kind(mode: int, otherwise: str = "a special file") -> str:
    """What a file that is not a regular one is, in words (``otherwise`` when none fits)."""
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return otherwise
