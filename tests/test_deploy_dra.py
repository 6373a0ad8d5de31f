"""deploy/components/dra and the DRA objects vgpu-state writes, checked against the API schemas."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from vgpu_state.catalog import default_catalog
from vgpu_state.dra.slices import DRIVER, build_pool
from vgpu_state.sim.host import SimHost

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
DRA_MOUNTS = {
    "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet/plugins",
    "/var/run/cdi",
}


def _render(tmp_path: Path, with_dra: bool) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is required to render deploy/ (kubectl kustomize) but is not on PATH")
    # kustomize takes relative paths only.
    text = f"resources: [{os.path.relpath(REPO / 'deploy', tmp_path)}]\n"
    if with_dra:
        text += f"components: [{os.path.relpath(REPO / 'deploy/components/dra', tmp_path)}]\n"
    (tmp_path / "kustomization.yaml").write_text(text)
    proc = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in YAML(typ="safe").load_all(proc.stdout) if d]


def _validate(docs: list[dict[str, Any]], version: str) -> list[str]:
    import kubernetes_validate

    problems = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{doc['kind']}: {str(exc).splitlines()[0]} at {list(exc.path)}")
    return problems


@pytest.mark.parametrize("version", ["1.34.0", "1.37.0"])
def test_the_dra_component_adds_the_device_class_rbac_and_plugin_directories(
    tmp_path: Path, version: str
) -> None:
    docs = _render(tmp_path, with_dra=True)
    assert _validate(docs, version) == []
    (dc,) = [d for d in docs if d["kind"] == "DeviceClass"]
    assert dc["metadata"]["name"] == DRIVER
    assert dc["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
    (role,) = [
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "vgpu-state-dra"
    ]
    rules = {r["resources"][0]: set(r["verbs"]) for r in role["rules"]}
    assert rules["resourceclaims"] == {"get", "list"}  # no watch, no write
    assert {"create", "update", "delete", "list"} <= rules["resourceslices"]
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "vgpu-state-dra"
    ]
    (subject,) = binding["subjects"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert subject["name"] == ds["spec"]["template"]["spec"]["serviceAccountName"]
    assert subject["namespace"] == ds["metadata"]["namespace"]
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    assert agent["args"][0] == "agent" and agent["args"][-1] == "--dra"
    from click.testing import CliRunner

    from vgpu_state.cli.main import cli

    assert "--dra " in CliRunner().invoke(cli, ["agent", "--help"]).output
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts >= DRA_MOUNTS
    host_paths = {
        v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v
    }
    assert host_paths >= DRA_MOUNTS  # the same paths as on the host
    assert "/var/lib/kubelet/device-plugins" in mounts  # the base's mounts stay


def test_the_base_alone_has_no_dra(tmp_path: Path) -> None:
    docs = _render(tmp_path, with_dra=False)
    assert not [d for d in docs if d["kind"] == "DeviceClass"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    mounts = {
        m["mountPath"] for m in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert not DRA_MOUNTS & mounts


@pytest.mark.parametrize(
    ("version", "api"), [("1.34.0", "v1"), ("1.33.0", "v1beta2"), ("1.37.0", "v1")]
)
def test_published_slices_are_valid_resource_slices(version: str, api: str) -> None:
    with SimHost(REPO / "configs" / "sim" / "mixed.yaml", in_memory=True) as host:
        manifests = build_pool(host.scan(), catalog=CATALOG).manifests(3, api)
    assert len(manifests) == 3
    assert _validate(manifests, version) == []


def test_the_examples_in_the_dra_page_are_valid() -> None:
    text = (REPO / "docs" / "dra.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    docs = [d for b in blocks for d in YAML(typ="safe").load_all(b) if d]
    objects = [d for d in docs if "kind" in d]
    assert {"DeviceClass", "ResourceClaimTemplate", "VirtualMachine"} <= {
        d["kind"] for d in objects
    }
    k8s = [d for d in objects if d["apiVersion"].startswith("resource.k8s.io/")]
    assert _validate(k8s, "1.34.0") == []
    (vm,) = [d for d in objects if d["kind"] == "VirtualMachine"]
    spec = vm["spec"]["template"]["spec"]
    (claim,) = spec["resourceClaims"]
    (gpu,) = spec["domain"]["devices"]["gpus"]
    template = next(d for d in objects if d["kind"] == "ResourceClaimTemplate")
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    assert gpu["claimName"] == claim["name"]
    requests = [r["name"] for r in template["spec"]["spec"]["devices"]["requests"]]
    assert gpu["requestName"] in requests
    # The config example loads, and publishes its entry through DRA.
    from vgpu_state.config import load_text

    (config,) = [b for b in blocks if b.startswith("version: v1")]
    entry = load_text(config, "dra.md", catalog=CATALOG).configs["render-nodes"].entries[0]
    assert entry.publish is not None and entry.publish.value == "dra"
