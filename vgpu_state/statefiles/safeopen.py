"""Opening vgpu-state's own state files (host lock, journal) safely.

A state path that is a symlink, a FIFO, a device or a directory is refused
with a clear error before it is opened for writing: vgpu-state runs as root,
and a symlinked lock or journal would otherwise truncate or append to its
target. Files are opened with ``O_NOFOLLOW`` so a link swapped in between the
check and the open is refused too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from vgpu_state.inputfiles import file_kind
from vgpu_state.model.errors import Reason, UserError


class StateFileError(UserError):
    """A state file (lock, journal) cannot be used safely; nothing was written."""

    default_reason = Reason.INPUT_INVALID


def _kind(mode: int) -> str:
    return file_kind(mode, otherwise="not a regular file")


def open_state_file(path: Path, flags: int, what: str, mode: int = 0o644) -> int:
    """A file descriptor of the regular file ``path`` (created when ``flags`` say so)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StateFileError(f"{path}: cannot use the {what}: {e.strerror}") from None
    else:
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError(
                f"{path}: the {what} is {_kind(st.st_mode)}; refusing to use it "
                "(remove it or name another path)"
            )
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StateFileError(f"{path}: the {what} is a symlink; refusing to use it") from None
        raise StateFileError(f"{path}: cannot open the {what}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StateFileError(f"{path}: the {what} is {_kind(st.st_mode)}; refusing to use it")
    return fd


def replace_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` (fsynced, mode 0644) and rename
    it over ``path``: a reader sees the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
        os.fchmod(fd, 0o644)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
