"""Watch the config directory (a mounted ConfigMap) and report every change.

Kubernetes updates a ConfigMap volume by writing a new timestamped directory
and renaming a ``..data`` symlink over the old one; the files the agent reads
(``config.yaml -> ..data/config.yaml``) never change in place. So the watcher
watches the directory itself, not a file, and treats any event in it as a
change: the reconcile re-reads the file and compares.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from vgpu_state.background import BackgroundLoop

log = logging.getLogger(__name__)


class ConfigDirWatcher(BackgroundLoop):
    """Call ``changed`` (from a daemon thread) after files under ``directory`` change.

    ``poll``: how often the watcher checks for :meth:`stop` (seconds).
    ``retry``: how long to wait before watching again when the directory is
    missing or the watch fails.
    """

    def __init__(
        self,
        directory: Path,
        changed: Callable[[], None],
        poll: float = 0.5,
        retry: float = 2.0,
    ) -> None:
        self.directory = directory
        self._changed = changed
        self._poll = poll
        self._retry = retry
        self._watching = threading.Event()
        super().__init__("vgpu-state-configwatch", first=0, after_error=retry)

    def step(self) -> float:
        """Watch until :meth:`stop` or until the watch fails (then again after ``retry``)."""
        from watchfiles import watch

        try:
            watcher = watch(
                self.directory,
                watch_filter=None,
                stop_event=self.stopping,
                rust_timeout=int(self._poll * 1000),
                yield_on_timeout=True,
                debounce=50,
                step=20,
                raise_interrupt=False,
            )
            for changes in watcher:
                self._watching.set()
                if changes:
                    log.debug("config directory %s changed: %s", self.directory, changes)
                    self._changed()
        except (OSError, RuntimeError) as exc:
            log.warning("cannot watch config directory %s: %s", self.directory, exc)
            self._watching.clear()
            return self._retry
        return 0.0
