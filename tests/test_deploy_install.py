"""Installing deploy/ changes no host: the agent as `kubectl kustomize deploy/` renders it.

The DaemonSet's own arguments (plan-only mode) and the ConfigMap's own config
(no ``default:``) run against a real kube-apiserver (as the agent's node-bound
ServiceAccount) and a FUSE-simulated A2 node. Only what the pod gets from its
mounts and its service account is replaced by the test's equivalents
(kubeconfig, sysfs root, state and device-plugin directories). The node is
first unlabelled, as every node is on a fresh install, then labelled with the
shipped layout: it reports the plan, and at the end the simulated host is
exactly as it began.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from tests.agent_process import (
    A2_SPEC,
    NODE,
    Running,
    layout,
    running_agent,
    swap_configmap,
    uuids,
    wait_for,
)
from tests.realcluster import ControlPlane
from vgpu_state.catalog import default_catalog
from vgpu_state.sim.spec import dump_spec, load_spec

CATALOG = default_catalog()
REPO = Path(__file__).resolve().parent.parent
NODESTATES = "vgpu-state.io/v1alpha1/vgpunodestates"


def rendered() -> tuple[list[str], str]:
    """The agent container's args and the ConfigMap's config.yaml, as kubectl renders them."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is required to render deploy/ (kubectl kustomize) but is not on PATH")
    proc = subprocess.run(
        [kubectl, "kustomize", str(REPO / "deploy")], capture_output=True, text=True, check=True
    )
    docs: list[dict[str, Any]] = [d for d in YAML(typ="safe").load_all(proc.stdout) if d]
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in agent["args"]], str(configmap["data"]["config.yaml"])


def harness_args(args: list[str], running: Running, tmp: Path, kubeconfig: Path) -> list[str]:
    """The rendered args with the pod's environment replaced by the test's."""
    overrides = {
        "--node": NODE,  # $(NODE_NAME) from the downward API
        "--config": str(running.config_dir / "config.yaml"),  # the ConfigMap volume
        "--listen": "127.0.0.1:0",  # the pod's own network namespace
        "--proc-root": "/proc",  # the host's /proc, mounted at /host/proc in the pod
    }
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in overrides and i + 1 < len(args):
            out += [args[i], overrides[args[i]]]
            i += 2
            continue
        out.append(args[i])
        i += 1
    # What the pod gets from its service account and hostPath mounts (given last: they win).
    out += [
        "--kubeconfig", str(kubeconfig), "--sysfs-root", running.root,
        "--state-dir", str(tmp / "state"), "--device-plugin-dir", str(running.plugin_dir),
        "--in-use-file", str(tmp / "in-use.json"), "--namespace", "vgpu-state",
        "--resync", "300",
    ]  # fmt: skip
    return out


@pytest.mark.usefixtures("require_fuse")
def test_the_installed_agent_reports_plans_and_writes_nothing_to_the_host(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    kube = cluster
    args, config = rendered()
    assert args[args.index("--mode") + 1] == "plan-only"
    kube.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    kube.put(
        "kubevirt.io/v1/kubevirts",
        "kubevirt",
        {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "spec": {}},
        namespace="kubevirt",
    )
    spec = tmp_path / "node.yaml"
    shutil.copy(A2_SPEC, spec)
    original = dump_spec(load_spec(spec, catalog=CATALOG))
    with running_agent(kube, tmp_path, spec, save=True, kubelet=True) as running:
        swap_configmap(running.config_dir, 2, config)
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", token=running.token)
        admin = kube.write_kubeconfig(tmp_path / "admin-kubeconfig")
        running.args = [*running.args[:3], *harness_args(args, running, tmp_path, kubeconfig)]
        assert running.args[3] == "agent"
        before = (layout(running.root), uuids(running.root, "A2-4Q"))
        proc = running.start()
        # A fresh install: the node has no layout label, and the config no default.
        wait_for("the first status", lambda: kube.get(NODESTATES, NODE) is not None, proc)
        status = running.nodestate()
        assert running.state() is None  # no state label: nothing selects the node
        assert status["selectedConfig"].get("name") is None
        assert status["vgpuCount"] == 3  # its scan is reported: fleet plan can plan it
        ready = {c["type"]: c for c in status["conditions"]}["Ready"]
        assert (ready["status"], ready["reason"]) == ("True", "NoConfigSelected")
        assert (layout(running.root), uuids(running.root, "A2-4Q")) == before

        # What the shipped layouts would do to this node, read from its report.
        fleet = subprocess.run(
            [sys.executable, "-m", "vgpu_state.cli.main", "fleet", "plan", "-f",
             str(REPO / "configs" / "default.yaml"), "--kubeconfig", str(admin),
             "-o", "json"],
            capture_output=True, text=True, check=False, cwd=REPO,
        )  # fmt: skip
        assert fleet.returncode == 0, fleet.stderr
        (planned,) = json.loads(fleet.stdout)["nodes"]
        assert (planned["node"], planned["outcome"]) == (NODE, "changes")

        # The operator picks the shipped layout for the node: plan-only reports the
        # switch (pending, Synced False with the plan) and changes nothing.
        running.label("default")
        wait_for("the plan", lambda: running.state() == "pending", proc)
        status = running.nodestate()
        synced = {c["type"]: c for c in status["conditions"]}["Synced"]
        assert synced["status"] == "False"
        assert status["selectedConfig"]["name"] == "default"
        assert (layout(running.root), uuids(running.root, "A2-4Q")) == before
        log = running.log.read_text()
        assert "reconcile (node; 1 trigger(s))" in log and "config 'default'" in log, log
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    # The simulated driver's whole state, written back at unmount: not one change.
    assert dump_spec(load_spec(spec, catalog=CATALOG)) == original
