"""Reads of sysfs attributes that never raise: failures become problems.

All file system access goes through a :class:`Filesystem`; the real one uses
plain system calls (``open``/``read``, ``readlink``, ``listdir``), and the
simulator offers an in-memory one so read-only commands need no tree on disk.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Protocol

_DEAD = (errno.ENOTCONN, errno.ESHUTDOWN, errno.ESTALE)
"""errno values that mean the file system itself is gone, not one attribute."""

MAX_ATTRIBUTE_BYTES = 65536
"""sysfs attributes are at most a page; nothing longer is read."""


class Filesystem(Protocol):
    """The calls a scan makes; each raises ``OSError`` with the real errno on failure."""

    def read(self, path: str) -> bytes: ...

    def readlink(self, path: str) -> str: ...

    def listdir(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> bool:
        """True when ``path`` exists, following symlinks."""
        ...

    def lexists(self, path: str) -> bool:
        """True when ``path`` exists, a dangling symlink included."""
        ...


class OsFilesystem:
    """The real file system: one ``open``/``read``/``close`` per attribute."""

    def read(self, path: str) -> bytes:
        """At most :data:`MAX_ATTRIBUTE_BYTES` of a regular file; a FIFO or device is refused."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a sysfs attribute (not a regular file)", path)
            return os.read(fd, MAX_ATTRIBUTE_BYTES)
        finally:
            os.close(fd)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def lexists(self, path: str) -> bool:
        return os.path.lexists(path)


@dataclass
class Reader:
    """Reads attribute files under one sysfs root and counts what it read.

    Every method returns ``None`` for a missing entry; other failures (EIO, ENXIO,
    EACCES, a broken symlink) are also ``None`` and are appended to ``problems``
    when ``note`` is true.
    """

    fs: Filesystem = field(default_factory=OsFilesystem)
    files_read: int = 0
    problems: list[str] = field(default_factory=list)
    dead: str | None = None
    """Set on the first error that means the whole tree is gone (a dead FUSE mount)."""

    def _failed(self, verb: str, path: str, e: OSError, note: bool) -> None:
        reason = os.strerror(e.errno or 0)
        if e.errno in _DEAD and self.dead is None:
            self.dead = f"cannot {verb} {path}: {reason}"
        if note:
            self.problems.append(f"cannot {verb} {path}: {reason}")

    def text(self, path: str, *, note: bool = True) -> str | None:
        self.files_read += 1
        try:
            data = self.fs.read(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._failed("read", path, e, note)
            return None
        return data.decode("utf-8", "replace")

    def integer(self, path: str, *, note: bool = True) -> int | None:
        """An attribute holding one integer (decimal or ``0x`` hex), trailing space ignored."""
        raw = self.text(path, note=note)
        if raw is None:
            return None
        value = raw.strip()
        try:
            return int(value, 0)
        except ValueError:
            try:
                return int(value, 10)
            except ValueError:
                if note:
                    self.problems.append(f"{path}: not a number: {value[:40]!r}")
                return None

    def link_name(self, path: str, *, note: bool = True) -> str | None:
        """The basename of a symlink's target; ``None`` if absent or dangling."""
        try:
            target = self.fs.readlink(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._failed("read link", path, e, note)
            return None
        if not self.fs.exists(path):
            if note:
                self.problems.append(f"{path} is a broken symlink (-> {target})")
            return None
        return os.path.basename(target.rstrip("/"))

    def link_int(self, path: str, *, note: bool = True) -> int | None:
        name = self.link_name(path, note=note)
        if name is None:
            return None
        try:
            return int(name)
        except ValueError:
            if note:
                self.problems.append(f"{path}: link target {name!r} is not a number")
            return None

    def listdir(self, path: str, *, note: bool = True) -> list[str] | None:
        try:
            return self.fs.listdir(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._failed("list", path, e, note)
            return None

    def take_problems(self) -> tuple[str, ...]:
        found = tuple(self.problems)
        self.problems.clear()
        return found
