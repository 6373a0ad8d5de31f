"""The Helm chart (deploy/helm/vgpu-state): lint, render, and the same objects as deploy/.

Helm is upstream's, built from the Go module proxy by hack/helm/build.sh (``make
test`` runs it through scripts/ensure-k8s). Without it these tests are skipped,
saying why; VGPU_STATE_REQUIRE_K8S=1 (set by .ci/run) fails them instead.
"""

from __future__ import annotations

import copy
import difflib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "vgpu-state"
NAMESPACE = "vgpu-state"
# The labels Helm charts carry and the kustomize base does not.
HELM_ONLY_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
}
# The API server drops metadata.namespace from these; kustomize sets it on the
# admission policies, whose scope it does not know.
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "DeviceClass",
    "Namespace",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
}
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")
DRA_KUBERNETES_VERSIONS = ("1.34.0", "1.37.0")  # resource.k8s.io/v1


def helm_binary() -> str:
    directory = os.environ.get("VGPU_STATE_HELM_BIN")
    path = Path(directory) / "helm" if directory else REPO / "hack" / "helm" / "bin" / "helm"
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    reason = f"{path} is not built (sh hack/helm/build.sh, needs Go >= 1.26)"
    if os.environ.get("VGPU_STATE_REQUIRE_K8S") == "1":
        pytest.fail(f"helm is required (VGPU_STATE_REQUIRE_K8S=1): {reason}")
    pytest.skip(f"no helm: {reason}")


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


def load_all(text: str) -> list[dict[str, Any]]:
    return [d for d in YAML(typ="safe").load_all(text) if d]


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, check=False)


def template(helm: str, *values: str) -> list[dict[str, Any]]:
    proc = run_helm(helm, "template", "vgpu-state", str(CHART), "--namespace", NAMESPACE, *values)
    assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
    docs = load_all(proc.stdout)
    assert docs, "helm template rendered nothing"
    return docs


