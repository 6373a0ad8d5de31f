"""What ``vgpu-state`` does to start quickly, and that it changes nothing else.

The command pauses the cyclic garbage collector while it loads a command's
modules, and runs it again for the command itself (the agent, the controller
and the device plugin run for days: their cyclic garbage must be freed).
``fleet plan`` loads no code that opens a node or checks a host, and the
packages that load their modules by name still export every name."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_fleet_command_loads_no_code_that_opens_a_node() -> None:
    probe = "import sys, json, vgpu_state.cli.fleet; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(json.loads(done.stdout))
    assert "vgpu_state.reconcile.fleet" in loaded  # the probe measures something
    unused = {
        "vgpu_state.compose",
        "vgpu_state.host",
        "vgpu_state.doctor",
        "vgpu_state.render.doctor",
        "vgpu_state.statefiles.drivertypes",
        "vgpu_state.model.drivertypes",
    }
    assert not unused & loaded


@pytest.mark.parametrize("package", ["vgpu_state.render", "vgpu_state.statefiles"])
def test_a_package_that_loads_its_modules_by_name_exports_every_name(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018
