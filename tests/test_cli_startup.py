"""The ``vgpu-state`` command pauses the cyclic garbage collector while it loads a
command's modules, and runs it again for the command itself (the agent, the
controller and the device plugin run for days: their cyclic garbage must be freed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import atexit, gc, sys
states = []
atexit.register(lambda: print("collector", *states))
import vgpu_state.cli.validate as validate
schema = validate.schema.callback
def probe(*args, **kwargs):
    states.extend([gc.isenabled(), gc.get_freeze_count() > 0])
    return schema(*args, **kwargs)
validate.schema.callback = probe
sys.argv = ["vgpu-state", "schema"]
from vgpu_state.cli.main import main
main()
"""


def test_the_collector_runs_while_the_command_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "collector True True"
