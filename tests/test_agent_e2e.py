"""The agent as a real process: an API server, a FUSE-simulated sysfs, a ConfigMap directory.

What a cluster operator sees: label a node and its vGPUs follow; edit the
ConfigMap and they follow again; break the config and nothing on the host
changes while the node says why; stop the agent and it exits cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kube_emulator import RunningEmulator
from vgpu_state.host import scan
from vgpu_state.sim.fuse import mounted

REPO = Path(__file__).resolve().parent.parent
A2_SPEC = REPO / "configs" / "sim" / "a2-host.yaml"
NODE = "a2-node"
STATE_LABEL = "nvidia.com/vgpu.config.state"
CONFIG = """\
version: v1
vgpu-configs:
  a2-4g:           # what the node has: nothing to do
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 1, A2-4A: 1}
  grow:            # one more A2-4Q
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 2, A2-4A: 1}
"""


def swap_configmap(directory: Path, generation: int, text: str) -> None:
    """Update a ConfigMap volume as the kubelet does (new dir, atomic ``..data`` rename)."""
    version = directory / f"..2026_11_23_{generation}"
    version.mkdir()
    (version / "config.yaml").write_text(text)
    (directory / "..data_tmp").symlink_to(version.name)
    os.rename(directory / "..data_tmp", directory / "..data")
    if not (directory / "config.yaml").is_symlink():
        (directory / "config.yaml").symlink_to("..data/config.yaml")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    what: str, check: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise AssertionError(f"the agent exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def layout(root: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for gpu in scan(root).gpus:
        for v in gpu.vgpus:
            counts[str(v.type_name)] = counts.get(str(v.type_name), 0) + 1
    return counts


class Running:
    def __init__(self, kube: RunningEmulator, tmp: Path, root: str) -> None:
        self.kube = kube
        self.root = root
        self.config_dir = tmp / "config"
        self.config_dir.mkdir()
        swap_configmap(self.config_dir, 1, CONFIG)
        self.generation = 1
        self.port = free_port()
        self.log = tmp / "agent.log"
        in_use = tmp / "in-use.json"
        in_use.write_text(json.dumps({"f715f63c-0d00-4007-9c5a-b07b0c6c05de": "vm default/win-1"}))
        kubeconfig = kube.write_kubeconfig(tmp / "kubeconfig")
        self.args = [
            sys.executable, "-m", "vgpu_state.cli.main", "agent",
            "--node", NODE, "--config-dir", str(self.config_dir),
            "--kubeconfig", str(kubeconfig), "--sysfs-root", root,
            "--state-dir", str(tmp / "state"), "--in-use-file", str(in_use),
            "--listen", f"127.0.0.1:{self.port}", "--resync", "300",
            "--namespace", "vgpu-state",
        ]  # fmt: skip
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> subprocess.Popen[str]:
        self.proc = subprocess.Popen(
            self.args, cwd=REPO, stdout=self.log.open("a"), stderr=subprocess.STDOUT, text=True
        )
        return self.proc

    def node(self) -> dict[str, Any]:
        found = self.kube.get("v1/nodes", NODE)
        assert found is not None
        return found

    def state(self) -> str | None:
        return self.node()["metadata"].get("labels", {}).get(STATE_LABEL)

    def annotation(self, key: str) -> str:
        return str(self.node()["metadata"].get("annotations", {}).get(key, ""))

    def label(self, value: str) -> None:
        """``kubectl label node --overwrite``: a merge patch over HTTP."""
        from vgpu_state.kube.api import KubeApi

        api = KubeApi(self.kube.api_client(), self.kube.url, (5.0, 10.0))
        api.patch(
            f"/api/v1/nodes/{NODE}",
            {"metadata": {"labels": {"nvidia.com/vgpu.config": value}}},
            "merge",
        )

    def edit_config(self, text: str) -> None:
        self.generation += 1
        swap_configmap(self.config_dir, self.generation, text)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return 0, ""


@pytest.fixture
def agent(kube: RunningEmulator, tmp_path: Path, require_fuse: None) -> Iterator[Running]:
    kube.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4g"}}})
    kube.put(
        "kubevirt.io/v1/kubevirts",
        "kubevirt",
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "spec": {
                "configuration": {
                    "developerConfiguration": {"featureGates": ["DisableMDEVConfiguration"]}
                }
            },
        },
        namespace="kubevirt",
    )
    with mounted(A2_SPEC, tmp_path / "sys") as m:
        running = Running(kube, tmp_path, str(m.root))
        try:
            yield running
        finally:
            if running.proc is not None and running.proc.poll() is None:
                running.proc.kill()
                running.proc.wait(10)
            print(running.log.read_text() if running.log.exists() else "(no agent log)")


def test_label_change_configmap_edit_bad_config_and_sigterm(agent: Running) -> None:
    proc = agent.start()
    wait_for("the first reconcile", lambda: agent.state() == "success", proc)
    assert layout(agent.root) == {"A2-4C": 1, "A2-4Q": 1, "A2-4A": 1}
    assert agent.get("/readyz")[0] == 200

    # A label change: the layout is created, the state label says success.
    agent.label("grow")
    wait_for("the grown layout", lambda: layout(agent.root).get("A2-4Q") == 2, proc)
    wait_for("success", lambda: agent.state() == "success", proc)
    cr = agent.kube.get("kubevirt.io/v1/kubevirts", "kubevirt", "kubevirt")
    assert cr is not None
    mdevs = cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    assert {e["mdevNameSelector"] for e in mdevs} >= {"NVIDIA A2-4Q", "NVIDIA A2-4C"}

    # A ConfigMap edit (symlink swap), no label change: re-applied.
    agent.edit_config(CONFIG.replace("{A2-4C: 1, A2-4Q: 2, A2-4A: 1}", "{A2-4C: 1, A2-4Q: 3}"))
    wait_for("the edited layout", lambda: layout(agent.root) == {"A2-4C": 1, "A2-4Q": 3}, proc)
    wait_for("success", lambda: agent.state() == "success", proc)

    # The config made invalid: the node says where; the host is left as it is.
    before = scan(agent.root).fingerprint()
    agent.edit_config(CONFIG.replace("A2-4Q: 2", "A2-4Q: lots"))
    wait_for("failed", lambda: agent.state() == "failed", proc)
    message = agent.annotation("vgpu-state.io/last-plan")
    assert "config.yaml:8:39:" in message and "lots" in message, message
    assert scan(agent.root).fingerprint() == before

    metrics = agent.get("/metrics")[1]
    assert 'vgpu_state_reconciles_total{result="degraded"}' in metrics
    assert "vgpu_state_config_generation 2.0" in metrics, "the invalid one does not count"

    # SIGTERM: exit 0.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
