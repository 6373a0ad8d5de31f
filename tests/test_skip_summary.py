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


def test_without_go_the_real_cluster_tests_are_skipped_or_fail_when_required(
    tmp_path: Path,
) -> None:
    """No Go and no built binaries: a skip with the reason and a hint; with
    VGPU_STATE_REQUIRE_K8S=1 (CI) the same tests fail instead."""
    import os

    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_k8s.py").write_text(
        "def test_needs_a_cluster(cluster):\n    pass\n\ndef test_also(cluster):\n    pass\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE.parent),
        "GO": str(tmp_path / "no-go"),  # not executable: as if Go were not installed
        "VGPU_STATE_K8S_BIN": str(tmp_path / "bin"),  # nothing built there
    }
    env.pop("VGPU_STATE_REQUIRE_K8S", None)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    tail = done.stdout[done.stdout.index("skipped tests") :]
    assert "2 test(s) skipped:\n" in tail
    assert "2 × no real control plane: Go is not installed" in tail
    assert "VGPU_STATE_REQUIRE_K8S=1 makes them fail instead" in tail
    assert done.returncode == 0
    env["VGPU_STATE_REQUIRE_K8S"] = "1"
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "a real control plane is required (VGPU_STATE_REQUIRE_K8S=1)" in done.stdout
