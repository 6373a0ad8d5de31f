"""The periodic resync: inotify does not see sysfs, so the host is re-read on a timer."""

from __future__ import annotations

import threading
from collections.abc import Callable

DEFAULT_RESYNC_SECONDS = 60.0


class Resync:
    """Call ``fire`` every ``interval`` seconds in a daemon thread until :meth:`stop`."""

    def __init__(self, fire: Callable[[], None], interval: float = DEFAULT_RESYNC_SECONDS) -> None:
        if interval <= 0:
            raise ValueError(f"resync interval must be positive, got {interval}")
        self._fire = fire
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vgpu-state-resync", daemon=True)

    def start(self) -> Resync:
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._fire()
