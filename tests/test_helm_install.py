"""The Helm chart installed, upgraded and uninstalled by helm on a real kube-apiserver.

A control plane of its own (etcd + kube-apiserver, tests/realcluster.py) with
nothing installed: the session's plane already holds deploy/, whose cluster-wide
objects (same names) helm would refuse to take over. Skipped without Go-built
binaries or helm, saying why; VGPU_STATE_REQUIRE_K8S=1 fails instead.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import ApiError, ControlPlane, Unavailable
from tests.test_helm_chart import CHART, NAMESPACE, helm_binary

REPO = Path(__file__).resolve().parent.parent
STATE_LABEL = "nvidia.com/vgpu.config.state"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    helm_binary()  # skips (or fails) first when there is no helm
    plane = ControlPlane(tmp_path_factory.mktemp("k8s-helm"))
    try:
        plane.start()
    except Unavailable as e:
        plane.stop()
        if os.environ.get("VGPU_STATE_REQUIRE_K8S") == "1":
            pytest.fail(f"a real control plane is required (VGPU_STATE_REQUIRE_K8S=1): {e}")
        pytest.skip(f"no real control plane: {e}")
    except BaseException:
        plane.stop()
        raise
    yield plane
    plane.stop()


def helm(plane: ControlPlane, *args: str) -> str:
    proc = subprocess.run(
        [helm_binary(), "--kubeconfig", str(plane.workdir / "kubeconfig"), *args],
        capture_output=True, text=True, check=False,
        env={**os.environ, "HELM_CACHE_HOME": str(plane.workdir / "helm-cache"),
             "HELM_CONFIG_HOME": str(plane.workdir / "helm-config"),
             "HELM_DATA_HOME": str(plane.workdir / "helm-data")},
    )  # fmt: skip
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def agent_args(plane: ControlPlane) -> list[str]:
    daemonset = plane.get("apps/v1/daemonsets", "vgpu-state-agent", NAMESPACE)
    assert daemonset is not None
    return [str(a) for a in daemonset["spec"]["template"]["spec"]["containers"][0]["args"]]


def patch_labels(plane: ControlPlane, token: str, node: str, labels: dict[str, str]) -> Any:
    return plane.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"labels": labels}},
        "application/merge-patch+json",
        token=token,
    )


def test_install_promote_uninstall_and_install_with_own_layouts(
    plane: ControlPlane, tmp_path: Path
) -> None:
    out = helm(
        plane, "install", "vgpu-state", str(CHART), "--namespace", NAMESPACE,
        "--create-namespace", "--set", "dra.enabled=true",
    )  # fmt: skip
    assert "The agents run plan-only" in out  # NOTES.txt: what to do next
    plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/vgpunodestates.vgpu-state.io"
    )
    args = agent_args(plane)
    assert args[args.index("--mode") + 1] == "plan-only" and "--dra" in args
    assert plane.get("resource.k8s.io/v1/deviceclasses", "vgpu.vgpu-state.io") is not None
    configmap = plane.get("v1/configmaps", "vgpu-state-config", NAMESPACE)
    assert configmap is not None and "\ndefault:" not in configmap["data"]["config.yaml"]

    # The chart's RBAC and admission policies hold the agent to its own node.
    plane.ensure_node("gpu-1")
    plane.ensure_node("gpu-2")
    token = plane.agent_token("gpu-1")
    refusal = ""
    deadline = time.monotonic() + 30
    while not refusal and time.monotonic() < deadline:  # the policies take effect in ~1 s
        try:
            patch_labels(plane, token, "gpu-2", {STATE_LABEL: "pending"})
            time.sleep(0.2)
        except ApiError as e:
            refusal = str(e)
    assert "may change only its own Node, not gpu-2" in refusal
    patch_labels(plane, token, "gpu-1", {STATE_LABEL: "pending"})

    # Promotion of every node at once: the same objects, the agent's mode changed. (The
    # layouts stay as they are: with the controller's layouts webhook, an update of the
    # ConfigMap needs a controller replica serving, and none runs here.)
    helm(plane, "upgrade", "vgpu-state", str(CHART), "--namespace", NAMESPACE,
         "--reuse-values", "--set", "agent.mode=enforce")  # fmt: skip
    args = agent_args(plane)
    assert args[args.index("--mode") + 1] == "enforce" and "--dra" in args  # values reused

    helm(plane, "uninstall", "vgpu-state", "--namespace", NAMESPACE, "--wait")
    assert plane.get("apps/v1/daemonsets", "vgpu-state-agent", NAMESPACE) is None
    assert plane.get("rbac.authorization.k8s.io/v1/clusterroles", "vgpu-state-agent") is None
    policies = "admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    assert plane.get(policies, "vgpu-state-agent-own-node") is None
    assert plane.get("apiextensions.k8s.io/v1/customresourcedefinitions",
                     "vgpunodestates.vgpu-state.io") is None  # fmt: skip

    # Installed again with the operator's own layouts file.
    layouts = (REPO / "configs" / "default.yaml").read_text(encoding="utf-8")
    (tmp_path / "config.yaml").write_text(layouts, encoding="utf-8")
    helm(plane, "install", "vgpu-state", str(CHART), "--namespace", NAMESPACE,
         "--set-file", f"config={tmp_path / 'config.yaml'}")  # fmt: skip
    configmap = plane.get("v1/configmaps", "vgpu-state-config", NAMESPACE)
    assert configmap is not None and configmap["data"]["config.yaml"] == layouts
    helm(plane, "uninstall", "vgpu-state", "--namespace", NAMESPACE, "--wait")
    assert plane.get("v1/configmaps", "vgpu-state-config", NAMESPACE) is None
