"""Every shell block in README.md and docs/*.md works as written.

A page's fenced ``sh`` (also ``bash``, ``shell``, ``console``) blocks run in order,
as a reader following the page would, in one temporary directory that holds a copy
of the repository's ``configs/``, ``deploy/`` and ``schemas/`` with the virtual
environment's ``vgpu-state`` first on ``PATH``. A block runs under ``bash -e -o
pipefail``: every command in it must succeed. A block of ``$ command`` lines is a
transcript: each command runs and its output must match the lines shown (``…``
stands for any text within a line).

An HTML comment on the line before a block says what the block needs:

    <!-- doc-test: fuse: why -->      needs FUSE (run when the suite has it)
    <!-- doc-test: cluster: why -->   needs a cluster: run against the suite's real
                                      kube-apiserver (KUBECONFIG and ~/.kube/config)
    <!-- doc-test: skip: why -->      cannot be run here at all; the test prints the list

The reason may go on over further lines. Lines starting with ``setup:`` run before
the block, hidden from the reader (what the reader's own cluster already has).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"sh", "bash", "shell", "console"}
KINDS = {"run", "fuse", "cluster", "skip"}
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
MARKER = re.compile(r"<!--\s*doc-test:(?P<body>.*?)-->", re.S)
BLOCK_TIMEOUT = 180.0


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    text: str
    kind: str = "run"
    reason: str = ""
    setup: list[str] = field(default_factory=list)
    marker_error: str = ""

    @property
    def where(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page
        return f"{page}:{self.line}"


def _parse_marker(block: Block, body: str) -> None:
    lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
    head, *rest = lines or [""]
    kind, _, reason = head.partition(":")
    block.kind, block.reason = kind.strip(), reason.strip()
    for line in rest:
        if line.startswith("setup:"):
            block.setup.append(line.removeprefix("setup:").strip())
        elif block.setup:
            block.setup[-1] += " " + line  # a setup command continued
        else:
            block.reason += " " + line  # the reason continued
    if block.kind not in KINDS:
        block.marker_error = f"unknown doc-test kind {block.kind!r} (one of {sorted(KINDS)})"
    elif block.kind != "run" and not block.reason:
        block.marker_error = f"doc-test: {block.kind} needs a reason after a colon"


def shell_blocks(page: Path) -> list[Block]:
    """The shell blocks of one page, each with the doc-test marker just above it."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group("lang"):
            if m:  # an unlabelled fence: skip to its end
                i += 1
                while i < len(lines) and not lines[i].strip().startswith("```"):
                    i += 1
            i += 1
            continue
        start, indent = i, len(m.group("indent"))
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1
        if m.group("lang") not in SHELL_LANGS:
            continue
        block = Block(page, start + 1, m.group("lang"), "\n".join(body) + "\n")
        before = "\n".join(lines[max(0, start - 12) : start]).rstrip()
        marker = list(MARKER.finditer(before))
        if marker and before.endswith("-->"):
            _parse_marker(block, marker[-1].group("body"))
        blocks.append(block)
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in shell_blocks(page)]
PAGES_WITH_BLOCKS = [page for page in PAGES if any(b.page == page for b in ALL_BLOCKS)]


def transcript(text: str) -> list[tuple[str, list[str]]] | None:
    """``$ command`` blocks: (command, expected output lines); None for a plain script."""
    lines = text.splitlines()
    if not any(line.startswith("$ ") for line in lines):
        return None
    steps: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        assert line.startswith("$ "), f"output before the first command: {line!r}"
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        i += 1
        output: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        steps.append((command, output))
    return steps


def output_matches(expected: list[str], actual: str) -> bool:
    got = [line.rstrip() for line in actual.rstrip("\n").splitlines()]
    want = [line.rstrip() for line in expected]
    while want and not want[-1]:
        want.pop()
    if len(got) != len(want):
        return False
    for w, g in zip(want, got, strict=True):
        pattern = "^" + ".*".join(re.escape(part) for part in w.split("…")) + "$"
        if not re.match(pattern, g):
            return False
    return True


