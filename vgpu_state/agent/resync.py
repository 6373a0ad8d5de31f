"""The periodic resync: inotify does not see sysfs, so the host is re-read on a timer."""

from __future__ import annotations

from collections.abc import Callable

from vgpu_state.background import BackgroundLoop, positive

DEFAULT_RESYNC_SECONDS = 60.0


class Resync(BackgroundLoop):
    """Call ``fire`` every ``interval`` seconds in a daemon thread until :meth:`stop`."""

    def __init__(self, fire: Callable[[], None], interval: float = DEFAULT_RESYNC_SECONDS) -> None:
        self._interval = positive("resync interval", interval)
        self._fire = fire
        super().__init__("vgpu-state-resync", first=interval)

    def step(self) -> float:
        self._fire()
        return self._interval
