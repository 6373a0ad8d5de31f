"""Changing a layout under a running VM, end to end: two simulated A2 nodes, each with its
own agent (``reconcile_once`` with the agent's cluster port, its ServiceAccount token bound
to a pod on its node), the controller as its own ServiceAccount, on the real kube-apiserver
with KubeVirt's CRDs and the shipped RBAC and admission policies.

node-a's A2 carries two A2-4Q, one held by the VM ``vms/win-7``; its layout becomes 8 ×
A2-2Q under ``in-use: evacuate``. node-b's A2 carries one free A2-4Q. KubeVirt does not run
here: :func:`stand_in_migrate` is a stand-in for KubeVirt's migration controller written for
this test. It completes a migration by moving the VM's holder from one simulated node to the
other (the kubelet's pod-resources, as each agent reads them) and setting the VMI's
``status.nodeName``. A stand-in scheduler tries to place a new VM on node-a's withheld
capacity meanwhile.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realcluster import ControlPlane
from tests.test_evacuation_real import NS, VMIS, migrations, place_vm
from vgpu_state.agent.cluster import AgentCluster, ClusterSink
from vgpu_state.catalog import default_catalog
from vgpu_state.config import StaticConfigSource, load_text
from vgpu_state.controller.run import Controller, ControllerSettings
from vgpu_state.kube.api import KubeApi
from vgpu_state.model.inuse import InUse
from vgpu_state.reconcile import Mode, Ports, Settings, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.testing import RecordingDevicePlugin

CATALOG = default_catalog()
HELD = "6b0c2a3e-0a11-4d8e-9a3b-1f0e2d3c4b5a"
FREE_A = "7c1d3b4f-1b22-4e9f-8b4c-2a1f3e4d5c6b"
FREE_B = "8d2e4c5a-2c33-4fa0-9c5d-3b2a4f5e6d7c"
HOLDER = "pod vms/virt-launcher-win-7-x7k2p (VM vms/win-7)"
LAYOUTS = """version: v1
policy:
  in-use: evacuate
vgpu-configs:
  a2-2q:
    - devices: all
      vgpu-devices: {A2-2Q: 8}
  a2-4q:
    - devices: all
      vgpu-devices: {A2-4Q: 1}
"""
SPEC = """node: {node}
driver:
  flavour: all
sriov-manage: true
gpus:
  - address: "0000:08:00.0"
    model: A2
    layout: mdev
    sriov: true
    numa-node: 0
    iommu-group: 38
    vf-iommu-group-base: 90
    vgpus:
{vgpus}
"""


def spec(tmp: Path, node: str, uuids: list[str]) -> Path:
    path = tmp / f"{node}.yaml"
    lines = "".join(f"      - {{type: A2-4Q, uuid: {u}, vf: {i}}}\n" for i, u in enumerate(uuids))
    path.write_text(SPEC.format(node=node, vgpus=lines.rstrip("\n")))
    return path


class Agent:
    """One simulated node's agent: its host, its ServiceAccount, what its pods hold."""

    def __init__(self, cluster: ControlPlane, node: str, config: str, host: Path, base: Path):
        self.node, self.config = node, config
        self.host = SimHost(host)
        token = cluster.agent_token(node)
        self.api = KubeApi.connect(
            str(cluster.write_kubeconfig(base / f"{node}-kubeconfig", token=token))
        )
        self.held: dict[str, str] = {}
        self.cluster = AgentCluster(
            self.api, node, pod_resources=None, in_use_source=lambda: InUse(dict(self.held))
        )
        self.cluster.set_mode("enforce")
        self.plugin = RecordingDevicePlugin()
        self.sink = ClusterSink(self.cluster, self.plugin)
        self.source = StaticConfigSource(load_text(LAYOUTS, "layouts.yaml", catalog=CATALOG))

    def reconcile(self) -> None:
        ports = Ports(self.host, self.cluster, self.source, self.sink,
                      self.sink.dra_channel(None), processes=self.cluster)  # fmt: skip
        reconcile_once(ports, Settings(catalog=CATALOG), mode=Mode.APPLY,
                       config_name=self.config, skip_blocked=True)  # fmt: skip

    def vgpus(self) -> dict[str, str]:
        """uuid → type of the host's live vGPUs."""
        return {v.key: str(v.type_name) for g in self.host.scan().gpus for v in g.vgpus}

    def offered(self, type_name: str) -> list[str]:
        """What the device plugin offers the kubelet of ``type_name``: live, not withheld,
        not held."""
        withheld = self.plugin.withheld[-1] if self.plugin.withheld else frozenset()
        return sorted(
            key
            for key, t in self.vgpus().items()
            if t == type_name and key not in withheld and key not in self.held
        )

    def close(self) -> None:
        self.host.close()
        self.api.close()


def place(agents: dict[str, Agent], node: str, type_name: str) -> str | None:
    """A stand-in scheduler: a device of ``type_name`` the plugin of ``node`` offers, or
    ``None`` (the pod would stay Pending)."""
    offered = agents[node].offered(type_name)
    return offered[0] if offered else None


