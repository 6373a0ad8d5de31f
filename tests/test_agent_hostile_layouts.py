"""The agent and the controller as real processes, given layouts nested 30,000 levels deep.

The layouts ConfigMap reaches the agents as a mounted file; replaced by delete and
create, it is never reviewed by the webhook. ruamel's C composer recursed once per level
on the C stack: the agent died with SIGSEGV, wrote no Event, and left its state label at
``success``. Now the text is refused as any invalid layouts are: the agent lives on, the
state label says ``failed``, the status and an Event name the file, line, column and
limit, and a good ConfigMap brings the node back.

Runs against the harness's real kube-apiserver with the agent's pod-bound token; the node
is simulated in memory (``--sim``), so no FUSE is needed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_process import A2_SPEC, CONFIG, NODE, STATE_LABEL, swap_configmap, wait_for
from tests.apiserver import put_kubevirt
from tests.realcluster import ControlPlane

REPO = Path(__file__).resolve().parent.parent
LIMIT = "config.yaml:1:65: nested more than 64 levels deep"


@pytest.fixture
def agent(cluster: ControlPlane, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    cluster.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4g"}}})
    put_kubevirt(cluster)
    spec = tmp_path / "node.yaml"
    shutil.copy(A2_SPEC, spec)
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    swap_configmap(config_dir, 1, CONFIG)
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig", token=cluster.agent_token(NODE))
    log = tmp_path / "agent.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpu_state.cli.main", "agent", "--node", NODE,
         "--config", str(config_dir / "config.yaml"), "--kubeconfig", str(kubeconfig),
         "--sim", str(spec),
         "--state-dir", str(tmp_path / "state"), "--no-device-plugin", "--listen", "",
         "--resync", "300", "--namespace", "vgpu-state", "--mode", "enforce"],
        cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield proc, config_dir
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        print(log.read_text())


def test_a_deeply_nested_layouts_configmap_fails_the_node_and_the_agent_lives(
    cluster: ControlPlane, agent: tuple[subprocess.Popen[str], Path]
) -> None:
    proc, config_dir = agent

    def state() -> str | None:
        node = cluster.get("v1/nodes", NODE)
        assert node is not None
        label: str | None = node["metadata"].get("labels", {}).get(STATE_LABEL)
        return label

    wait_for("the first reconcile", lambda: state() == "success", proc, timeout=60)

    swap_configmap(config_dir, 2, "[" * 30_000 + "]" * 30_000)
    wait_for("the state label failed", lambda: state() == "failed", proc, timeout=60)
    found = cluster.get("vgpu-state.io/v1alpha1/vgpunodestates", NODE)
    assert found is not None
    degraded = {c["type"]: c for c in found["status"]["conditions"]}["Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "ConfigInvalid"
    assert LIMIT in degraded["message"]
    events = [e for e in cluster.all("v1/events") if e.get("reason") == "ConfigInvalid"]
    assert events and LIMIT in events[-1]["message"]
    assert proc.poll() is None, "the agent lives on"

    swap_configmap(config_dir, 3, CONFIG)
    wait_for("success again", lambda: state() == "success", proc, timeout=60)


def test_the_controller_given_deeply_nested_layouts_lives_on_and_says_why(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """The controller's fleet view reads the layouts file at every view, the first one at
    start: nested 30,000 deep, it crash-looped on SIGSEGV. Now the view fails, naming the
    limit, and the controller goes on with its passes."""
    import signal
    import time

    layouts = tmp_path / "layouts.yaml"
    layouts.write_text("[" * 30_000 + "]" * 30_000)
    kubeconfig = cluster.controller_kubeconfig(tmp_path / "controller")
    log = tmp_path / "controller.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpu_state.cli.main", "controller",
         "--kubeconfig", str(kubeconfig), "-f", str(layouts), "--identity", "c-0",
         "--namespace", "vgpu-state", "--webhook-port", "0", "--listen", "",
         "--interval", "1", "--fleet-interval", "1"],
        cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        said = f"fleet view failed (retried in 1 s): {layouts}:1:65: nested more than 64"
        while said not in log.read_text():
            assert proc.poll() is None, f"the controller exited ({proc.returncode})"
            assert time.monotonic() < deadline, "no fleet view failure logged"
            time.sleep(0.2)
        time.sleep(2)  # more passes and views
        assert proc.poll() is None, "the controller lives on"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        print(log.read_text())
