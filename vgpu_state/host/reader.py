"""Plain-file reads of sysfs attributes that never raise: failures become problems."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Reader:
    """Reads attribute files under one sysfs root and counts what it read.

    Every method returns ``None`` for a missing entry; other failures (EIO, ENXIO,
    EACCES, a broken symlink) are also ``None`` and are appended to ``problems``
    when ``note`` is true.
    """

    files_read: int = 0
    problems: list[str] = field(default_factory=list)

    def text(self, path: str, *, note: bool = True) -> str | None:
        self.files_read += 1
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as e:
            if note:
                self.problems.append(f"cannot open {path}: {os.strerror(e.errno or 0)}")
            return None
        try:
            data = os.read(fd, 65536)
        except OSError as e:
            if note:
                self.problems.append(f"cannot read {path}: {os.strerror(e.errno or 0)}")
            return None
        finally:
            os.close(fd)
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
            target = os.readlink(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            if note:
                self.problems.append(f"cannot read link {path}: {os.strerror(e.errno or 0)}")
            return None
        if not os.path.exists(path):
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
            return os.listdir(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            if note:
                self.problems.append(f"cannot list {path}: {os.strerror(e.errno or 0)}")
            return None

    def take_problems(self) -> tuple[str, ...]:
        found = tuple(self.problems)
        self.problems.clear()
        return found
