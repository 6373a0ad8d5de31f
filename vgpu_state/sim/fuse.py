"""The FUSE frontend: serve the simulated ``/sys`` so any process's writes reach the driver model.

Writes made with plain ``open()``/``write()`` get the simulated driver's
reaction and its errno; reads of attributes that fail on a real host (ENXIO)
fail the same way. Needs libfuse3 (Debian ``fuse3``) and ``mfusepy``.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpu_state.catalog import Catalog
from vgpu_state.sim.spec import NodeSpec, save_spec
from vgpu_state.sim.sysfs import SimSysfs
from vgpu_state.sim.tree import Dir, File, Link
from vgpu_state.sim.writelog import WriteLog

_ATTR_SIZE = 4096
"""sysfs reports every attribute as 4096 bytes long; readers read until EOF."""


def fuse_unavailable_reason() -> str | None:
    """Why a FUSE mount cannot work here, or ``None`` when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not found (install Debian fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        return f"mfusepy cannot be loaded: {e}"
    return None


def _operations_base() -> type:
    import mfusepy

    base = mfusepy.Operations
    assert isinstance(base, type)
    return base


def make_operations(sysfs: SimSysfs) -> Any:
    """An ``mfusepy.Operations`` serving ``sysfs``."""
    import mfusepy

    base = _operations_base()
    started = time.time()
    uid, gid = os.getuid(), os.getgid()

    def oserror(code: int) -> Exception:
        err = mfusepy.FuseOSError(code)
        assert isinstance(err, Exception)
        return err

    class SysfsOperations(base):  # type: ignore[misc,valid-type]
        use_ns = True
        served = False

        def init(self, path: str) -> None:
            self.served = True

        def _lookup(self, path: str) -> Any:
            e = sysfs.tree.entries.get(path.strip("/"))
            if e is None:
                raise oserror(errno.ENOENT)
            return e

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            with sysfs.lock:
                e = self._lookup(path)
            ns = int(started * 1e9)
            base_attrs = {
                "st_uid": uid,
                "st_gid": gid,
                "st_atime": ns,
                "st_mtime": ns,
                "st_ctime": ns,
            }
            if isinstance(e, Dir):
                return {**base_attrs, "st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_size": 0}
            if isinstance(e, Link):
                return {
                    **base_attrs,
                    "st_mode": stat.S_IFLNK | 0o777,
                    "st_nlink": 1,
                    "st_size": len(e.target),
                }
            assert isinstance(e, File)
            return {
                **base_attrs,
                "st_mode": stat.S_IFREG | e.mode,
                "st_nlink": 1,
                "st_size": _ATTR_SIZE,
            }

        def readdir(self, path: str, fh: int) -> list[str]:
            with sysfs.lock:
                e = self._lookup(path)
                if not isinstance(e, Dir):
                    raise oserror(errno.ENOTDIR)
                return [".", "..", *sysfs.tree.children.get(path.strip("/"), [])]

        def readlink(self, path: str) -> str:
            with sysfs.lock:
                e = self._lookup(path)
            if not isinstance(e, Link):
                raise oserror(errno.EINVAL)
            return e.target

        def open(self, path: str, flags: int) -> int:
            with sysfs.lock:
                e = self._lookup(path)
            if not isinstance(e, File):
                raise oserror(errno.EISDIR)
            mode = flags & os.O_ACCMODE
            if mode in (os.O_RDONLY, os.O_RDWR) and e.content is None:
                raise oserror(errno.EACCES)
            if mode in (os.O_WRONLY, os.O_RDWR) and e.write is None:
                raise oserror(errno.EACCES)
            handle = sysfs.open_vfio(path.strip("/"), mfusepy.fuse_get_context()[2])
            return handle or 0

        def release(self, path: str, fh: int) -> int:
            if fh:
                sysfs.close_vfio(fh)
            return 0

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            try:
                data = sysfs.read(path)
            except OSError as err:
                raise oserror(err.errno or errno.EIO) from err
            return data[offset : offset + size]

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            try:
                sysfs.write(path, bytes(data))
            except OSError as err:
                raise oserror(err.errno or errno.EIO) from err
            return len(data)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            return 0

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            raise oserror(errno.EACCES)

        def statfs(self, path: str) -> dict[str, int]:
            return {"f_bsize": 4096, "f_namemax": 255}

    return SysfsOperations()


ATTR_TIMEOUT = 1.0
"""Seconds the kernel may cache a name lookup or attributes. File contents are
never cached (``direct_io``), new names show at once (no negative caching) and
every read, write and readdir reaches the simulated driver; only a removed
entry may still pass a ``stat`` for up to this long, while opening it already
fails with ENOENT. With no caching, every path component of every open is a
round trip to this process, which made a scan of 8 GPUs × 32 VFs take seconds."""


def serve(
    spec: NodeSpec, mountpoint: str, catalog: Catalog, save_to: str | Path | None = None
) -> None:
    """Mount the simulated tree at ``mountpoint`` and serve it until unmounted.

    SIGINT/SIGTERM unmount cleanly (libfuse's handlers); with ``save_to`` the
    final state is written there as a spec (once, when the mount ends), and a
    write log beside it (already replayed into ``spec``) is removed.
    """
    import mfusepy

    sysfs = SimSysfs(spec, catalog)
    ops = make_operations(sysfs)
    try:
        mfusepy.FUSE(
            ops,
            mountpoint,
            foreground=True,
            nothreads=True,
            direct_io=True,
            attr_timeout=ATTR_TIMEOUT,
            entry_timeout=ATTR_TIMEOUT,
            negative_timeout=0,
            fsname="vgpu-state-sim",
        )
    except RuntimeError:
        # libfuse reports a non-zero status when a signal ended the loop; that
        # is a clean unmount once the file system has been served.
        if not ops.served:
            raise
    if save_to is not None:
        data = save_spec(sysfs.to_spec(), save_to)
        WriteLog(Path(save_to), data).saved(data)


@dataclass(frozen=True)
class Mount:
    root: Path
    """The mountpoint: a simulated ``/sys``."""
    spec_path: Path
    """The spec file the server loaded (and, with ``save``, writes back on unmount)."""

    def sriov_manage_command(self) -> tuple[str, ...]:
        """An argv prefix that behaves like ``/usr/lib/nvidia/sriov-manage`` on this mount."""
        return (sys.executable, "-m", "vgpu_state.sim", "sriov-manage", "--root", str(self.root))

    def nvidia_smi_command(self) -> tuple[str, ...]:
        """An argv prefix that behaves like ``nvidia-smi`` on this mount (when the spec
        says ``nvidia-smi: true``)."""
        return (sys.executable, "-m", "vgpu_state.sim", "nvidia-smi", "--root", str(self.root))


@contextmanager
def mounted(
    spec: NodeSpec | str | Path,
    mountpoint: str | Path,
    *,
    save: bool = False,
    timeout: float = 15.0,
) -> Iterator[Mount]:
    """Serve ``spec`` at ``mountpoint`` from a child process; unmount on exit.

    ``spec`` may be a path or a :class:`NodeSpec` (written to a temporary file).
    With ``save`` the state is written back to that file when the mount ends.
    """
    mnt = Path(mountpoint)
    mnt.mkdir(parents=True, exist_ok=True)
    tmpdir: str | None = None
    if isinstance(spec, NodeSpec):
        tmpdir = tempfile.mkdtemp(prefix="vgpu-sim-spec-")
        spec_path = Path(tmpdir) / "node.yaml"
        save_spec(spec, spec_path)
    else:
        spec_path = Path(spec)
    argv = [sys.executable, "-m", "vgpu_state.sim", "mount", "--spec", str(spec_path)]
    argv += [str(mnt), "--foreground"] + (["--save"] if save else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not (os.path.ismount(mnt) and os.path.isdir(mnt / "bus")):
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise RuntimeError(f"FUSE server exited with {proc.returncode}: {err or out}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mnt} was not mounted within {timeout} s")
            time.sleep(0.02)
        yield Mount(mnt, spec_path)
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, check=False)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, check=False)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
        if tmpdir is not None and not save:
            shutil.rmtree(tmpdir, ignore_errors=True)
