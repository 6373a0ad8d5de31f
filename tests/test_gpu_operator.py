"""``vgpu-state agent --gpu-operator`` in place of vgpu-device-manager, on the real API server.

The GPU Operator's sandbox device plugin and validator are stood in by two
DaemonSets in the namespace ``gpu-operator`` with the operator's pod labels and
nodeSelectors on ``nvidia.com/gpu.deploy.<operand>: "true"``, handled by
upstream's own DaemonSet controller (kube-controller-manager running only
``daemonset-controller``): it makes a pod for the node while the node's label is
``true`` and deletes it once the label stops matching. This harness has no
scheduler and no kubelet, so a thread of the test does their two parts and
nothing more: it binds each pending pod of the two DaemonSets to the node (the
scheduler's Binding), and finishes the deletion of a bound pod the DaemonSet
controller deleted (the kubelet's final delete with grace period 0, after
``TERMINATION`` seconds, as a container that takes a moment to stop).

The agent runs in process on a simulated node, with a token bound to a pod on
that node: the shipped RBAC, admission policies and the ``gpu-operator``
component's Role decide what it may do.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from tests.apiserver import EVENTS, NODESTATES
from tests.realcluster import AGENT_SA, NAMESPACE, REPO, ApiError, ControlPlane, api_path
from vgpu_state.kube.gpuoperator import (
    PAUSED,
    PAUSED_ANNOTATION,
    SANDBOX_DEVICE_PLUGIN_LABEL,
    SANDBOX_VALIDATOR_LABEL,
)

OPERATOR_NS = "gpu-operator"
DAEMONSETS = "apps/v1/daemonsets"
PODS = "v1/pods"
OPERANDS = {
    SANDBOX_DEVICE_PLUGIN_LABEL: "nvidia-sandbox-device-plugin-daemonset",
    SANDBOX_VALIDATOR_LABEL: "nvidia-sandbox-validator",
}
TERMINATION = 1.0
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}"
CONFIG = (
    "version: v1\nvgpu-configs:\n  a2:\n    - devices: all\n"
    '      device-filter: "0x25B610DE"\n      vgpu-devices: {A2-4Q: 4}\n'
)


def sim_spec(node: str, vgpus: int) -> str:
    lines = [
        f"node: {node}",
        "driver:\n  flavour: all",
        "gpus:",
        '  - address: "0000:08:00.0"',
        "    model: A2",
        "    layout: mdev",
        "    sriov: true",
    ]
    if vgpus:
        lines.append("    vgpus:")
        lines += [f"      - {{type: A2-4Q, vf: {i}}}" for i in range(vgpus)]
    return "\n".join(lines) + "\n"


def vgpus_in(spec: Path) -> int:
    data = YAML(typ="safe").load(spec.read_text())
    return sum(len(g.get("vgpus") or []) for g in data.get("gpus") or [])


@dataclass
class Operator:
    """The two sandbox DaemonSets, and the scheduler's and kubelet's parts for one node."""

    cluster: ControlPlane
    node: str
    spec: Path
    stop: threading.Event = field(default_factory=threading.Event)
    seen: list[tuple[dict[str, str | None], int]] = field(default_factory=list)
    """(the two labels, the spec's vGPUs) each time the labels were seen to change."""
    vgpus_when_pods_left: list[int] = field(default_factory=list)
    """The spec's vGPUs each time a pod's deletion was finished."""
    errors: list[str] = field(default_factory=list)
    termination: float = TERMINATION
    """Seconds a deleted pod takes to stop."""

    def pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.cluster.list(PODS, OPERATOR_NS)
            if p["metadata"].get("labels", {}).get("app") in OPERANDS.values()
        ]

    def bound(self) -> set[str]:
        return {
            p["metadata"]["labels"]["app"]
            for p in self.pods()
            if p["spec"].get("nodeName") == self.node and "deletionTimestamp" not in p["metadata"]
        }

    def labels(self) -> dict[str, str | None]:
        node = self.cluster.get("v1/nodes", self.node) or {}
        labels = node.get("metadata", {}).get("labels", {})
        return {key: labels.get(key) for key in OPERANDS}

    def run(self) -> None:
        deleting: dict[str, float] = {}
        last: dict[str, str | None] | None = None
        while not self.stop.is_set():
            try:
                labels = self.labels()
                if labels != last:
                    self.seen.append((labels, vgpus_in(self.spec)))
                    last = labels
                for pod in self.pods():
                    meta, spec = pod["metadata"], pod["spec"]
                    name = meta["name"]
                    if "deletionTimestamp" in meta:
                        started = deleting.setdefault(name, time.monotonic())
                        if time.monotonic() - started >= self.termination:
                            self.vgpus_when_pods_left.append(vgpus_in(self.spec))
                            self.cluster.delete(PODS, name, OPERATOR_NS)
                    elif not spec.get("nodeName"):
                        self.cluster.request(
                            "POST",
                            api_path(PODS, name, OPERATOR_NS) + "/binding",
                            {
                                "apiVersion": "v1",
                                "kind": "Binding",
                                "metadata": {"name": name},
                                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
                            },
                        )
            except (ApiError, OSError) as e:  # a pod that went meanwhile; noted, not fatal
                self.errors.append(str(e))
            self.stop.wait(0.1)