class Shell:
    """Runs a page's blocks in one directory, with the environment a reader has."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        for name in ("configs", "deploy", "schemas"):
            shutil.copytree(REPO / name, workdir / name)
        home = workdir / ".home"
        home.mkdir()
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("VGPU_STATE_", "KUBECONFIG", "PYTEST", "COV_"))
        }
        venv_bin = str(Path(sys.executable).parent)
        self.env.update(
            PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            HOME=str(home),
            NO_COLOR="1",
            COLUMNS="100",
            VGPU_STATE_K8S_BIN=os.environ.get("VGPU_STATE_K8S_BIN", ""),
        )

    def use_cluster(self, kubeconfig: Path) -> None:
        kube = Path(self.env["HOME"]) / ".kube"
        kube.mkdir(exist_ok=True)
        shutil.copy(kubeconfig, kube / "config")
        self.env["KUBECONFIG"] = str(kube / "config")

    def run(self, script: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=self.workdir, env=self.env, text=True, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n(timed out after {BLOCK_TIMEOUT:.0f} s)"
        finally:
            # Whatever the block left running in the background (its own session).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_block(shell: Shell, block: Block) -> None:
    for command in block.setup:
        done = shell.run(command)
        assert done.returncode == 0, f"{block.where}: setup {command!r} failed:\n{done.stderr}"
    steps = transcript(block.text)
    if steps is None:
        done = shell.run(block.text)
        assert done.returncode == 0, (
            f"{block.where}: the block exited {done.returncode}\n--- block\n{block.text}"
            f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
        )
        return
    for command, expected in steps:
        done = shell.run(command)
        assert done.returncode == 0, (
            f"{block.where}: `{command}` exited {done.returncode}\n{done.stdout}{done.stderr}"
        )
        if any(line.strip() for line in expected):
            assert output_matches(expected, done.stdout), (
                f"{block.where}: `{command}` printed\n{done.stdout}\nbut the page shows\n"
                + "\n".join(expected)
            )


def fuse_unusable() -> str | None:
    from vgpu_state.sim.fuse import fuse_unavailable_reason

    return fuse_unavailable_reason()


@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shell_block_of_the_page_works_as_written(
    page: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    blocks = [b for b in ALL_BLOCKS if b.page == page]
    assert not [b for b in blocks if b.marker_error], [
        f"{b.where}: {b.marker_error}" for b in blocks if b.marker_error
    ]
    shell = Shell(tmp_path)
    not_run: list[str] = []
    ran = 0
    for block in blocks:
        if block.kind == "skip":
            continue
        if block.kind == "fuse" and (reason := fuse_unusable()) is not None:
            if os.environ.get("VGPU_STATE_REQUIRE_FUSE") == "1":
                pytest.fail(f"{block.where} needs FUSE (VGPU_STATE_REQUIRE_FUSE=1): {reason}")
            not_run.append(f"{block.where}: FUSE unusable: {reason}")
            continue
        if block.kind == "cluster" and "KUBECONFIG" not in shell.env:
            plane = request.getfixturevalue("cluster")
            shell.use_cluster(plane.workdir / "kubeconfig")  # type: ignore[attr-defined]
        run_block(shell, block)
        ran += 1
    for line in not_run:
        print(f"not run: {line}")
    if not_run and not ran:
        pytest.skip("; ".join(not_run))


def test_blocks_that_cannot_run_say_why() -> None:
    """The list of blocks no test runs, each with its reason (printed with ``-s``/``-rA``)."""
    skipped = [b for b in ALL_BLOCKS if b.kind == "skip"]
    print(f"\n{len(ALL_BLOCKS)} shell blocks in README.md and docs/; not run by any test:")
    for b in skipped:
        print(f"  {b.where}: {b.reason}")
    assert all(b.reason for b in skipped)
    assert len(skipped) < len(ALL_BLOCKS) / 2, "most blocks must be run"


def test_markers_are_read(tmp_path: Path) -> None:
    """The parser sees markers, setup lines, transcripts and wildcards as documented."""
    page = tmp_path / "page.md"
    page.write_text(
        "intro\n\n<!-- doc-test: cluster: needs a Node\n     setup: kubectl get ns -->\n"
        "```sh\n$ echo hi\nh…\n```\n\n```sh\necho plain\n```\n\n```yaml\na: 1\n```\n"
    )
    blocks = shell_blocks(page)
    assert [(b.kind, b.reason, b.setup) for b in blocks] == [
        ("cluster", "needs a Node", ["kubectl get ns"]),
        ("run", "", []),
    ]
    assert transcript(blocks[0].text) == [("echo hi", ["h…"])]
    assert transcript(blocks[1].text) is None
    assert output_matches(["h…"], "hi\n") and not output_matches(["h…"], "oh\n")
