"""The directory-tree frontend: the simulated ``/sys`` as real files, dirs and symlinks."""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection, Mapping

from vgpu_state.sim.tree import Dir, Entry, File, Link, Tree


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _same_kind(a: Entry, b: Entry) -> bool:
    return type(a) is type(b)


def materialize(
    tree: Tree,
    root: str,
    previous: Mapping[str, Entry] | None = None,
    paths: Collection[str] | None = None,
) -> None:
    """Write ``tree`` under ``root``; with ``previous`` (the entries written there
    before), touch only what changed; with ``paths`` too, look only at those paths
    (the ones a render changed), so that the work follows the change, not the tree.

    Write-only attributes become empty files with mode 0200. Files whose reads
    fail on a real host (ENXIO) are written empty, like a file copy of sysfs.
    """
    old: Mapping[str, Entry] = previous if previous is not None else {}
    entries = tree.entries
    if previous is None:
        os.makedirs(root, exist_ok=True)
        candidates: Collection[str] = entries
    else:
        candidates = paths if paths is not None else entries.keys() | old.keys()
        gone = [
            p
            for p in candidates
            if p in old and (p not in entries or not _same_kind(old[p], entries[p]))
        ]
        for p in sorted(gone, key=len, reverse=True):
            _remove(os.path.join(root, p))
    for p in sorted(p for p in candidates if p in entries):
        e = entries[p]
        before = old.get(p)
        if before == e:
            continue
        full = os.path.join(root, p) if p else root
        if isinstance(e, Dir):
            if previous is None and p:
                os.mkdir(full)  # sorted order: the parent exists already
            else:
                os.makedirs(full, exist_ok=True)
        elif isinstance(e, Link):
            if os.path.lexists(full):
                os.unlink(full)
            os.symlink(e.target, full)
        elif isinstance(e, File):
            if previous is None:
                _create_file(full, e)
            else:
                _write_file(full, e, fresh=not isinstance(before, File))


def _create_file(full: str, e: File) -> None:
    """A file in a new tree: one open with its final mode, no existence checks."""
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if e.content:
            os.write(fd, e.content)
        os.fchmod(fd, e.mode)
    finally:
        os.close(fd)


def _write_file(full: str, e: File, fresh: bool) -> None:
    if e.content is None:
        if fresh or not os.path.exists(full):
            with open(full, "wb"):
                pass
    else:
        if os.path.exists(full):
            os.chmod(full, 0o644)
        with open(full, "wb") as f:
            f.write(e.content)
    os.chmod(full, e.mode)