def wait_until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def operator(cluster: ControlPlane, tmp_path: Path) -> Iterator[Operator]:
    """The GPU Operator's namespace and sandbox DaemonSets, the agent's Role from
    deploy/components/gpu-operator, the DaemonSet controller, and the stand-in thread."""
    with contextlib.suppress(ApiError):
        cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": OPERATOR_NS}})
    with contextlib.suppress(ApiError):  # the ServiceAccount admission wants it for the pods
        cluster.request(
            "POST",
            api_path("v1/serviceaccounts", None, OPERATOR_NS),
            {"metadata": {"name": "default"}},
        )
    rbac = REPO / "deploy" / "components" / "gpu-operator" / "rbac.yaml"
    cluster.kubectl("apply", "--server-side", "-f", str(rbac))
    for label, app in OPERANDS.items():
        cluster.request(
            "POST",
            api_path(DAEMONSETS, None, OPERATOR_NS),
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": app},
                "spec": {
                    "selector": {"matchLabels": {"app": app}},
                    "template": {
                        "metadata": {"labels": {"app": app}},
                        "spec": {
                            "nodeSelector": {label: "true"},
                            "containers": [{"name": "operand", "image": "operand:test"}],
                        },
                    },
                },
            },
        )
    controller = cluster.start_controller_manager(controller="daemonset-controller")
    spec = tmp_path / "node.yaml"
    standin = Operator(cluster, "gpu-op-1", spec)
    try:
        yield standin
    finally:
        standin.stop.set()
        time.sleep(0.3)
        controller.terminate()
        controller.wait(20)
        cluster.procs.remove(controller)
        for app in OPERANDS.values():
            cluster.delete(DAEMONSETS, app, OPERATOR_NS)
        for pod in cluster.list(PODS, OPERATOR_NS):
            cluster.delete(PODS, pod["metadata"]["name"], OPERATOR_NS)
        # The DaemonSet controller's Events (SuccessfulCreate, SuccessfulDelete): later
        # tests count the cluster's Events.
        for event in cluster.list(EVENTS, OPERATOR_NS):
            cluster.delete(EVENTS, event["metadata"]["name"], OPERATOR_NS)


def start(operator: Operator) -> None:
    threading.Thread(target=operator.run, daemon=True).start()


def labelled_node(cluster: ControlPlane, node: str) -> None:
    """The node as the GPU Operator labels a node for vGPU VMs, Ready: without the taint
    node.kubernetes.io/not-ready the API server gives a new Node (the node lifecycle
    controller removes it once the kubelet reports Ready)."""
    cluster.ensure_node(
        node,
        {
            "nvidia.com/vgpu.config": "a2",
            SANDBOX_DEVICE_PLUGIN_LABEL: "true",
            SANDBOX_VALIDATOR_LABEL: "true",
        },
    )
    cluster.request(
        "PATCH", api_path("v1/nodes", node), {"spec": {"taints": None}},
        "application/merge-patch+json",
    )  # fmt: skip