def stand_in_migrate(cluster: ControlPlane, agents: dict[str, Agent]) -> int:
    """The stand-in for KubeVirt's migration controller: every pending migration completes,
    the VM's holder moving to a device the target's plugin offers."""
    done = 0
    for m in migrations(cluster):
        if (m.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        vmi = m["spec"]["vmiName"]
        source = agents[m["metadata"]["labels"]["vgpu-state.io/node"]]
        target = agents[m["spec"]["addedNodeSelector"]["kubernetes.io/hostname"]]
        device = place(agents, target.node, "A2-4Q")
        assert device is not None, "KubeVirt would find no vGPU on the target"
        holder = next(h for h in source.held.values() if f"(VM {NS}/{vmi})" in h)
        target.held[device] = holder
        source.held = {k: h for k, h in source.held.items() if h != holder}
        cluster.write(VMIS, vmi, {"status": {"nodeName": target.node}}, NS)
        cluster.request(
            "PATCH",
            f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstancemigrations/"
            f"{m['metadata']['name']}/status",
            {"status": {"phase": "Succeeded"}},
            "application/merge-patch+json",
        )
        done += 1
    return done


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="evac-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_held_vgpu_moves_off_then_the_switch_runs_and_nothing_lands_on_withheld_capacity(
    kubevirt_vms: ControlPlane, base: Path, tmp_path: Path
) -> None:
    cluster = kubevirt_vms
    cluster.write("kubevirt.io/v1/kubevirts", "kubevirt", {"spec": {}}, "kubevirt")
    cluster.ensure_node("node-a", {"nvidia.com/vgpu.config": "a2-2q"})
    cluster.ensure_node("node-b", {"nvidia.com/vgpu.config": "a2-4q"})
    agents = {
        "node-a": Agent(cluster, "node-a", "a2-2q", spec(tmp_path, "node-a", [HELD, FREE_A]),
                        base),
        "node-b": Agent(cluster, "node-b", "a2-4q", spec(tmp_path, "node-b", [FREE_B]), base),
    }  # fmt: skip
    a, b = agents["node-a"], agents["node-b"]
    a.held[HELD] = HOLDER
    place_vm(cluster, "win-7", "node-a")
    api = KubeApi.connect(str(cluster.controller_kubeconfig(base / "controller")))
    source = StaticConfigSource(load_text(LAYOUTS, "layouts.yaml", catalog=CATALOG))
    controller = Controller(api, ControllerSettings(identity="controller-0", layouts=source,
                                                    catalog=CATALOG))  # fmt: skip

    def held_never_destroyed() -> None:
        for agent in agents.values():
            for key in agent.held:
                assert key in agent.vgpus(), f"{key} destroyed on {agent.node} while held"

    try:
        for agent in agents.values():
            agent.reconcile()
        held_never_destroyed()
        # The switch waits for win-7; node-a's free A2-4Q is withheld: a VM placed on
        # node-a finds nothing, while node-b still offers its free one.
        assert set(a.vgpus()) == {HELD, FREE_A}
        gpu = cluster.get("vgpu-state.io/v1alpha1/vgpunodestates", "node-a")["status"]["gpus"][0]
        assert gpu["switch"]["state"] == "deferred" and gpu["switch"]["policy"] == "evacuate"
        assert {v["id"]: v.get("vm") for v in gpu["vgpus"]} == {HELD: "vms/win-7", FREE_A: None}
        assert place(agents, "node-a", "A2-4Q") is None
        assert place(agents, "node-b", "A2-4Q") == FREE_B

        assert controller.run_once() is not None
        (m,) = migrations(cluster)
        assert m["spec"]["addedNodeSelector"] == {"kubernetes.io/hostname": "node-b"}
        # Before KubeVirt moves it: node-a keeps withholding, the held vGPU lives.
        a.reconcile()
        held_never_destroyed()
        assert place(agents, "node-a", "A2-4Q") is None

        assert stand_in_migrate(cluster, agents) == 1
        assert b.held == {FREE_B: HOLDER} and a.held == {}
        for agent in agents.values():
            agent.reconcile()
        held_never_destroyed()
        controller.run_once()

        # node-a switched: 8 × A2-2Q, offered now; win-7 runs on node-b's A2-4Q.
        assert sorted(a.vgpus().values()) == ["A2-2Q"] * 8
        assert len(a.offered("A2-2Q")) == 8
        assert set(b.vgpus()) == {FREE_B}
        assert cluster.get(VMIS, "win-7", NS)["status"]["nodeName"] == "node-b"
        assert len(migrations(cluster)) == 1
        a_status = cluster.get("vgpu-state.io/v1alpha1/vgpunodestates", "node-a")["status"]
        assert "switch" not in a_status["gpus"][0]
    finally:
        for agent in agents.values():
            agent.close()
        api.close()
