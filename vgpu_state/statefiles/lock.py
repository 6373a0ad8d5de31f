"""The host lock: an exclusive ``flock`` so that two applies never interleave.

The holder writes who it is into the file (pid, host, operation, command, and
when it took the lock); whoever waits reads it to say who holds the lock and
for how long.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vgpu_state.model.errors import Reason, TransientError
from vgpu_state.statefiles.safeopen import StateFileError, open_state_file

UNKNOWN_HOLDER = "another process (the lock file does not say which)"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe_holder(raw: bytes, now: float | None = None) -> str:
    """Who holds the lock, from the lock file's content, in plain words.

    An empty file (a holder that has not written yet, or another tool's
    ``flock``) or one vgpu-state did not write gives :data:`UNKNOWN_HOLDER`.
    """
    try:
        info: Any = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return UNKNOWN_HOLDER
    if not isinstance(info, dict):
        return UNKNOWN_HOLDER
    pid = info.get("pid")
    if type(pid) is not int:
        return UNKNOWN_HOLDER
    text = f"pid {pid}"
    if isinstance(info.get("host"), str) and info["host"]:
        text += f" on {info['host']}"
    doing = [v for k in ("operation", "command") if isinstance(v := info.get(k), str) and v]
    if doing:
        text += f" ({': '.join(doing)})"
    started = info.get("started")
    if isinstance(started, int | float) and math.isfinite(started):
        text += f", held for {_duration((time.time() if now is None else now) - started)}"
    elif isinstance(info.get("since"), str):
        text += f", since {info['since']}"
    return text


class LockTimeoutError(TransientError):
    """Another process holds the host lock."""

    default_reason = Reason.LOCKED


class HostLock:
    """``with HostLock(path, timeout):`` — waits up to ``timeout`` seconds.

    ``command`` is recorded in the lock file for whoever waits on it;
    ``on_wait`` is told once, when the lock is busy, who holds it and for how long.
    """

    def __init__(
        self,
        path: Path | str,
        timeout: float = 30.0,
        operation: str = "apply",
        command: str = "",
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.operation = operation
        self.command = command
        self.on_wait = on_wait
        self.fd: int | None = None

    def holder(self, fd: int | None = None) -> str:
        try:
            if fd is None:
                fd = open_state_file(self.path, os.O_RDONLY, "host lock")
                try:
                    raw = os.pread(fd, 65536, 0)
                finally:
                    os.close(fd)
            else:
                raw = os.pread(fd, 65536, 0)
        except (OSError, StateFileError):
            return UNKNOWN_HOLDER
        return describe_holder(raw)

    def __enter__(self) -> HostLock:
        if not math.isfinite(self.timeout) or self.timeout < 0:
            raise StateFileError(
                f"the lock timeout must be a finite number of seconds >= 0, not {self.timeout}"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_state_file(self.path, os.O_RDWR | os.O_CREAT, "host lock")
        deadline = time.monotonic() + self.timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                if not told and self.on_wait is not None and self.timeout > 0:
                    told = True
                    self.on_wait(
                        f"the host lock {self.path} is held by {self.holder(fd)}; "
                        f"waiting up to {self.timeout:g} s"
                    )
                if time.monotonic() >= deadline:
                    try:
                        held_by = self.holder(fd)
                    finally:
                        os.close(fd)
                    raise LockTimeoutError(
                        f"host lock {self.path} is held by {held_by}; waited "
                        f"{self.timeout:g} s; wait for it to finish or allow a longer wait",
                        delay=1.0,
                    ) from None
                time.sleep(0.05)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "operation": self.operation,
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "started": time.time(),
            "command": self.command,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *_exc_info: object) -> None:
        """Release the lock, emptying the file first (no one holds it now)."""
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
