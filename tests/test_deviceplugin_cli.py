"""``vgpu-state deviceplugin``: the plugin alone in the foreground, against a fake kubelet."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet

REPO = Path(__file__).resolve().parent.parent
T4_4Q = "nvidia.com/GRID_T4-4Q"
LAYOUT = """\
version: v1
vgpu-configs:
  t4:
    - devices: all
      vgpu-devices: {T4-4Q: 4}
"""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "vgpu_state.cli.main", *args]


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dpc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_follows_applies_to_the_simulated_node_and_empties_on_sigterm(
    tmp_path: Path, plugin_dir: Path
) -> None:
    spec = tmp_path / "t4.yaml"
    shutil.copy(REPO / "configs" / "sim" / "t4-pair.yaml", spec)
    layout = tmp_path / "layout.yaml"
    layout.write_text(LAYOUT)
    with DevicePluginKubelet(str(plugin_dir)) as kubelet:
        proc = subprocess.Popen(
            cli("deviceplugin", "--sim", str(spec), "--device-plugin-dir", str(plugin_dir)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            kubelet.wait_for(T4_4Q, lambda d: len(d) == 2, timeout=15)
            applied = subprocess.run(
                cli("apply", "-f", str(layout), "-c", "t4", "--sim", str(spec), "--auto-approve"),
                capture_output=True,
                text=True,
            )
            assert applied.returncode == 0, applied.stdout + applied.stderr
            seen = kubelet.wait_for(T4_4Q, lambda d: len(d) == 8, timeout=10)
            assert {d.numa_nodes for d in seen} == {(0,), (1,)}
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err
        assert kubelet.wait_for(T4_4Q, lambda d: d == ()) == ()
        assert "registered with the kubelet" in err and "sent an empty list" in err
        assert "Traceback" not in err


def test_takes_one_host_and_says_when_its_sysfs_is_missing(tmp_path: Path) -> None:
    """--sysfs-root defaults to /sys, as in every command; --sim is the other host."""
    spec = tmp_path / "node.yaml"
    spec.write_text("node: n\ngpus: []\n")
    both = cli("deviceplugin", "--sim", str(spec), "--sysfs-root", str(tmp_path))
    r = subprocess.run(both, capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == "error: give either --sim SPEC or --sysfs-root DIR, not both"
    missing = tmp_path / "no-sys"
    r = subprocess.run(cli("deviceplugin", "--sysfs-root", str(missing)), capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: --sysfs-root {missing}: no such directory"


def test_help_lists_the_command_without_loading_grpc() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from vgpu_state.cli.main import cli\n"
        "r = CliRunner().invoke(cli, ['--help'])\n"
        "assert 'deviceplugin' in r.output, r.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