def kustomize(tmp_path: Path, kustomization: str = "") -> list[dict[str, Any]]:
    """deploy/ through an overlay in tmp_path (kustomize takes relative paths only)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is required to render deploy/ (kubectl kustomize) but is not on PATH")
    base = os.path.relpath(REPO / "deploy", tmp_path)
    text = kustomization.replace("BASE", base) or f"resources: [{base}]\n"
    (tmp_path / "kustomization.yaml").write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize failed:\n{proc.stderr}"
    return load_all(proc.stdout)


def key(doc: dict[str, Any]) -> str:
    meta = normalised(doc)["metadata"]
    where = f"{meta['namespace']}/" if "namespace" in meta else ""
    return f"{doc['kind']} {where}{meta['name']} ({doc['apiVersion']})"


def normalised(doc: dict[str, Any]) -> dict[str, Any]:
    """What the cluster would hold: without Helm's own labels, without a namespace on
    cluster-scoped objects, and with volumes and volume mounts (sets keyed by name
    and path) in one order."""
    doc = copy.deepcopy(doc)
    if doc["kind"] in CLUSTER_SCOPED:
        doc["metadata"].pop("namespace", None)
    labels = doc["metadata"].get("labels", {})
    for label in HELM_ONLY_LABELS:
        labels.pop(label, None)
    pod = doc.get("spec", {}).get("template", {}).get("spec")
    if pod is not None:
        pod["volumes"] = sorted(pod.get("volumes", []), key=lambda v: v["name"])
        for container in pod["containers"]:
            container["volumeMounts"] = sorted(
                container.get("volumeMounts", []), key=lambda m: m["mountPath"]
            )
    return doc


def by_key(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    keyed = {key(d): normalised(d) for d in docs}
    assert len(keyed) == len(docs), "two objects share a kind, namespace and name"
    return keyed


def assert_same_objects(chart: list[dict[str, Any]], base: list[dict[str, Any]]) -> None:
    # The chart installs into the release's namespace (helm install --create-namespace);
    # the base creates its own.
    base = [d for d in base if d["kind"] != "Namespace"]
    rendered, expected = by_key(chart), by_key(base)
    assert sorted(rendered) == sorted(expected), (
        f"only in the chart: {sorted(set(rendered) - set(expected))}; "
        f"only in deploy/: {sorted(set(expected) - set(rendered))}"
    )
    differ = [k for k in expected if rendered[k] != expected[k]]
    if differ:
        k = differ[0]
        dump = YAML()
        chart_text, base_text = io.StringIO(), io.StringIO()
        # Keys in one order, so that the diff shows only what differs.
        dump.dump(json.loads(json.dumps(rendered[k], sort_keys=True)), chart_text)
        dump.dump(json.loads(json.dumps(expected[k], sort_keys=True)), base_text)
        diff = "\n".join(
            difflib.unified_diff(
                base_text.getvalue().splitlines(),
                chart_text.getvalue().splitlines(),
                "deploy/",
                "chart",
                lineterm="",
            )
        )
        pytest.fail(f"{len(differ)} object(s) differ: {differ}; the first:\n{diff}")


# The Prometheus Operator's kinds: no Kubernetes schema to check them against
# (tests/test_monitoring.py checks the rules with promtool).
OPERATOR_KINDS = {"PodMonitor", "PrometheusRule"}


def validate(docs: list[dict[str, Any]], version: str) -> list[str]:
    import kubernetes_validate

    problems = []
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{key(doc)}: {str(exc).splitlines()[0]} at {list(exc.path)}")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{key(doc)}: no schema for Kubernetes {version}")
    return problems


def test_helm_lint_strict_passes(helm: str) -> None:
    for values in ([], ["--set", "agent.mode=enforce", "--set", "dra.enabled=true"]):
        proc = run_helm(helm, "lint", "--strict", str(CHART), *values)
        assert proc.returncode == 0, f"helm lint --strict {values}:\n{proc.stdout}{proc.stderr}"
        assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_the_chart_files_are_the_bases_own() -> None:
    proc = subprocess.run(
        ["python3", str(REPO / "scripts" / "sync_chart_files.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_default_values_render_what_the_base_renders(helm: str, tmp_path: Path) -> None:
    assert_same_objects(template(helm), kustomize(tmp_path))


def test_enforce_with_dra_and_monitoring_renders_what_the_base_with_both_components_renders(
    helm: str, tmp_path: Path
) -> None:
    (daemonset,) = [d for d in kustomize(tmp_path) if d["kind"] == "DaemonSet"]
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    mode = args.index("--mode") + 1
    base = kustomize(
        tmp_path,
        "resources: [BASE]\n"
        "components: [BASE/components/dra, BASE/monitoring]\n"
        # The monitoring component's objects carry no labels of their own; the chart
        # labels everything it installs, as these overlay labels do.
        "labels:\n"
        "  - pairs: {app.kubernetes.io/name: vgpu-state, app.kubernetes.io/part-of: vgpu-state}\n"
        "patches:\n"
        "  - target: {kind: DaemonSet, name: vgpu-state-agent}\n"
        "    patch: |-\n"
        f"      - op: replace\n"
        f"        path: /spec/template/spec/containers/0/args/{mode}\n"
        "        value: enforce\n",
    )
    chart = template(
        helm, "--set", "agent.mode=enforce", "--set", "dra.enabled=true",
        "--set", "monitoring.enabled=true",
    )  # fmt: skip
    assert {"PodMonitor", "PrometheusRule"} <= {d["kind"] for d in chart}
    assert_same_objects(chart, base)
    (agent,) = [d for d in chart if d["kind"] == "DaemonSet"]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--mode") + 1] == "enforce" and "--dra" in args


def test_gpu_operator_mode_renders_what_the_base_with_its_component_renders(
    helm: str, tmp_path: Path
) -> None:
    """``gpuOperator.enabled``: the agent runs with --gpu-operator and may list the pods of
    the GPU Operator's namespace, as deploy/components/gpu-operator installs it."""
    base = kustomize(tmp_path, "resources: [BASE]\ncomponents: [BASE/components/gpu-operator]\n")
    chart = template(helm, "--set", "gpuOperator.enabled=true")
    assert_same_objects(chart, base)
    (agent,) = [d for d in chart if d["kind"] == "DaemonSet"]
    assert "--gpu-operator" in agent["spec"]["template"]["spec"]["containers"][0]["args"]
    (role,) = [d for d in chart if d["kind"] == "Role" and "gpu-operator" in d["metadata"]["name"]]
    assert role["metadata"]["namespace"] == "gpu-operator"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    # The default install has neither.
    default = template(helm)
    (agent,) = [d for d in default if d["kind"] == "DaemonSet"]
    assert "--gpu-operator" not in agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [d for d in default if "gpu-operator" in d["metadata"]["name"]]