def agent_flags(cluster: ControlPlane, tmp_path: Path, node: str, mode: str = "enforce") -> Any:
    from vgpu_state.agent.assemble import AgentFlags

    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / "config.yaml").write_text(CONFIG)
    token = cluster.agent_token(node)
    return AgentFlags(
        node=node,
        config_file=config / "config.yaml",
        mode=mode,
        resync=300.0,
        listen="",
        kubeconfig=str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)),
        sim_spec=str(tmp_path / "node.yaml"),
        state_dir=tmp_path / "state",
        manage_kubevirt=False,
        gpu_operator=True,
        operand_timeout=60.0,
    )


@contextlib.contextmanager
def running(flags: Any) -> Iterator[Any]:
    from vgpu_state.agent.assemble import build

    agent = build(flags)
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.stop()
        thread.join(60)


def state_of(cluster: ControlPlane, node: str) -> str | None:
    state = (cluster.get(NODESTATES, node) or {}).get("status", {}).get("state")
    return None if state is None else str(state)


def node_writes(cluster: ControlPlane, node: str) -> list[dict[str, Any]]:
    """The agent's answered writes to its Node, with what each asked for (audit log)."""
    return [
        e
        for e in cluster.audit(cluster.test_mark, AGENT_USER)
        if e["verb"] in ("patch", "update")
        and e.get("objectRef", {}).get("resource") == "nodes"
        and e.get("objectRef", {}).get("name") == node
        and 200 <= e.get("responseStatus", {}).get("code", 0) < 300
    ]


def operand_labels_in(event: dict[str, Any]) -> dict[str, Any]:
    metadata = (event.get("requestObject") or {}).get("metadata") or {}
    labels = metadata.get("labels") or {}
    return {k: v for k, v in labels.items() if k in OPERANDS}


def test_a_change_pauses_the_sandbox_operands_applies_then_restores_them(
    cluster: ControlPlane, operator: Operator, tmp_path: Path
) -> None:
    """Before the agent creates vGPUs, the sandbox device plugin and validator leave the
    node (their labels paused, their pods deleted by the DaemonSet controller); the host
    changes only once they are gone, and they come back once it has changed."""
    node = operator.node
    operator.spec.write_text(sim_spec(node, 0))
    labelled_node(cluster, node)
    start(operator)
    wait_until("the operands' pods on the node", lambda: operator.bound() == set(OPERANDS.values()))
    with running(agent_flags(cluster, tmp_path, node)):
        wait_until("the change applied", lambda: state_of(cluster, node) == "success")
        wait_until(
            "the operands back",
            lambda: (
                operator.bound() == set(OPERANDS.values())
                and all(v == "true" for v in operator.labels().values())
                # the stand-in operator's own poll has seen the labels back too
                and len(operator.seen) >= 3
            ),
        )
    assert vgpus_in(operator.spec) == 4
    # Both pods left while the host still had none of the new vGPUs.
    assert operator.vgpus_when_pods_left == [0, 0], operator.vgpus_when_pods_left
    paused = {k: PAUSED for k in OPERANDS}
    restored = {k: "true" for k in OPERANDS}
    # The labels went paused with none of the vGPUs made, and back once all four were.
    states = [labels for labels, _ in operator.seen]
    assert states == [restored, paused, restored], operator.seen
    assert [n for labels, n in operator.seen if labels == paused] == [0]
    assert operator.seen[-1][1] == 4
    # Exactly two label writes by the agent: the pause (recorded in the annotation of
    # the same write) and the restore (removing it).
    writes = [e for e in node_writes(cluster, node) if operand_labels_in(e)]
    assert [operand_labels_in(e) for e in writes] == [paused, restored]
    annotations = [e["requestObject"]["metadata"].get("annotations", {}) for e in writes]
    assert annotations[0][PAUSED_ANNOTATION] == ",".join(OPERANDS)
    assert annotations[1] == {PAUSED_ANNOTATION: None}
    assert PAUSED_ANNOTATION not in (cluster.get("v1/nodes", node) or {})["metadata"].get(
        "annotations", {}
    )


