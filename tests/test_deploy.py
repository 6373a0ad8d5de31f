"""The kustomize base in deploy/: renders with kubectl, every manifest valid, least privilege."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from vgpu_state.catalog import default_catalog

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
# Oldest and newest Kubernetes minor versions the manifests are checked against: 1.32 is
# the first whose pod-bound tokens carry the node name the admission policies check.
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is required to render deploy/ (kubectl kustomize) but is not on PATH")
    return found


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize deploy/ failed:\n{proc.stderr}"
    docs = [d for d in YAML(typ="safe").load_all(proc.stdout) if d]
    assert docs, "kubectl kustomize deploy/ rendered nothing"
    return docs


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def only(manifests: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [m for m in by_kind(manifests, kind) if name is None or m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


AGENT = "vgpu-state-agent"
CONTROLLER = "vgpu-state-controller"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(
    manifests: list[dict[str, Any]], version: str
) -> None:
    import kubernetes_validate

    problems = []
    for doc in manifests:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{name}: {str(exc).splitlines()[0]} at {list(exc.path)}")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{name}: no schema for {doc['apiVersion']} {doc['kind']}")
    assert not problems, "\n".join(problems)


def test_base_holds_the_agent_and_everything_it_needs(manifests: list[dict[str, Any]]) -> None:
    kinds = sorted(m["kind"] for m in manifests)
    for kind in (
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Namespace",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ):
        assert kind in kinds
    namespaced = [
        m
        for m in manifests
        if m["kind"]
        not in {
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "ValidatingWebhookConfiguration",
        }
    ]
    assert {m["metadata"]["namespace"] for m in namespaced} == {"vgpu-state"}


def rules_as_set(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_cluster_role_grants_exactly_what_the_agent_uses(manifests: list[dict[str, Any]]) -> None:
    granted = rules_as_set(only(manifests, "ClusterRole", AGENT))
    assert not any("*" in part for rule in granted for part in rule), "no wildcards"
    expected = {
        *(("", "nodes", v) for v in ("get", "list", "watch", "patch")),
        # Read only: the controller is the KubeVirt CR's only vgpu-state writer.
        *(("kubevirt.io", "kubevirts", v) for v in ("get", "list")),
        # Its own, watched by name (a deleted one is written again), its owner reference
        # moved to the Node registered again under its name (patch).
        *(
            ("vgpu-state.io", "vgpunodestates", v)
            for v in ("get", "list", "watch", "create", "patch")
        ),
        ("vgpu-state.io", "vgpunodestates/status", "update"),
        *(("", "events", v) for v in ("get", "create", "patch")),
    }
    assert granted == expected
    # Leases only in the agent's namespace, through a Role.
    role = only(manifests, "Role", AGENT)
    assert role["metadata"]["namespace"] == "vgpu-state"
    assert rules_as_set(role) == {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")
    }


@pytest.mark.parametrize(("workload", "name"), [("DaemonSet", AGENT), ("Deployment", CONTROLLER)])
def test_bindings_name_each_workloads_own_service_account(
    manifests: list[dict[str, Any]], workload: str, name: str
) -> None:
    pod = only(manifests, workload, name)["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    assert account == name
    assert only(manifests, "ServiceAccount", name)["metadata"]["name"] == account
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = only(manifests, kind, name)
        assert binding["roleRef"]["kind"] == role_kind
        assert binding["roleRef"]["name"] == only(manifests, role_kind, name)["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": "vgpu-state"}
        ]


def test_the_controller_is_the_only_kubevirt_writer_and_elects_a_leader(
    manifests: list[dict[str, Any]],
) -> None:
    deployment = only(manifests, "Deployment", CONTROLLER)
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:1] == ["controller"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert not container.get("securityContext", {}).get("privileged")
    assert rules_as_set(only(manifests, "ClusterRole", CONTROLLER)) == {
        ("vgpu-state.io", "vgpunodestates", "get"),
        ("vgpu-state.io", "vgpunodestates", "list"),
        ("vgpu-state.io", "vgpunodestates", "watch"),  # listed once, then watched
        ("vgpu-state.io", "vgpunodestates", "patch"),  # the evacuation pause annotation
        # in-use: evacuate: read the VMs in the way, migrate them (or restart: delete the
        # VMI), count the migrations in flight, respect PodDisruptionBudgets.
        ("kubevirt.io", "virtualmachineinstances", "get"),
        ("kubevirt.io", "virtualmachineinstances", "delete"),
        ("kubevirt.io", "virtualmachines", "get"),
        ("kubevirt.io", "virtualmachineinstancemigrations", "create"),
        ("kubevirt.io", "virtualmachineinstancemigrations", "list"),
        ("policy", "poddisruptionbudgets", "list"),
        ("kubevirt.io", "kubevirts", "get"),
        ("kubevirt.io", "kubevirts", "list"),
        ("kubevirt.io", "kubevirts", "watch"),
        ("kubevirt.io", "kubevirts", "patch"),
        ("", "nodes", "list"),  # the fleet view: each node's labels select its layout
        ("", "nodes", "watch"),
        # A refused report: a Warning Event on the node's VGPUNodeState.
        *(("", "events", v) for v in ("get", "create", "patch")),
        # The layouts webhook's caBundle: that one object only (below).
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "get"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch"),
    }
    assert rules_as_set(only(manifests, "Role", CONTROLLER)) == {
        *(("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")),
        *(("", "secrets", v) for v in ("create", "get", "update")),
    }
    # Every read and write of a Secret or webhook configuration names its one object.
    for kind in ("ClusterRole", "Role"):
        for rule in only(manifests, kind, CONTROLLER)["rules"]:
            if {"secrets", "validatingwebhookconfigurations"} & set(rule["resources"]):
                assert rule["verbs"] == ["create"] or rule["resourceNames"] in (
                    ["vgpu-state-controller-tls"],
                    ["vgpu-state-layouts"],
                ), rule
    writers = [
        r["metadata"]["name"]
        for r in by_kind(manifests, "ClusterRole")
        if ("kubevirt.io", "kubevirts", "patch") in rules_as_set(r)
    ]
    assert writers == [CONTROLLER]
    # Only the controller moves VMs: no other role creates migrations or deletes VMIs.
    movers = [
        r["metadata"]["name"]
        for r in by_kind(manifests, "ClusterRole")
        if {
            ("kubevirt.io", "virtualmachineinstancemigrations", "create"),
            ("kubevirt.io", "virtualmachineinstances", "delete"),
        }
        & rules_as_set(r)
    ]
    assert movers == [CONTROLLER]


def test_daemonset_runs_the_agent_for_its_own_node(manifests: list[dict[str, Any]]) -> None:
    pod = only(manifests, "DaemonSet", AGENT)["spec"]["template"]["spec"]
    assert pod["nodeSelector"], "GPU nodes only"
    (agent,) = pod["containers"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    args = agent["args"]
    assert args[:1] == ["agent"]
    assert args[args.index("--node") + 1] == "$(NODE_NAME)"
    config_file = args[args.index("--config") + 1]
    assert config_file == "/etc/vgpu-state/config.yaml"
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_volume = volumes[mounts[str(Path(config_file).parent)]["name"]]
    assert config_volume["configMap"]["name"] == only(manifests, "ConfigMap")["metadata"]["name"]
    for host_path in (
        "/sys",
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/var/lib/vgpu-state",
        "/run",
    ):
        assert host_path in mounts, f"{host_path} not mounted"
        assert volumes[mounts[host_path]["name"]]["hostPath"]["path"] == host_path
    assert not mounts["/var/lib/kubelet/device-plugins"].get("readOnly"), "plugin sockets"
    assert not mounts["/sys"].get("readOnly"), "sysfs writes"
    # Probes point at the port the agent is told to listen on.
    listen = args[args.index("--listen") + 1]
    port = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert listen.endswith(f":{port['http-metrics']}")
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_daemonset_passes_the_hosts_proc_and_sriov_manage(
    manifests: list[dict[str, Any]],
) -> None:
    """The agent reads holders from the host's /proc and runs the host's sriov-manage,
    each from a read-only mount of the host's directory, and the flags name them."""
    pod = only(manifests, "DaemonSet")["spec"]["template"]["spec"]
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    args = agent["args"]
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    proc_root = args[args.index("--proc-root") + 1]
    sriov_manage = args[args.index("--sriov-manage") + 1]
    for mount_path, host_path in ((proc_root, "/proc"), ("/usr/lib/nvidia", "/usr/lib/nvidia")):
        assert mounts[mount_path].get("readOnly") is True
        assert volumes[mounts[mount_path]["name"]]["hostPath"]["path"] == host_path
    assert sriov_manage == "/usr/lib/nvidia/sriov-manage"
    from vgpu_state.cli.agent import agent as agent_command

    flags = {o for p in agent_command.params for o in p.opts}
    assert {"--proc-root", "--sriov-manage"} <= flags


