"""plan and apply with --kubeconfig: a simulated node of a cluster.

The cluster is the harness's real kube-apiserver + etcd (the ``cluster`` fixture of
``tests/conftest.py``, ``tests/realcluster.py``, with ``deploy/`` and the KubeVirt
CRD installed); the node is the simulator; the kubelet is a gRPC server on a unix
socket when a test needs one. ``plan`` and ``apply`` run as docs/cluster.md shows
them (``--kubeconfig ~/.kube/config``): with a person's kubeconfig, a cluster user's
client certificate. ``vgpu-state controller --once`` runs as the controller's
Deployment does, with its ServiceAccount's token under the shipped RBAC.

No test here needs a fault only the kmock emulator can make: the unreachable server
is a port where nothing listens.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.apiserver import KUBEVIRT, NODES, NODESTATES, put_kubevirt
from tests.kubelet_podresources import PodDevices, PodResourcesKubelet, serving
from tests.realcluster import CONTROLLER_USER, WRITE_VERBS, ControlPlane, free_port
from vgpu_state.cli.main import cli
from vgpu_state.kube.fencing import WRITER_TERM_ANNOTATION
from vgpu_state.kube.kubevirt import OWNERSHIP_ANNOTATION
from vgpu_state.kube.node import STATE_LABEL

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "examples" / "mixed-node.yaml"
NODE = "gpu-node-1"
FOREIGN = {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q"}
HELD_T4 = "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"


@pytest.fixture
def node_cluster(cluster: ControlPlane, tmp_path: Path) -> tuple[ControlPlane, Path, Path]:
    """The real API server with the node (labelled for the ``mixed`` config) and a KubeVirt
    CR; a cluster user's kubeconfig; a copy of the simulated node."""
    cluster.put(
        NODES,
        NODE,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"labels": {"nvidia.com/vgpu.config": "mixed", "zone": "a"}},
        },
    )
    put_kubevirt(cluster, permitted=[FOREIGN])
    spec = tmp_path / "node.yaml"
    shutil.copy(REPO / "configs" / "sim" / "mixed.yaml", spec)
    return cluster, cluster.write_kubeconfig(tmp_path / "kubeconfig", identity="user"), spec


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def _controller_args(kubeconfig: Path) -> list[str | Path]:
    """``controller --once`` with the node's layouts (they bound what it may permit)."""
    return ["--kubeconfig", kubeconfig, "--once", "--identity", "c-1", "-f", CONFIG]


def _common(kubeconfig: Path, spec: Path) -> list[str | Path]:
    return ["--node", NODE, "--kubeconfig", kubeconfig, "--sim", spec, "-f", CONFIG]