def test_the_gpu_operators_namespace_is_one_value(helm: str) -> None:
    docs = template(
        helm, "--set", "gpuOperator.enabled=true", "--set", "gpuOperator.namespace=nvidia-gpu"
    )
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--gpu-operator-namespace") + 1] == "nvidia-gpu"
    named = [d for d in docs if d["metadata"]["name"] == "vgpu-state-agent-gpu-operator"]
    assert {d["kind"] for d in named} == {"Role", "RoleBinding"}
    assert {d["metadata"]["namespace"] for d in named} == {"nvidia-gpu"}


def test_the_default_install_is_plan_only_without_a_default_layout(helm: str) -> None:
    docs = template(helm)
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--mode") + 1] == "plan-only"
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert "\ndefault:" not in configmap["data"]["config.yaml"]


def test_the_default_config_and_strict_reach_the_agent(helm: str) -> None:
    """vgpu-device-manager's DEFAULT_VGPU_CONFIG, as a chart value: --default-config."""
    (agent,) = [d for d in template(helm) if d["kind"] == "DaemonSet"]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--default-config" not in args and "--strict" not in args
    docs = template(helm, "--set", "agent.defaultConfig=default", "--set", "agent.strict=true")
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--default-config") + 1] == "default"
    assert "--strict" in args


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_of_the_default_install_is_valid(helm: str, version: str) -> None:
    assert not validate(template(helm), version)


