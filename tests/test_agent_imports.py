"""The agent loads only the parts its node's flags ask for.

Each case starts a fresh interpreter that does what ``vgpu-state agent`` does before
its first reconcile (the command's module, then :func:`vgpu_state.agent.assemble.build`
with the flags) and lists the modules it then holds. ``build`` sends no request, so the
kubeconfig names a server nobody serves; the host is an empty sysfs tree (a node
without GPUs), read as the DaemonSet's agent reads ``/sys``.

The memory this saves is measured by bench/agent.py (the shipped configuration's RSS).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

BUILD = """
import json, sys
from pathlib import Path
import vgpu_state.cli.main
import vgpu_state.cli.agent
from vgpu_state.agent.assemble import AgentFlags, build
flags = json.loads(sys.argv[1])
for key in ("config_file", "state_dir"):
    flags[key] = Path(flags[key])
build(AgentFlags(**flags))
print(json.dumps(sorted(sys.modules)))
"""

# Never needed by the DaemonSet's agent (deploy/daemonset.yaml: plan-only or enforce,
# device plugin on, DRA off): other commands' parts, the simulator, what only a write
# of a JSON Patch (the controller's) uses, the official Kubernetes client and its HTTP
# library (the agent's requests go through kube/transport.py, its kubeconfig or
# service account read by kube/credentials.py), and Prometheus's client library (the
# agent writes its /metrics page with agent/promtext.py, and serves it without
# http.server).
NEVER = (
    "vgpu_state.dra",
    "vgpu_state.agent.dra",
    "vgpu_state.sim",
    "vgpu_state.controller",
    "vgpu_state.render",
    "vgpu_state.kube.fleet",
    "rich",
    "jsonpatch",
    "multiprocessing.pool",
    "kubernetes",
    "urllib3",
    "prometheus_client",
    "http.server",
)


def _modules(tmp_path: Path, **flags: object) -> set[str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    (tmp_path / "sys").mkdir()
    (tmp_path / "config").mkdir()
    settings = {
        "node": "gpu-node-1",
        "config_file": str(tmp_path / "config" / "config.yaml"),
        "mode": "plan-only",
        "kubeconfig": str(kubeconfig),
        "sysfs_root": str(tmp_path / "sys"),
        "state_dir": str(tmp_path / "state"),
        "pod_resources": str(tmp_path / "pod-resources.sock"),
        **flags,
    }
    # A unix socket's path is short: the device plugins' directory is a short one.
    with tempfile.TemporaryDirectory(prefix="dp-") as plugins:
        settings["device_plugin_dir"] = plugins
        done = subprocess.run(
            [sys.executable, "-c", BUILD, json.dumps(settings)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(
        m for m in modules for name in names if m == name or m.startswith(name + ".")
    )


def test_the_shipped_agent_loads_no_part_it_does_not_use(tmp_path: Path) -> None:
    modules = _modules(tmp_path)
    assert "vgpu_state.deviceplugin" in modules  # the device plugin is on
    assert _loaded(modules, NEVER) == []


@pytest.mark.parametrize("mode", ["enforce", "plan-only"])
def test_without_the_device_plugin_its_stack_stays_unloaded(tmp_path: Path, mode: str) -> None:
    modules = _modules(tmp_path, mode=mode, device_plugin=False)
    assert _loaded(modules, (*NEVER, "vgpu_state.deviceplugin")) == []
