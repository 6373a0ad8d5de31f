"""MIG mode, GPU instances and mixed-size mode through ``nvidia-smi``.

sysfs shows neither MIG mode nor the driver's mixed-size (heterogeneous) mode,
so the host layer reads and changes them with NVIDIA's tool: ``nvidia-smi -q``
and ``nvidia-smi mig -lgi`` to read, ``-mig``, ``mig -cgi``/``-dci``/``-dgi``
and ``vgpu -shm`` to change. Every change is read back and checked.

The tool's output is not trusted to be small or well formed: at most
:data:`MAX_OUTPUT` bytes are read (the process is killed beyond), lines longer
than :data:`MAX_LINE` characters are ignored, and whatever does not parse
reads as "not reported".
"""

from __future__ import annotations

import errno
import os
import re
import select
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vgpu_state.host.driver import driver_error
from vgpu_state.model.errors import DriverError, InterfaceMissingError
from vgpu_state.model.gpumode import GpuInstance, GpuModes
from vgpu_state.wellknown import NVIDIA_SMI

MAX_OUTPUT = 1024 * 1024
"""Bytes of a command's output read at most; a longer output is cut and the process killed."""
MAX_LINE = 4096
"""Longer lines are ignored by the parsers."""
MAX_GPU_INSTANCES = 64
TIMEOUT = 120.0
"""Seconds one nvidia-smi call may take (a MIG mode change can take a while)."""

IN_USE = 19
NOT_SUPPORTED = 3

Runner = Callable[[Sequence[str]], tuple[int, str]]
"""``runner(args)`` runs ``nvidia-smi ARGS``: ``(exit status, output)``; raises ``OSError``
when the tool cannot be started and ``TimeoutError`` when it does not finish."""


def default_nvidia_smi() -> tuple[str, ...] | None:
    """NVIDIA's ``nvidia-smi`` if it is installed and executable."""
    return (NVIDIA_SMI,) if os.access(NVIDIA_SMI, os.X_OK) else None


def smi_bus(address: str) -> str:
    """A PCI address as nvidia-smi prints it: ``0000:3b:00.0`` -> ``00000000:3B:00.0``."""
    domain, _, rest = address.partition(":")
    return f"{int(domain, 16):08X}:{rest.upper()}"


def run_bounded(
    argv: Sequence[str], timeout: float = TIMEOUT, cap: int = MAX_OUTPUT
) -> tuple[int, str]:
    """Run ``argv`` (stdout and stderr together); at most ``cap`` bytes of output are
    kept (the process is killed when it writes more) and it is killed after ``timeout``
    seconds (``TimeoutError``)."""
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + timeout
    try:
        fd = proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{argv[0]} did not finish within {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk[: cap - size])
            size += len(chunk)
            if size >= cap:
                break  # enough: the rest is not read
        if size >= cap:
            proc.kill()
        status = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except (TimeoutError, subprocess.TimeoutExpired) as e:
        proc.kill()
        proc.wait()
        raise TimeoutError(f"{argv[0]} did not finish within {timeout:g} s") from e
    finally:
        proc.stdout.close()
    return status, b"".join(chunks).decode("utf-8", "replace")


def command_runner(command: Sequence[str], timeout: float = TIMEOUT) -> Runner:
    """A :data:`Runner` running ``[*command, *args]``."""
    prefix = tuple(command)

    def run(args: Sequence[str]) -> tuple[int, str]:
        return run_bounded([*prefix, *args], timeout)

    return run


def _lines(text: str) -> list[str]:
    return [line for line in text[:MAX_OUTPUT].splitlines() if len(line) <= MAX_LINE]


def _state(value: str) -> bool | None:
    word = value.strip().lower()
    if word == "enabled":
        return True
    if word == "disabled":
        return False
    return None


@dataclass(frozen=True)
class QueryModes:
    """What ``nvidia-smi -q`` says of a GPU's modes (``None``: not reported, or ``N/A``)."""

    mig: bool | None
    mig_pending: bool | None
    heterogeneous: bool | None


