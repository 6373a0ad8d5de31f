"""The kubelet's own device code in a test: ``hack/k8s/cmd/kubelet-harness``.

A Go program built from the Kubernetes release ``hack/k8s/go.mod`` pins. It runs
``k8s.io/kubernetes/pkg/kubelet/cm/devicemanager`` (mode ``devicemanager``) or
``pkg/kubelet/cm/dra`` with the plugin watcher of ``pkg/kubelet/pluginmanager``
(mode ``dra``) on the test's directories, and answers JSON requests on stdin
with JSON lines on stdout. :class:`Harness` is its Python end.

Without Go, the tests that need it skip (printing why); under
``VGPU_STATE_REQUIRE_K8S=1`` (CI) they fail instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack" / "k8s"
PROGRAM = "kubelet-harness"
BIN = Path(os.environ.get("VGPU_STATE_K8S_BIN") or HACK / "bin")
BINARY = BIN / PROGRAM


class Unavailable(Exception):
    """The harness cannot be built here; says why."""


def _go() -> str | None:
    found = os.environ.get("GO") or shutil.which("go")
    if found:
        return found
    for candidate in ("/usr/local/go/bin/go", str(Path.home() / "go" / "bin" / "go")):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _stale() -> bool:
    if not BINARY.exists():
        return True
    built = BINARY.stat().st_mtime
    sources = [HACK / "go.mod", HACK / "go.sum", *(HACK / "cmd" / PROGRAM).rglob("*.go")]
    return any(p.stat().st_mtime > built for p in sources if p.exists())


_built: list[Path] = []
_build_lock = threading.Lock()


def binary() -> Path:
    """The harness, built by hack/k8s/build.sh (once per run) when missing or stale."""
    with _build_lock:
        if _built:
            return _built[0]
        go = _go()
        if go is None:
            if BINARY.exists():
                _built.append(BINARY)
                return BINARY
            raise Unavailable(
                "Go is not installed: the kubelet harness is built from the Go module proxy "
                "(hack/k8s/cmd/kubelet-harness)"
            )
        script = HACK / "build.sh"
        if script.exists() or _stale():
            # build.sh rebuilds only what was built from other sources (a content stamp).
            if script.exists():
                cmd = ["sh", str(script), PROGRAM]
            else:
                BIN.mkdir(parents=True, exist_ok=True)
                cmd = [go, "build", "-trimpath", "-o", str(BINARY), f"./cmd/{PROGRAM}"]
            started = time.monotonic()
            proc = subprocess.run(
                cmd,
                cwd=HACK,
                env={**os.environ, "GO": go, "VGPU_STATE_K8S_BIN": str(BIN)},
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise Unavailable(f"building {PROGRAM} failed: {proc.stderr[-2000:]}")
            if "building" in proc.stderr or not script.exists():
                print(f"built {PROGRAM} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        _built.append(BINARY)
        return BINARY


def require_harness() -> Path:
    """The harness binary, or skip (fail under ``VGPU_STATE_REQUIRE_K8S=1``)."""
    try:
        return binary()
    except Unavailable as e:
        if os.environ.get("VGPU_STATE_REQUIRE_K8S") == "1":
            pytest.fail(f"the kubelet harness is required (VGPU_STATE_REQUIRE_K8S=1): {e}")
        print(f"skipping kubelet harness test: {e}")
        pytest.skip(f"no kubelet harness: {e}")


class Harness:
    """One running harness; :meth:`ask` sends a request and returns its answer."""

    def __init__(self, mode: str, *args: str, log: Path) -> None:
        self.log_path = log
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [str(binary()), mode, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        ready = self._read(60)
        if not ready.get("ready"):
            raise RuntimeError(f"{PROGRAM} did not start: {ready} (log: {self.log()})")

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not box or not box[0]:
            raise RuntimeError(f"{PROGRAM} gave no answer in {timeout} s; log:\n{self.log()}")
        return json.loads(box[0])  # type: ignore[no-any-return]

    def ask(self, op: str, timeout: float = 60, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def wait_for(
        self, what: str, op: str, until: Callable[[dict[str, Any]], bool], timeout: float = 30,
        **fields: Any,
    ) -> dict[str, Any]:  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            answer = self.ask(op, **fields)
            if until(answer):
                return answer
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: still {answer} after {timeout} s")
            time.sleep(0.1)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@contextmanager
def running(mode: str, *args: str, log: Path) -> Iterator[Harness]:
    harness = Harness(mode, *args, log=log)
    try:
        yield harness
    finally:
        harness.close()
