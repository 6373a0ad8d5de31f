"""The host lock: an exclusive ``flock`` so that two applies never interleave."""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from vgpu_state.executor.statefile import StateFileError, open_state_file
from vgpu_state.model.errors import Reason, TransientError

DEFAULT_LOCK = "/run/vgpu-state.lock"


class LockTimeoutError(TransientError):
    """Another process holds the host lock."""

    default_reason = Reason.LOCKED


class HostLock:
    """``with HostLock(path, timeout):`` — waits up to ``timeout`` seconds.

    ``command`` is recorded in the lock file for whoever waits on it.
    """

    def __init__(
        self,
        path: Path | str,
        timeout: float = 30.0,
        operation: str = "apply",
        command: str = "",
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.operation = operation
        self.command = command
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
            info = json.loads(raw.decode("utf-8", "replace") or "{}")
            if not isinstance(info, dict):
                raise ValueError("not an object")
        except (OSError, ValueError, StateFileError):
            return "an unknown process"
        return (
            f"pid {info.get('pid')} on {info.get('host')} ({info.get('operation')}, "
            f"since {info.get('since')}, command: {info.get('command')})"
        )

    def __enter__(self) -> HostLock:
        if not math.isfinite(self.timeout) or self.timeout < 0:
            raise StateFileError(
                f"the lock timeout must be a finite number of seconds >= 0, not {self.timeout}"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_state_file(self.path, os.O_RDWR | os.O_CREAT, "host lock")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
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
            "command": self.command,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self.fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