def test_apply_creates_the_layout_and_updates_the_cluster(
    node_cluster: tuple[ControlPlane, Path, Path], tmp_path: Path
) -> None:
    api, kubeconfig, spec = node_cluster
    controller_kubeconfig = api.controller_kubeconfig(tmp_path / "controller")
    result = run("apply", *_common(kubeconfig, spec), "--auto-approve")
    assert result.exit_code == 0, result.output

    node = api.get(NODES, NODE)
    assert node is not None
    assert node["metadata"]["labels"][STATE_LABEL] == "success"
    assert node["metadata"]["labels"]["zone"] == "a"

    # The node never writes the KubeVirt CR: the controller does, from the node's status.
    cr = api.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert cr["spec"]["configuration"]["permittedHostDevices"] == {"mediatedDevices": [FOREIGN]}
    controller = run("controller", *_controller_args(controller_kubeconfig))
    assert controller.exit_code == 0, controller.output
    assert "+ kubevirt[kubevirt/kubevirt].mediatedDevices[GRID T4-4Q]" in controller.output

    cr = api.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    mdevs = cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    pcis = cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert mdevs[0] == FOREIGN  # untouched, still first
    added = {e["resourceName"] for e in mdevs[1:]} | {e["resourceName"] for e in pcis}
    # Exactly the types live on the node after the apply.
    assert added == {
        "nvidia.com/NVIDIA_A2-4C",
        "nvidia.com/NVIDIA_A2-4Q",
        "nvidia.com/GRID_T4-4Q",
        "nvidia.com/NVIDIA_L40S-12Q",
        "nvidia.com/NVIDIA_L40S-12C",
    }
    assert all(e["externalResourceProvider"] is True for e in [*mdevs[1:], *pcis])
    assert sorted(json.loads(cr["metadata"]["annotations"][OWNERSHIP_ANNOTATION])) == sorted(added)

    # The VGPUNodeState says what a scan of the node says.
    scan = json.loads(run("scan", "--sim", spec, "-o", "json").output)
    state = api.get(NODESTATES, NODE)
    assert state is not None
    status = state["status"]
    assert status["state"] == "success"
    assert status["selectedConfig"]["name"] == "mixed"
    assert status["selectedConfig"]["source"] == "label"
    assert [
        (g["address"], sorted((v["id"], v["type"]) for v in g["vgpus"])) for g in status["gpus"]
    ] == [
        (
            g["address"],
            sorted((v["uuid"] or v["parent"], v["type_sysfs_name"]) for v in g["vgpus"]),
        )
        for g in scan["gpus"]
    ]
    assert status["vgpuCount"] == sum(len(g["vgpus"]) for g in scan["gpus"])
    assert {c["type"]: c["status"] for c in status["conditions"]}["Synced"] == "True"
    assert status["lastApply"]["result"] == "success"
    # A second pass finds nothing to change. Being another process, it leads in a new term
    # and writes the CR once: its term's token, nothing else.
    mark = api.audit_mark()
    again = run("controller", *_controller_args(controller_kubeconfig))
    assert "KubeVirt CR kubevirt/kubevirt: no changes" in again.output
    cr_writes = [
        f"{e['verb']} {e['requestURI']}"
        for e in api.audit(mark, CONTROLLER_USER)
        if "/kubevirts" in e["requestURI"] and e["verb"] in WRITE_VERBS
    ]
    assert len(cr_writes) == 1
    after = api.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert after is not None and after["spec"] == cr["spec"]
    terms = [c["metadata"]["annotations"][WRITER_TERM_ANNOTATION] for c in (cr, after)]
    assert [t.split("/")[:2] for t in terms] == [["0", "c-1"], ["1", "c-1"]]


def test_the_controller_without_layouts_changes_nothing_and_says_so(
    node_cluster: tuple[ControlPlane, Path, Path], tmp_path: Path
) -> None:
    api, kubeconfig, spec = node_cluster
    assert run("apply", *_common(kubeconfig, spec), "--auto-approve").exit_code == 0
    controller_kubeconfig = api.controller_kubeconfig(tmp_path / "controller")
    args = _controller_args(controller_kubeconfig)
    unbounded = run("controller", *args[: args.index("-f")], "-f", "")
    assert unbounded.exit_code == 0, unbounded.output
    assert "no KubeVirt CR entry is added or removed" in unbounded.output
    cr = api.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    assert cr["spec"]["configuration"]["permittedHostDevices"] == {"mediatedDevices": [FOREIGN]}


