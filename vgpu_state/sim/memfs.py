"""The simulated sysfs as a :class:`~vgpu_state.host.reader.Filesystem`, in memory.

``host.scan`` walks it with the same calls it makes on a real tree (read,
readlink, listdir, exists), with the same errno values, but nothing is written
to disk: read-only commands on a simulated node start in a fraction of the time.
"""

from __future__ import annotations

import errno
import posixpath

from vgpu_state.sim.sysfs import SimSysfs
from vgpu_state.sim.tree import Dir, Link


class MemoryFilesystem:
    """Paths are absolute under ``root`` (which exists only as a name)."""

    def __init__(self, sysfs: SimSysfs, root: str) -> None:
        self.sysfs = sysfs
        self.root = root.rstrip("/") or "/"

    def _rel(self, path: str) -> str:
        prefix = self.root + "/" if self.root != "/" else "/"
        if path.startswith(prefix) and "/." not in path and "//" not in path:
            return path[len(prefix) :].rstrip("/")
        rel = posixpath.relpath(path, self.root)
        if rel == "." or rel.startswith(".."):
            return "" if rel == "." else "\0"
        return rel

    def read(self, path: str) -> bytes:
        return self.sysfs.read(self._rel(path))

    def _lentry(self, rel: str) -> tuple[str, object] | None:
        """The entry at ``rel`` without following its last component."""
        tree = self.sysfs.tree
        parent = tree.resolve(posixpath.dirname(rel)) if posixpath.dirname(rel) else ""
        if parent is None:
            return None
        key = f"{parent}/{posixpath.basename(rel)}" if parent else posixpath.basename(rel)
        entry = tree.entries.get(key)
        return None if entry is None else (key, entry)

    def readlink(self, path: str) -> str:
        with self.sysfs.lock:
            found = self._lentry(self._rel(path))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if not isinstance(found[1], Link):
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return found[1].target

    def listdir(self, path: str) -> list[str]:
        with self.sysfs.lock:
            tree = self.sysfs.tree
            real = tree.resolve(self._rel(path))
            if real is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            if not isinstance(tree.entries.get(real), Dir):
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
            return list(tree.children.get(real, ()))

    def exists(self, path: str) -> bool:
        with self.sysfs.lock:
            return self.sysfs.tree.resolve(self._rel(path)) is not None

    def lexists(self, path: str) -> bool:
        with self.sysfs.lock:
            return self._lentry(self._rel(path)) is not None