def test_the_agents_process_runs_with_oo_and_commands_in_its_container_keep_their_help(
    manifests: list[dict[str, Any]],
) -> None:
    """The agent's process is started with ``-OO`` (its ``command``); the container's
    environment does not optimize every process, so ``kubectl exec … vgpu-state plan
    --help`` still shows the command's description."""
    pod = only(manifests, "DaemonSet", AGENT)["spec"]["template"]["spec"]
    [agent] = [c for c in pod["containers"] if c["name"] == "agent"]
    command = agent["command"]
    assert command[0] == "/opt/vgpu-state/bin/python"  # the image's venv (deploy/Dockerfile)
    assert "/opt/vgpu-state" in (REPO / "deploy" / "Dockerfile").read_text()
    assert "-OO" in command and command[-2:] == ["-m", "vgpu_state.cli.main"]
    assert agent["args"][0] == "agent"
    env = {e["name"] for e in agent.get("env") or ()}
    assert "PYTHONOPTIMIZE" not in env and "PYTHONOPTIMIZE" not in str(agent)
    import sys

    flags = command[1 : command.index("-m")]
    ran = subprocess.run(
        [sys.executable, *flags, "-m", "vgpu_state.cli.main", "agent", "--help"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    plain = subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", "plan", "--help"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert plain.returncode == 0 and "Examples:" in plain.stdout, plain.stdout


def test_only_the_agent_container_is_privileged(manifests: list[dict[str, Any]]) -> None:
    pod = only(manifests, "DaemonSet", AGENT)["spec"]["template"]["spec"]
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    privileged = [
        c["name"]
        for c in pod["containers"] + pod.get("initContainers", [])
        if c.get("securityContext", {}).get("privileged")
    ]
    assert privileged == ["agent"]


def test_configmap_carries_the_default_layouts_without_default_and_they_validate(
    manifests: list[dict[str, Any]],
) -> None:
    from vgpu_state.config.loader import load_text

    data = only(manifests, "ConfigMap")["data"]
    assert set(data) == {"config.yaml"}
    rendered = load_text(data["config.yaml"], "deploy/config.yaml", catalog=CATALOG)
    shipped = load_text(
        (REPO / "configs" / "default.yaml").read_text(encoding="utf-8"),
        "configs/default.yaml",
        catalog=CATALOG,
    )
    # The same layouts, but no node gets one by default: installing changes nothing.
    assert rendered.configs == shipped.configs
    assert shipped.spec.default == "default"
    assert rendered.spec.default is None and rendered.spec.node_selectors == ()
    assert "\ndefault:" not in data["config.yaml"]


def test_the_agent_is_installed_in_plan_only_mode(manifests: list[dict[str, Any]]) -> None:
    (agent,) = only(manifests, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    args = agent["args"]
    assert args[args.index("--mode") + 1] == "plan-only"


def test_dockerfile_installs_the_package_and_runs_the_command() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines()]
    # The base is an argument (make image passes a Debian-built one); python:3.11 by default.
    assert "ARG BASE=python:3.11-slim" in lines
    assert [line for line in lines if line.startswith("FROM")] == [
        "FROM ${BASE} AS build",
        "FROM ${BASE}",
    ]
    assert any(line.startswith("RUN") and "venv" in line for line in lines)
    assert any("pip install" in line for line in lines)
    assert 'ENTRYPOINT ["vgpu-state"]' in lines