def test_plan_shows_the_kubevirt_changes_and_a_label_change_changes_it(
    node_cluster: tuple[ControlPlane, Path, Path], tmp_path: Path
) -> None:
    api, kubeconfig, spec = node_cluster
    text = run("plan", *_common(kubeconfig, spec))
    assert text.exit_code == 0, text.output
    assert "+ kubevirt[kubevirt/kubevirt].mediatedDevices[GRID T4-4Q] will be added" in text.output
    assert "+ kubevirt[kubevirt/kubevirt].pciHostDevices[nvidia.com/NVIDIA_L40S-12C]" in text.output
    assert "cluster change(s)" in text.output
    # The capacity section says which resources the KubeVirt CR gains.
    assert "  nvidia.com/GRID_T4-4Q  " in text.output
    t4 = next(line for line in text.output.splitlines() if "nvidia.com/GRID_T4-4Q  " in line)
    assert t4.split()[1:5] == ["0", "→", "4", "(+4)"]
    assert t4.endswith("[added to the KubeVirt CR]")
    as_json = json.loads(run("plan", *_common(kubeconfig, spec), "-o", "json").output)
    assert as_json["format_version"] == "1.6"
    kubevirt = {c["resource"]: c["kubevirt"] for c in as_json["capacity"]}
    assert kubevirt["nvidia.com/GRID_T4-4Q"] == "add"
    assert {a["resource"] for a in as_json["cluster_actions"] if a["op"] == "add"} == {
        r for r, op in kubevirt.items() if op == "add"
    }
    addresses = [a["address"] for a in as_json["cluster_actions"]]
    assert "kubevirt[kubevirt/kubevirt].mediatedDevices[NVIDIA A2-4Q]" in addresses
    assert as_json["summary"]["cluster"] == len(addresses)

    # Relabel the Node: the plan follows the live label.
    other = tmp_path / "other.yaml"
    other.write_text(
        CONFIG.read_text() + '  t4-only:\n    - devices: all\n      device-filter: "0x1EB810DE"\n'
        "      vgpu-devices:\n        T4-8C: 2\n"
    )
    node = api.get(NODES, NODE)
    assert node is not None
    node["metadata"]["labels"]["nvidia.com/vgpu.config"] = "t4-only"
    api.put(NODES, NODE, node)
    relabelled = run("plan", "--node", NODE, "--kubeconfig", kubeconfig, "--sim", spec, "-f", other)
    assert relabelled.exit_code == 0, relabelled.output
    assert 'configuration "t4-only"' in relabelled.output
    assert "T4-4Q" not in relabelled.output
    # Nothing was written by planning.
    assert STATE_LABEL not in (api.get(NODES, NODE) or {})["metadata"]["labels"]


def test_an_unreachable_api_server_writes_nothing_to_the_host(
    node_cluster: tuple[ControlPlane, Path, Path], tmp_path: Path
) -> None:
    """A kubeconfig of the cluster (its CA, a user's certificate) whose server address is a
    port on 127.0.0.1 where nothing listens: the connection is refused."""
    api, _, spec = node_cluster
    before = spec.read_bytes()
    dead = api.write_kubeconfig(
        tmp_path / "dead", server=f"https://127.0.0.1:{free_port()}", identity="user"
    )
    result = run("apply", *_common(dead, spec), "--auto-approve")
    assert result.exit_code == 1
    assert "unreachable" in result.output
    assert "Traceback" not in result.output
    assert spec.read_bytes() == before


def test_a_config_error_writes_nothing_to_the_host_and_fails_the_state(
    node_cluster: tuple[ControlPlane, Path, Path], tmp_path: Path
) -> None:
    api, kubeconfig, spec = node_cluster
    before = spec.read_bytes()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: v1\nvgpu-configs:\n  mixed:\n"
        "    - devices: all\n      vgpu-devices: {A2-4Q: many}\n"
    )
    result = run(
        "apply",
        "--node",
        NODE,
        "--kubeconfig",
        kubeconfig,
        "--sim",
        spec,
        "-f",
        bad,
        "--auto-approve",
    )
    assert result.exit_code == 1
    assert "bad.yaml:5:" in result.output
    assert spec.read_bytes() == before
    node = api.get(NODES, NODE)
    assert node is not None and node["metadata"]["labels"][STATE_LABEL] == "failed"


def test_a_vgpu_a_pod_holds_is_not_destroyed_and_the_plan_names_the_pod(
    node_cluster: tuple[ControlPlane, Path, Path],
) -> None:
    _, kubeconfig, spec = node_cluster
    sock = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp")) / "kubelet.sock"
    kubelet = PodResourcesKubelet(
        [
            PodDevices(
                "vms", "virt-launcher-cad-7xk2p", "compute", "nvidia.com/GRID_T4-8C", [HELD_T4]
            )
        ]
    )
    with serving(sock, kubelet):
        plan = run("plan", *_common(kubeconfig, spec), "--pod-resources", sock)
        assert plan.exit_code == 0, plan.output
        assert f"vgpu[{HELD_T4}] T4-8C cannot be destroyed" in plan.output
        assert "pod vms/virt-launcher-cad-7xk2p (VM vms/cad)" in plan.output
        apply = run(
            "apply",
            *_common(kubeconfig, spec),
            "--pod-resources",
            sock,
            "--auto-approve",
            "--skip-blocked",
        )
    assert kubelet.calls == 2
    # The rest was applied; the held vGPU is still there, so the node is not converged.
    assert apply.exit_code == 1, apply.output
    assert HELD_T4 in spec.read_text()
    assert spec.read_text().count("A2-4Q") == 3