@pytest.mark.parametrize("version", DRA_KUBERNETES_VERSIONS)
def test_every_object_with_every_option_set_is_valid(helm: str, version: str) -> None:
    docs = template(
        helm,
        "--set", "agent.mode=enforce",
        "--set", "agent.defaultConfig=default",
        "--set", "agent.strict=true",
        "--set", "dra.enabled=true",
        "--set", "imagePullSecrets[0].name=registry",
        "--set", "image.registry=registry.example:5000",
        "--set", "image.repository=vgpu-state",
        "--set", "image.tag=1.2.3",
        "--set", "agent.maxUnavailable=10%",
        "--set", "agent.nvidiaLibPath=/run/nvidia/driver/usr/lib/nvidia",
        "--set-json", 'agent.extraArgs=["--resync", "120"]',
        "--set", "controller.replicas=3",
        "--set", "controller.grace=600",
        "--set", "monitoring.enabled=true",
        "--set", "gpuOperator.enabled=true",
    )  # fmt: skip
    assert not validate(docs, version)
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = agent["spec"]["template"]["spec"]
    monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {
        "vgpu-state-agent",
        "vgpu-state-controller",
    }
    assert {m["metadata"]["namespace"] for m in monitors} == {NAMESPACE}
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    alert = rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]
    assert "{{ $labels.node }}" in alert  # the rule's own template, not Helm's
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["containers"][0]["image"] == "registry.example:5000/vgpu-state:1.2.3"
    assert pod["containers"][0]["args"][-2:] == ["--resync", "120"]
    nvidia = [v for v in pod["volumes"] if v["name"] == "nvidia-lib"]
    assert nvidia[0]["hostPath"]["path"] == "/run/nvidia/driver/usr/lib/nvidia"
    (controller,) = [d for d in docs if d["kind"] == "Deployment"]
    assert controller["spec"]["replicas"] == 3
    assert controller["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "600"


def test_both_install_the_published_image_of_the_charts_release(
    helm: str, tmp_path: Path
) -> None:
    """The image a user gets without setting one: the release workflow's, at the one
    version (pyproject.toml's); one value moves it to another registry."""
    version = release_version()
    published = f"ghcr.io/vgpu-state/vgpu-state:{version}"
    for docs in (template(helm), kustomize(tmp_path)):
        images = {c["image"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")
                  for c in d["spec"]["template"]["spec"]["containers"]}  # fmt: skip
        assert images == {published}
    (agent,) = [d for d in template(helm, "--set", "image.registry=registry.example")
                if d["kind"] == "DaemonSet"]  # fmt: skip
    assert agent["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"registry.example/vgpu-state/vgpu-state:{version}"
    )
    (agent,) = [d for d in template(helm, "--set", "image.registry=") if d["kind"] == "DaemonSet"]
    assert agent["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"vgpu-state/vgpu-state:{version}"
    )
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    docs = kustomize(overlay, "resources: [BASE]\nimages:\n"
                     "  - name: ghcr.io/vgpu-state/vgpu-state\n"
                     "    newName: registry.example/vgpu-state\n")  # fmt: skip
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert agent["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"registry.example/vgpu-state:{version}"
    )


def release_version() -> str:
    proc = subprocess.run(
        ["sh", str(REPO / "scripts" / "version")], capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


def test_a_layouts_file_given_to_the_chart_is_the_configmap(helm: str, tmp_path: Path) -> None:
    layouts = (REPO / "configs" / "default.yaml").read_text(encoding="utf-8")
    (tmp_path / "config.yaml").write_text(layouts, encoding="utf-8")
    docs = template(helm, "--set-file", f"config={tmp_path / 'config.yaml'}")
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert configmap["data"] == {"config.yaml": layouts}


def test_the_controller_can_be_left_out(helm: str) -> None:
    docs = template(helm, "--set", "controller.enabled=false")
    assert not [d for d in docs if "controller" in d["metadata"]["name"]]
    assert [d for d in docs if d["kind"] == "DaemonSet"]


def test_dra_on_a_cluster_older_than_1_34_is_refused(helm: str) -> None:
    proc = run_helm(
        helm, "template", "vgpu-state", str(CHART), "--set", "dra.enabled=true",
        "--kube-version", "1.33.4",
    )  # fmt: skip
    assert proc.returncode != 0
    assert "dra.enabled: Dynamic Resource Allocation needs Kubernetes 1.34 or later" in (
        proc.stderr
    )
    assert template(helm, "--set", "dra.enabled=true", "--kube-version", "1.34.0")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ["--set", "agent.mode=enforced"],
            "at '/agent/mode': value must be one of 'plan-only', 'enforce'",
        ),
        (
            ["--set", "agent.modee=enforce"],
            "at '/agent': additional properties 'modee' not allowed",
        ),
        (["--set", "dra=true"], "at '/dra': got boolean, want object"),
        (["--set", "agent.defaultConfig=not a name"], "at '/agent/defaultConfig'"),
        (["--set", "agent.strict=yes"], "at '/agent/strict': got string, want boolean"),
        (["--set", "agent.port=70000"], "at '/agent/port': maximum: got 70,000, want 65,535"),
        (["--set", "agent.nvidiaLibPath=usr/lib/nvidia"], "at '/agent/nvidiaLibPath'"),
        (["--set", "image.registry=https://ghcr.io"], "at '/image/registry'"),
        (["--set", "gpuOperator.namespace=GPU_Operator"], "at '/gpuOperator/namespace'"),
        (["--set", "config=layouts: ["], "config: not a YAML layouts file"),
        (["--set", "config=version: v1"], "config: the layouts file has no vgpu-configs"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_naming_it(helm: str, values: list[str], message: str) -> None:
    proc = run_helm(helm, "template", "vgpu-state", str(CHART), *values)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
