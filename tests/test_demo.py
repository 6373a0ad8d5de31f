"""The README's first command: ``make demo`` runs ``scripts/demo.py`` (plan, apply and assert
on a simulated node, then the agent and the controller against the API server emulator).
Run here with the suite's interpreter, so a change that breaks the demo fails the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_demo_completes_and_the_controller_permits_the_new_type() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "100"},  # its own temporary dirs: socket paths stay short
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "Demo complete" in out
    permits = [line for line in out.splitlines() if "KubeVirt CR permits:" in line]
    assert permits and "nvidia.com/NVIDIA_A2-4Q" in permits[-1], out[-4000:]
