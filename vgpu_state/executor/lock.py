"""The host lock: an exclusive ``flock`` so that two applies never interleave."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from vgpu_state.model.errors import TransientError

DEFAULT_LOCK = "/run/vgpu-state.lock"


def lock_path(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("VGPU_STATE_LOCK_FILE") or DEFAULT_LOCK)


class LockTimeoutError(TransientError):
    """Another process holds the host lock."""


class HostLock:
    """``with HostLock(path, timeout):`` — waits up to ``timeout`` seconds."""

    def __init__(self, path: Path | str, timeout: float = 30.0, operation: str = "apply") -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.operation = operation
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
                        f"{self.timeout:g} s (raise --lock-timeout or wait for it to finish)"
                    ) from None
                time.sleep(0.05)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "operation": self.operation,
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(sys.argv),
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