def parse_query(text: str) -> QueryModes:
    """MIG mode (current, pending) and ``vGPU Heterogeneous Mode`` of ``nvidia-smi -q``.

    The MIG lines are ``Current``/``Pending`` under a ``MIG Mode`` heading, indented
    deeper than it; the first such heading counts.
    """
    mig: bool | None = None
    pending: bool | None = None
    hetero: bool | None = None
    seen_mig = in_mig = False
    mig_indent = 0
    for line in _lines(text):
        indent = len(line) - len(line.lstrip())
        key, colon, value = line.strip().partition(":")
        key = key.strip().lower()
        if in_mig and (indent <= mig_indent or not line.strip()):
            in_mig = False
        if not colon and key == "mig mode" and not seen_mig:
            seen_mig = in_mig = True
            mig_indent = indent
            continue
        if in_mig and colon:
            if key == "current":
                mig = _state(value)
            elif key == "pending":
                pending = _state(value)
            continue
        if colon and key in ("vgpu heterogeneous mode", "vgpu heterogenous mode"):
            hetero = _state(value)
    return QueryModes(mig, pending, hetero)


_GI_ROW = re.compile(
    r"^\|\s*(\d{1,4})\s+MIG\s+(\S{1,32})\s+(\d{1,4})\s+(\d{1,4})\s+(\d{1,2}):(\d{1,2})\s*\|\s*$"
)


def parse_gpu_instances(text: str) -> tuple[GpuInstance, ...]:
    """The GPU instances of an ``nvidia-smi mig -lgi`` table (rows that do not parse,
    and rows beyond :data:`MAX_GPU_INSTANCES`, are skipped)."""
    found: dict[int, GpuInstance] = {}
    for line in _lines(text):
        m = _GI_ROW.match(line)
        if m is None:
            continue
        gi_id, start, size = int(m.group(4)), int(m.group(5)), int(m.group(6))
        if gi_id > 1023 or start > 63 or not 1 <= size <= 64 or gi_id in found:
            continue
        found[gi_id] = GpuInstance(
            id=gi_id, profile=m.group(2), placement_start=start, placement_size=size
        )
        if len(found) >= MAX_GPU_INSTANCES:
            break
    return tuple(sorted(found.values(), key=lambda gi: gi.id))


_CREATED = re.compile(r"Successfully created GPU instance ID\s+(\d{1,4})\b")


