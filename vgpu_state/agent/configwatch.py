"""Watch the config directory (a mounted ConfigMap) and report every change.

Kubernetes updates a ConfigMap volume by writing a new timestamped directory
and renaming a ``..data`` symlink over the old one; the files the agent reads
(``config.yaml -> ..data/config.yaml``) never change in place. So the watcher
watches the directory itself, not a file, and treats any event in it as a
change: the reconcile re-reads the file and compares.

On Linux the watch is the kernel's inotify on the directory (the standard
library's ``ctypes`` reaches ``inotify_init1`` and ``inotify_add_watch``): the
swap's rename of ``..data``, and an edit of a plain file in the directory, are
events. Where inotify is not to be had (another OS, or the node's inotify
instances or watches used up), the watcher compares what ``lstat`` says of every
entry of the directory, and where each symlink (``..data``) points, every
:data:`FALLBACK_POLL` seconds.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from vgpu_state.background import BackgroundLoop

log = logging.getLogger(__name__)

FALLBACK_POLL = 1.0
"""Seconds between two looks at the directory where inotify is not available."""
DEBOUNCE = 0.05
"""Seconds to gather the events of one swap (a handful of renames) into one change."""
DEBOUNCE_STEP = 0.02
"""Seconds without a further event after which the gathered events are one change."""

# <sys/inotify.h>
_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x01000000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_WATCHED = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_READ = 64 * 1024


class _Gone(Exception):
    """The watched directory was removed, moved or unmounted."""


class _Inotify:
    """One inotify descriptor watching one directory (not its subdirectories)."""

    def __init__(self, directory: Path) -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (ImportError, OSError, AttributeError) as exc:
            raise OSError(errno.ENOSYS, f"no inotify: {exc}", str(directory)) from exc
        add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        fd = int(init(_IN_NONBLOCK | _IN_CLOEXEC))
        if fd < 0:
            raise _oserror(ctypes.get_errno(), "inotify_init1", directory)
        self.fd = fd
        if add(fd, os.fsencode(directory), _WATCHED | _IN_ONLYDIR) < 0:
            code = ctypes.get_errno()
            os.close(fd)
            raise _oserror(code, "inotify_add_watch", directory)
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)

    def wait(self, timeout: float) -> bool:
        """True when events arrived within ``timeout`` seconds (and were read)."""
        if not self._poller.poll(max(0, int(timeout * 1000))):
            return False
        self._drain()
        return True

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.fd, _READ)
            except BlockingIOError:
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
                    raise _Gone
                # _IN_Q_OVERFLOW: events were lost; it is a change like any other.

    def close(self) -> None:
        os.close(self.fd)


def _oserror(code: int, call: str, directory: Path) -> OSError:
    return OSError(code, f"{call}: {os.strerror(code)}", str(directory))


_NO_INOTIFY = (errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.ENOSYS, errno.EPERM)
"""inotify_init1/inotify_add_watch failures after which the watcher polls instead."""

Listing = dict[str, tuple[int, int, int, str]]


def listing(directory: Path) -> Listing:
    """Every entry of ``directory``: inode, modification time (ns) and size from ``lstat``,
    and a symlink's target (``..data`` names the current version)."""
    seen: Listing = {}
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                target = os.readlink(entry.path) if entry.is_symlink() else ""
            except OSError:
                continue  # removed while listed: the next look sees it gone
            seen[entry.name] = (st.st_ino, st.st_mtime_ns, st.st_size, target)
    return seen


class ConfigDirWatcher(BackgroundLoop):
    """Call ``changed`` (from a daemon thread) after files in ``directory`` change.

    ``poll``: how often the watcher checks for :meth:`stop` (seconds).
    ``retry``: how long to wait before watching again when the directory is
    missing or the watch fails. ``inotify``: False to compare listings every
    :data:`FALLBACK_POLL` seconds, as where the kernel's watch is not available.
    """

    def __init__(
        self,
        directory: Path,
        changed: Callable[[], None],
        poll: float = 0.5,
        retry: float = 2.0,
        *,
        inotify: bool = sys.platform == "linux",
    ) -> None:
        self.directory = directory
        self._changed = changed
        self._poll = poll
        self._retry = retry
        self._inotify = inotify
        self._watching = threading.Event()
        super().__init__("vgpu-state-configwatch", first=0, after_error=retry)

    def armed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the watch to be in place (a change made
        after this returns True is seen); False when it is not (yet)."""
        return self._watching.wait(timeout)

    def step(self) -> float:
        """Watch until :meth:`stop` or until the watch fails (then again after ``retry``)."""
        try:
            if self._inotify:
                try:
                    watch = _Inotify(self.directory)
                except OSError as exc:
                    if exc.errno not in _NO_INOTIFY:
                        raise
                    log.warning(
                        "cannot watch config directory %s with inotify (%s); looking every %g s",
                        self.directory,
                        exc.strerror,
                        FALLBACK_POLL,
                    )
                    self._inotify = False
                else:
                    return self._follow(watch)
            return self._compare()
        except OSError as exc:
            log.warning("cannot watch config directory %s: %s", self.directory, exc)
            self._watching.clear()
            return self._retry

    def _follow(self, watch: _Inotify) -> float:
        try:
            self._watching.set()
            while not self.stopping.is_set():
                try:
                    if not watch.wait(self._poll):
                        continue
                    deadline = time.monotonic() + DEBOUNCE
                    while time.monotonic() < deadline and watch.wait(DEBOUNCE_STEP):
                        pass
                except _Gone:
                    log.warning("config directory %s is gone; watching again", self.directory)
                    self._watching.clear()
                    self._changed()
                    return self._retry
                log.debug("config directory %s changed", self.directory)
                self._changed()
        finally:
            watch.close()
        return 0.0

    def _compare(self) -> float:
        before = listing(self.directory)
        self._watching.set()
        while not self.stopping.wait(FALLBACK_POLL):
            try:
                now = listing(self.directory)
            except OSError:
                self._watching.clear()
                self._changed()
                raise
            if now != before:
                before = now
                log.debug("config directory %s changed", self.directory)
                self._changed()
        return 0.0
