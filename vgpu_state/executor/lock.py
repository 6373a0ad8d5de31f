"""The host lock: an exclusive ``flock`` so that two applies never interleave."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType

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

    def holder(self) -> str:
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return "an unknown process"
        return (
            f"pid {info.get('pid')} on {info.get('host')} ({info.get('operation')}, "
            f"since {info.get('since')}, command: {info.get('command')})"
        )

    def __enter__(self) -> HostLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
                    os.close(fd)
                    raise LockTimeoutError(
                        f"host lock {self.path} is held by {self.holder()}; waited "
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