def test_a_change_with_nothing_to_do_touches_no_label(
    cluster: ControlPlane, operator: Operator, tmp_path: Path
) -> None:
    """A node that already has its layout: the agent reconciles and reports success, and
    its requests (the API server's audit log) never name the operands' labels; the
    operands' pods stay."""
    node = operator.node
    operator.spec.write_text(sim_spec(node, 4))
    labelled_node(cluster, node)
    start(operator)
    wait_until("the operands' pods on the node", lambda: operator.bound() == set(OPERANDS.values()))
    pods = {p["metadata"]["uid"] for p in operator.pods()}
    with running(agent_flags(cluster, tmp_path, node)):
        wait_until("the node reported", lambda: state_of(cluster, node) == "success")
    writes = node_writes(cluster, node)
    assert writes, "the agent wrote its state label"
    assert not [e for e in writes if operand_labels_in(e)]
    assert not [
        e
        for e in writes
        if PAUSED_ANNOTATION
        in ((e.get("requestObject") or {}).get("metadata") or {}).get("annotations", {})
    ]
    assert all(v == "true" for v in operator.labels().values())
    assert {p["metadata"]["uid"] for p in operator.pods()} == pods
    assert operator.vgpus_when_pods_left == []


def test_an_agent_killed_while_the_operands_are_paused_restores_them_when_it_starts(
    cluster: ControlPlane, operator: Operator, tmp_path: Path
) -> None:
    """The agent is killed (SIGKILL) after it paused the operands and before it restored
    them: the labels stay paused. Started again, it restores them before anything else,
    here in plan-only mode, which changes nothing on the host."""
    node = operator.node
    operator.spec.write_text(sim_spec(node, 0))
    labelled_node(cluster, node)
    start(operator)
    wait_until("the operands' pods on the node", lambda: operator.bound() == set(OPERANDS.values()))
    flags = agent_flags(cluster, tmp_path, node)
    # The pods take long to stop: the agent is still waiting for them when it is killed.
    operator.termination = 3600.0
    proc = subprocess.Popen(
        [
            sys.executable, "-c", "from vgpu_state.cli.main import main; main()",
            "agent", "--node", node, "-f", str(flags.config_file), "--mode", "enforce",
            "--kubeconfig", flags.kubeconfig, "--sim", flags.sim_spec,
            "--state-dir", str(flags.state_dir), "--no-kubevirt", "--listen", "",
            "--gpu-operator",
        ],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "agent.log").open("wb"),
    )  # fmt: skip
    try:
        wait_until(
            "the operands paused",
            lambda: set(operator.labels().values()) == {PAUSED},
            timeout=90,
        )
        proc.kill()
        proc.wait(10)
    finally:
        operator.termination = TERMINATION
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    node_obj = cluster.get("v1/nodes", node) or {}
    assert node_obj["metadata"]["annotations"][PAUSED_ANNOTATION] == ",".join(OPERANDS)
    assert set(operator.labels().values()) == {PAUSED}
    assert vgpus_in(operator.spec) == 0, "killed before the change"
    with running(agent_flags(cluster, tmp_path, node, mode="plan-only")):
        wait_until(
            "the operands restored",
            lambda: all(v == "true" for v in operator.labels().values()),
        )
        wait_until("the operands back", lambda: operator.bound() == set(OPERANDS.values()))
    node_obj = cluster.get("v1/nodes", node) or {}
    assert PAUSED_ANNOTATION not in node_obj["metadata"].get("annotations", {})
    assert vgpus_in(operator.spec) == 0, "plan-only changes nothing"


def enforced(cluster: ControlPlane, node: str, token: str) -> None:
    """Wait until the API server enforces the admission policies installed with the
    control plane (it loads them a moment after they are created): a label the agent
    may never write is refused."""
    cluster.refusals_expected = True
    deadline = time.monotonic() + 30
    while True:
        try:
            cluster.request(
                "PATCH", api_path("v1/nodes", node), {"metadata": {"labels": {"probe": "x"}}},
                "application/merge-patch+json", token=token,
            )  # fmt: skip
        except ApiError:
            return
        cluster.request(
            "PATCH", api_path("v1/nodes", node), {"metadata": {"labels": {"probe": None}}},
            "application/merge-patch+json",
        )  # fmt: skip
        assert time.monotonic() < deadline, "the admission policies are not enforced"
        time.sleep(0.5)