def test_without_the_kubelet_plan_warns_and_apply_refuses(
    node_cluster: tuple[ControlPlane, Path, Path], tmp_path: Path
) -> None:
    _, kubeconfig, spec = node_cluster
    missing = tmp_path / "no-kubelet.sock"
    plan = run("plan", *_common(kubeconfig, spec), "--pod-resources", missing)
    assert plan.exit_code == 0, plan.output
    assert "which vGPUs pods hold is unknown" in plan.output
    before = spec.read_bytes()
    apply = run("apply", *_common(kubeconfig, spec), "--pod-resources", missing, "--auto-approve")
    assert apply.exit_code == 1
    assert "no such socket" in apply.output
    assert spec.read_bytes() == before


def test_kubevirt_managing_mdevs_blocks_the_apply(
    node_cluster: tuple[ControlPlane, Path, Path],
) -> None:
    api, kubeconfig, spec = node_cluster
    cr: dict[str, Any] | None = api.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    cr["spec"]["configuration"]["developerConfiguration"]["featureGates"] = []
    cr["spec"]["configuration"]["mediatedDevicesConfiguration"] = {
        "mediatedDeviceTypes": ["nvidia-745"]
    }
    api.put(KUBEVIRT, "kubevirt", cr, namespace="kubevirt")
    plan = run("plan", *_common(kubeconfig, spec))
    assert "! kubevirt[kubevirt/kubevirt] blocks vGPU changes on this node" in plan.output
    assert "mediatedDevicesConfiguration.enabled: false" in plan.output
    before = spec.read_bytes()
    apply = run("apply", *_common(kubeconfig, spec), "--auto-approve")
    assert apply.exit_code == 1
    assert spec.read_bytes() == before


def test_a_foreign_pci_entry_over_the_nodes_vgpu_vfs_blocks_the_apply(
    node_cluster: tuple[ControlPlane, Path, Path],
) -> None:
    """A ``pciHostDevices`` entry vgpu-state does not own, without
    ``externalResourceProvider``, selecting the node's L40S VFs (``10DE:26B9``): KubeVirt
    1.9+ would advertise those VFs itself, under a second resource name."""
    api, kubeconfig, spec = node_cluster
    cr: dict[str, Any] | None = api.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    theirs = {"pciVendorSelector": "10de:26b9", "resourceName": "nvidia.com/L40S"}
    cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] = [theirs]
    api.put(KUBEVIRT, "kubevirt", cr, namespace="kubevirt")
    plan = run("plan", *_common(kubeconfig, spec), "-o", "json")
    assert plan.exit_code == 0, plan.output
    blocked = [
        b for b in json.loads(plan.output)["blocked"] if b["code"] == "KubeVirtAdvertisesVFs"
    ]
    assert len(blocked) == 1 and "externalResourceProvider: true" in blocked[0]["reason"]
    before = spec.read_bytes()
    apply = run("apply", *_common(kubeconfig, spec), "--auto-approve")
    assert apply.exit_code == 1
    assert spec.read_bytes() == before
    # Marked as provided by an external plugin: KubeVirt leaves the VFs alone.
    cr = api.get(KUBEVIRT, "kubevirt", "kubevirt")
    assert cr is not None
    cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] = [
        theirs | {"externalResourceProvider": True}
    ]
    api.put(KUBEVIRT, "kubevirt", cr, namespace="kubevirt")
    plan = run("plan", *_common(kubeconfig, spec), "-o", "json")
    assert "KubeVirtAdvertisesVFs" not in plan.output


def test_holders_on_standard_input_are_read_once_and_kept(
    node_cluster: tuple[ControlPlane, Path, Path],
) -> None:
    """``--in-use-file -`` with a cluster: the holders given on standard input block."""
    _, kubeconfig, spec = node_cluster
    plan = CliRunner().invoke(
        cli,
        ["plan", *map(str, _common(kubeconfig, spec)), "--in-use-file", "-"],
        input=f"{HELD_T4} vm lab/cad-from-stdin\n",
    )
    assert plan.exit_code == 0, plan.output
    assert f"vgpu[{HELD_T4}] T4-8C cannot be destroyed" in plan.output
    assert "vm lab/cad-from-stdin" in plan.output