class NvidiaSmi:
    """Read and change one node's GPU modes through ``nvidia-smi``.

    ``runner``: how a command line is run (:func:`command_runner` of the configured
    argv prefix on a real host; the simulator's stand-in in-process). ``name``: the
    command as error messages show it.
    """

    def __init__(self, runner: Runner, name: str = "nvidia-smi") -> None:
        self.runner = runner
        self.name = name

    def _run(self, operation: str, args: Sequence[str]) -> tuple[int, str]:
        try:
            return self.runner(args)
        except FileNotFoundError as e:
            raise InterfaceMissingError(operation, self.name, " ".join(args), errno.ENOENT) from e
        except TimeoutError as e:
            raise DriverError(operation, self.name, " ".join(args), errno.ETIMEDOUT) from e
        except OSError as e:
            raise DriverError(operation, self.name, " ".join(args), e.errno or errno.EIO) from e

    def _change(self, operation: str, args: Sequence[str]) -> str:
        status, output = self._run(operation, args)
        if status != 0:
            raise self._failed(operation, args, status, output)
        return output

    def _failed(self, operation: str, args: Sequence[str], status: int, output: str) -> DriverError:
        lines = [line.strip() for line in _lines(output) if line.strip()]
        detail = (lines[-1][:300] if lines else "") or f"exit status {status}"
        code = {IN_USE: errno.EBUSY, NOT_SUPPORTED: errno.EOPNOTSUPP}.get(status, errno.EIO)
        return driver_error(operation, self.name, " ".join(args), code, detail)

    def _unverified(self, operation: str, args: Sequence[str], what: str) -> DriverError:
        return DriverError(operation, self.name, " ".join(args), errno.EIO, what)

    # reading -------------------------------------------------------------------
    def query(self, pf: str) -> QueryModes:
        args = ["-q", "-i", smi_bus(pf)]
        status, output = self._run("read-modes", args)
        if status != 0:
            raise self._failed("read-modes", args, status, output)
        return parse_query(output)

    def gpu_instances(self, pf: str) -> tuple[GpuInstance, ...]:
        args = ["mig", "-lgi", "-i", smi_bus(pf)]
        status, output = self._run("read-modes", args)
        return parse_gpu_instances(output) if status == 0 else ()

    def read_modes(self, pf: str) -> GpuModes:
        """The GPU's modes now; raises :class:`DriverError` when the tool fails."""
        q = self.query(pf)
        instances = self.gpu_instances(pf) if q.mig else ()
        pending = q.mig_pending if q.mig_pending is not None and q.mig_pending != q.mig else None
        return GpuModes(
            mig=q.mig, mig_pending=pending, heterogeneous=q.heterogeneous, gpu_instances=instances
        )

    # changing ------------------------------------------------------------------
    def set_mig_mode(self, pf: str, enabled: bool) -> None:
        args = ["-i", smi_bus(pf), "-mig", "1" if enabled else "0"]
        self._change("mig-mode", args)
        q = self.query(pf)
        if q.mig is not enabled:
            state = "pending a GPU reset" if q.mig_pending is enabled else "unchanged"
            raise self._unverified("mig-mode", args, f"MIG mode reads {q.mig} ({state})")

    def create_gpu_instance(self, pf: str, profile: str) -> int:
        args = ["mig", "-i", smi_bus(pf), "-cgi", profile, "-C"]
        output = self._change("gpu-instance-create", args)
        m = next((m for line in _lines(output) if (m := _CREATED.search(line))), None)
        if m is None:
            raise self._unverified("gpu-instance-create", args, "no GPU instance id in the output")
        gi_id = int(m.group(1))
        found = [gi for gi in self.gpu_instances(pf) if gi.id == gi_id]
        if not found or found[0].profile != profile.removeprefix("MIG ").strip():
            raise self._unverified(
                "gpu-instance-create", args, f"GPU instance {gi_id} ({profile}) is not listed"
            )
        return gi_id

    def destroy_gpu_instance(self, pf: str, gi_id: int) -> None:
        bus = smi_bus(pf)
        dci = ["mig", "-i", bus, "-gi", str(gi_id), "-dci"]
        status, output = self._run("gpu-instance-destroy", dci)
        if status == IN_USE:
            raise self._failed("gpu-instance-destroy", dci, status, output)
        # Any other failure: no compute instance to destroy; -dgi says the rest.
        args = ["mig", "-i", bus, "-gi", str(gi_id), "-dgi"]
        self._change("gpu-instance-destroy", args)
        if any(gi.id == gi_id for gi in self.gpu_instances(pf)):
            raise self._unverified(
                "gpu-instance-destroy", args, f"GPU instance {gi_id} is still listed"
            )

    def set_heterogeneous_mode(self, pf: str, enabled: bool) -> None:
        args = ["vgpu", "-i", smi_bus(pf), "-shm", "1" if enabled else "0"]
        self._change("heterogeneous-mode", args)
        q = self.query(pf)
        if q.heterogeneous is not enabled:
            raise self._unverified(
                "heterogeneous-mode", args, f"vGPU Heterogeneous Mode reads {q.heterogeneous}"
            )


class ModeOperations(ABC):
    """A host's four mode operations (HostPort's), each through the node's nvidia-smi:
    :meth:`_tool` gives it, or raises when the node has none."""

    @abstractmethod
    def _tool(self, operation: str, pf: str) -> NvidiaSmi: ...

    def set_mig_mode(self, pf: str, enabled: bool) -> None:
        self._tool("mig-mode", pf).set_mig_mode(pf, enabled)

    def create_gpu_instance(self, pf: str, profile: str) -> int:
        return self._tool("gpu-instance-create", pf).create_gpu_instance(pf, profile)

    def destroy_gpu_instance(self, pf: str, gi_id: int) -> None:
        self._tool("gpu-instance-destroy", pf).destroy_gpu_instance(pf, gi_id)

    def set_heterogeneous_mode(self, pf: str, enabled: bool) -> None:
        self._tool("heterogeneous-mode", pf).set_heterogeneous_mode(pf, enabled)


def modes_or_problem(tool: NvidiaSmi, pf: str) -> tuple[GpuModes | None, str | None]:
    """:meth:`NvidiaSmi.read_modes`, a failure as a problem line instead of an error."""
    try:
        return tool.read_modes(pf), None
    except DriverError as e:
        return None, f"{tool.name}: cannot read the modes of {pf}: {e.detail or e}"