@pytest.mark.parametrize(
    ("before", "after", "allowed"),
    [
        ("true", PAUSED, True),
        (PAUSED, "true", True),
        ("true", "false", False),
        ("false", PAUSED, False),
        ("false", "true", False),
        (None, PAUSED, False),
        ("true", None, False),
        (PAUSED, "paused-for-mig-change", False),
    ],
)
def test_the_agent_may_move_the_operands_labels_only_between_true_and_paused(
    cluster: ControlPlane, before: str | None, after: str | None, allowed: bool
) -> None:
    """The admission policy on the agent's own Node: the two labels go from ``true`` to
    ``paused-for-vgpu-change`` and back, nothing else (not added, removed or disabled)."""
    node = "gpu-op-policy"
    labels = {} if before is None else {SANDBOX_DEVICE_PLUGIN_LABEL: before}
    cluster.ensure_node(node, labels)
    token = cluster.agent_token(node)
    enforced(cluster, node, token)
    patch = {"metadata": {"labels": {SANDBOX_DEVICE_PLUGIN_LABEL: after}}}

    def send() -> None:
        cluster.request(
            "PATCH", api_path("v1/nodes", node), patch, "application/merge-patch+json", token=token
        )

    if allowed:
        send()
    else:
        cluster.refusals_expected = True
        with pytest.raises(ApiError) as refused:
            send()
        assert refused.value.status == 422  # a ValidatingAdmissionPolicy's denial
        assert "only from true to paused-for-vgpu-change and back" in str(refused.value)
    value = (cluster.get("v1/nodes", node) or {})["metadata"].get("labels", {})
    assert value.get(SANDBOX_DEVICE_PLUGIN_LABEL) == (after if allowed else before)
    # Another node's, never.
    if allowed:
        cluster.ensure_node("gpu-op-other", {SANDBOX_DEVICE_PLUGIN_LABEL: "true"})
        cluster.refusals_expected = True
        with pytest.raises(ApiError):
            cluster.request(
                "PATCH",
                api_path("v1/nodes", "gpu-op-other"),
                {"metadata": {"labels": {SANDBOX_DEVICE_PLUGIN_LABEL: PAUSED}}},
                "application/merge-patch+json",
                token=token,
            )


def test_the_agent_reads_no_pods_without_the_component(cluster: ControlPlane) -> None:
    """The base install gives the agent no read of pods: only the gpu-operator component's
    Role does, in the operator's namespace."""
    node = "gpu-op-rbac"
    token = cluster.agent_token(node)
    cluster.refusals_expected = True
    with pytest.raises(ApiError) as refused:
        cluster.request("GET", api_path(PODS, None, "kube-system"), token=token)
    assert refused.value.status == 403


def test_operands_that_do_not_leave_fail_the_change_naming_them_and_are_restored(
    cluster: ControlPlane, operator: Operator, tmp_path: Path
) -> None:
    """The operands' pods stay (their containers do not stop): after the timeout the
    pause fails naming the pods, and the labels are back to ``true`` before the error."""
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.gpuoperator import OperandsNotStoppedError, SandboxOperands

    node = operator.node
    operator.spec.write_text(sim_spec(node, 0))
    labelled_node(cluster, node)
    operator.termination = 3600.0
    start(operator)
    wait_until("the operands' pods on the node", lambda: operator.bound() == set(OPERANDS.values()))
    token = cluster.agent_token(node)
    api = KubeApi.connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)))
    operands = SandboxOperands(api, node, OPERATOR_NS, timeout=2.0, poll=0.2)
    with pytest.raises(OperandsNotStoppedError) as failed:
        operands.pause()
    message = str(failed.value)
    assert "sandbox device plugin did not leave node gpu-op-1 within 2 s" in message
    assert "nvidia-sandbox-device-plugin-daemonset-" in message
    assert "nothing was changed" in message
    assert all(v == "true" for v in operator.labels().values())
    node_obj = cluster.get("v1/nodes", node) or {}
    assert PAUSED_ANNOTATION not in node_obj["metadata"].get("annotations", {})


