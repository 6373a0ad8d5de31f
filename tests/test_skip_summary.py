"""The end of a test run says how many tests were skipped and why (the FUSE tests above all)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_the_run_ends_with_the_number_of_skipped_tests_and_their_reasons(tmp_path: Path) -> None:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_some.py").write_text(
        "import pytest\n\n"
        "def test_runs():\n    pass\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_needs_fuse(n):\n    pytest.skip('FUSE unusable: /dev/fuse missing')\n\n"
        "def test_other():\n    pytest.skip('no reference table')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    tail = done.stdout[done.stdout.index("skipped tests") :]
    assert "3 test(s) skipped:\n" in tail
    assert "  2 × FUSE unusable: /dev/fuse missing\n" in tail
    assert "  1 × no reference table\n" in tail
    assert "installs fuse3 when run as root" in tail
    assert done.returncode == 0


def test_ensure_fuse_never_fails_the_build() -> None:
    done = subprocess.run(
        ["sh", str(HERE.parent / "scripts" / "ensure-fuse")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0
    if shutil.which("fusermount3"):
        assert done.stdout == ""