@pytest.mark.parametrize(
    ("labels", "annotation", "patch"),
    [
        # Only labels that are true are paused; absent and false ones are left alone.
        (
            {SANDBOX_DEVICE_PLUGIN_LABEL: "true", SANDBOX_VALIDATOR_LABEL: "false"},
            None,
            {
                "labels": {SANDBOX_DEVICE_PLUGIN_LABEL: PAUSED},
                "annotations": {PAUSED_ANNOTATION: SANDBOX_DEVICE_PLUGIN_LABEL},
            },
        ),
        ({SANDBOX_VALIDATOR_LABEL: "false"}, None, None),
        # Paused by someone else (another manager): not ours to pause or restore.
        ({SANDBOX_DEVICE_PLUGIN_LABEL: "paused-for-mig-change"}, None, None),
    ],
)
def test_the_pause_writes_only_labels_that_are_true(
    labels: dict[str, str], annotation: str | None, patch: dict[str, Any] | None
) -> None:
    from vgpu_state.kube.gpuoperator import pause_patch

    annotations = {} if annotation is None else {PAUSED_ANNOTATION: annotation}
    written = pause_patch(labels, annotations)
    assert written == (None if patch is None else {"metadata": patch})


def test_the_restore_trusts_only_the_two_known_labels_of_the_record() -> None:
    """The annotation is on the Node (anyone who may write the Node may write it): a
    record naming other labels restores none of them, and a long one is cut."""
    from vgpu_state.kube.gpuoperator import restore_patch

    labels = {SANDBOX_VALIDATOR_LABEL: PAUSED, "nvidia.com/gpu.deploy.driver": PAUSED}
    record = f"nvidia.com/gpu.deploy.driver,{SANDBOX_VALIDATOR_LABEL}," + "x" * 5000
    assert restore_patch(labels, {PAUSED_ANNOTATION: record}) == {
        "metadata": {
            "annotations": {PAUSED_ANNOTATION: None},
            "labels": {SANDBOX_VALIDATOR_LABEL: "true"},
        }
    }
    # A recorded label someone set to false meanwhile stays false; the record goes.
    assert restore_patch(
        {SANDBOX_DEVICE_PLUGIN_LABEL: "false"}, {PAUSED_ANNOTATION: SANDBOX_DEVICE_PLUGIN_LABEL}
    ) == {"metadata": {"annotations": {PAUSED_ANNOTATION: None}}}
    assert restore_patch({SANDBOX_DEVICE_PLUGIN_LABEL: PAUSED}, {}) is None


def test_an_agent_stopped_while_waiting_for_the_operands_restores_them_and_changes_nothing(
    cluster: ControlPlane, operator: Operator, tmp_path: Path
) -> None:
    """SIGTERM (``stop``) while the operands' pods are still leaving: the agent does not
    wait out the timeout, restores the labels and exits without changing the host."""
    from vgpu_state.agent.assemble import build

    node = operator.node
    operator.spec.write_text(sim_spec(node, 0))
    labelled_node(cluster, node)
    operator.termination = 3600.0
    start(operator)
    wait_until("the operands' pods on the node", lambda: operator.bound() == set(OPERANDS.values()))
    agent = build(agent_flags(cluster, tmp_path, node))
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_until("the operands paused", lambda: set(operator.labels().values()) == {PAUSED})
    finally:
        agent.stop()
        thread.join(30)
    assert not thread.is_alive(), "the agent kept waiting for the operands after stop"
    assert all(v == "true" for v in operator.labels().values())
    node_obj = cluster.get("v1/nodes", node) or {}
    assert PAUSED_ANNOTATION not in node_obj["metadata"].get("annotations", {})
    assert vgpus_in(operator.spec) == 0
