"""`vgpu-state doctor` as an operator runs it: can this host run vGPUs, and if not, why.

With ``--kubeconfig`` the node's labels and what pods hold come from a cluster: the
harness's real kube-apiserver + etcd (``cluster`` of ``tests/conftest.py``, with
``deploy/`` and the KubeVirt CRD installed), reached as a person runs ``doctor``
(docs/doctor.md: the cluster options of docs/cluster.md, ``--kubeconfig
~/.kube/config``): a cluster user's kubeconfig, whose requests the server's audit
log records. The kubelet is a pod-resources gRPC stand-in on a unix socket.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.apiserver import KUBEVIRT, NODES, NODESTATES, put_kubevirt
from tests.kubelet_podresources import PodDevices, PodResourcesKubelet, serving
from tests.realcluster import USER, ControlPlane
from vgpu_state.catalog import default_catalog
from vgpu_state.cli.main import cli
from vgpu_state.sim.dirtree import materialize
from vgpu_state.sim.driver_model import SimDriver
from vgpu_state.sim.spec import parse_spec
from vgpu_state.sim.tree import render

REPO = Path(__file__).resolve().parent.parent
CATALOG = default_catalog()


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def spec(tmp_path: Path, text: str, name: str = "node.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def sim_copy(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    shutil.copy(REPO / "configs" / "sim" / name, path)
    return path


def doctor_json(*args: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = run("doctor", *args, "-o", "json")
    return code, json.loads(out)


def checks(report: dict[str, Any], address: str) -> dict[str, list[dict[str, str]]]:
    """The checks of one GPU, by id (a GPU may have several checks of one id)."""
    (gpu,) = [g for g in report["gpus"] if g["address"] == address]
    found: dict[str, list[dict[str, str]]] = {}
    for c in gpu["checks"]:
        found.setdefault(c["id"], []).append(c)
    return found


def status(report: dict[str, Any], address: str, check: str) -> str:
    (only,) = checks(report, address)[check]
    return only["status"]


def test_a_healthy_mdev_host_passes_every_check_in_plain_words(tmp_path: Path) -> None:
    node = sim_copy(tmp_path, "a2-host.yaml")
    code, out, _ = run("doctor", "--sim", str(node))
    assert code == 0
    assert "GPU 0 0000:08:00.0 A2: ok" in out
    assert "[ok  ] driver: bound to nvidia" in out
    assert "mdev types on its SR-IOV VFs" in out
    assert "SR-IOV on: 16/16 VFs enabled" in out
    assert "IOMMU group 38" in out
    assert "Q (virtual workstation), B (virtual PC), A (virtual apps), C (compute)" in out
    # What sysfs cannot show is said to be unknown, not guessed.
    assert "unknown: GSP firmware and open kernel modules: not visible in sysfs" in out
    assert out.rstrip().endswith("this host can run vGPUs.")
    assert "FAIL" not in out and "WARN" not in out


def test_a2_with_sriov_off_says_vfs_are_needed_and_how_they_get_enabled(tmp_path: Path) -> None:
    node = spec(
        tmp_path,
        'node: n\ngpus:\n  - {address: "0000:08:00.0", model: A2, sriov: false}\n',
    )
    code, report = doctor_json("--sim", str(node))
    assert code == 0  # warnings only: apply enables the VFs with the simulated sriov-manage
    a2 = checks(report, "0000:08:00.0")
    assert a2["sriov"][0]["status"] == "ok"
    assert "SR-IOV off: 0/16 VFs enabled" in a2["sriov"][0]["message"]
    assert "sriov-manage" in a2["sriov"][0]["message"]
    assert a2["interface"][0]["status"] == "warn"
    assert "VFs, which are off" in a2["interface"][0]["message"]
    assert a2["series"][0]["status"] == "warn"
    assert "unknown" in a2["series"][0]["message"]
    assert report["status"] == "warn"

    # Without sriov-manage, apply would write sriov_numvfs, which the driver refuses.
    bare = spec(
        tmp_path,
        'node: n\nsriov-manage: false\ngpus:\n  - {address: "0000:08:00.0", model: A2, '
        "sriov: false}\n",
        "bare.yaml",
    )
    code, report = doctor_json("--sim", str(bare))
    (sriov,) = checks(report, "0000:08:00.0")["sriov"]
    assert code == 0 and sriov["status"] == "warn"
    assert "writing sriov_numvfs" in sriov["message"] and "sriov-manage" in sriov["action"]


def test_sriov_manage_that_does_not_exist_fails_on_a_real_sysfs(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    text = 'node: n\ngpus:\n  - {address: "0000:08:00.0", model: A2, sriov: false}\n'
    materialize(render(SimDriver(parse_spec(text, catalog=CATALOG), catalog=CATALOG)), str(root))
    missing = str(tmp_path / "no-such-sriov-manage")
    code, out, _ = run("doctor", "--sysfs-root", str(root), "--sriov-manage", missing)
    assert code == 1
    assert "[FAIL] sriov: SR-IOV off: 0/16 VFs enabled" in out
    assert f"{missing} is not installed or not executable" in out
    assert "→ pass --sriov-manage PATH" in out

    tool = tmp_path / "sriov-manage"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    code, out, _ = run("doctor", "--sysfs-root", str(root), "--sriov-manage", str(tool))
    assert code == 0
    assert "[ok  ] sriov: SR-IOV off: 0/16 VFs enabled; vGPUs on this GPU need them" in out


def test_doctor_says_which_way_sriov_is_switched(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    text = 'node: n\ngpus:\n  - {address: "0000:08:00.0", model: A2}\n'  # VFs on already
    materialize(render(SimDriver(parse_spec(text, catalog=CATALOG), catalog=CATALOG)), str(root))
    tool = tmp_path / "sriov-manage"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    code, out, _ = run("doctor", "--sysfs-root", str(root), "--sriov-manage", str(tool))
    assert code == 0 and f"[ok  ] sriov-path: SR-IOV is turned on and off with {tool}" in out
    code, out, _ = run("doctor", "--sysfs-root", str(root), "--sriov-manage", "")
    assert code == 0
    assert "[WARN] sriov-path: SR-IOV is turned on by writing sriov_numvfs" in out
    missing = tmp_path / "no-such-tool"
    code, out, _ = run("doctor", "--sysfs-root", str(root), "--sriov-manage", str(missing))
    assert f"[WARN] sriov-path: SR-IOV would be turned on with {missing}, which is not" in out
    code, report = doctor_json("--sim", str(sim_copy(tmp_path, "a2-host.yaml")))
    (path,) = [c for c in report["checks"] if c["id"] == "sriov-path"]
    assert path["status"] == "ok" and "sriov-manage (simulated)" in path["message"]
    # A node without SR-IOV capable GPUs has no such check.
    code, report = doctor_json("--sim", str(sim_copy(tmp_path, "t4-pair.yaml")))
    assert not [c for c in report["checks"] if c["id"] == "sriov-path"]


def test_l40s_vendor_vfio_host_graphics_flavour(tmp_path: Path) -> None:
    node = sim_copy(tmp_path, "l40s-pair.yaml")
    code, report = doctor_json("--sim", str(node))
    assert code == 0 and report["status"] == "ok"
    for address in ("0000:26:00.0", "0000:a1:00.0"):
        c = checks(report, address)
        assert "vendor-specific VFIO" in c["interface"][0]["message"]
        assert c["sriov"][0]["message"] == "SR-IOV on: 32/32 VFs enabled"
    # The empty GPU's list is complete: graphics only, no compute types.
    series = checks(report, "0000:a1:00.0")["series"][0]["message"]
    assert "graphics only: no C (compute) types" in series
    # The GPU holding vGPUs lists only what is creatable now: no claim about what is missing.
    partial = checks(report, "0000:26:00.0")["series"][0]["message"]
    assert "from the types creatable now" in partial and "graphics only" not in partial


def test_t4_mdevs_on_the_pf(tmp_path: Path) -> None:
    node = sim_copy(tmp_path, "t4-pair.yaml")
    code, out, _ = run("doctor", "--sim", str(node))
    assert code == 0
    assert out.count("mdev: vGPU types are offered as mdev types on the GPU itself (PF)") == 2
    assert out.count("not SR-IOV capable (no sriov_totalvfs)") == 2


def test_passthrough_gpu_and_compute_only_driver(tmp_path: Path) -> None:
    node = spec(
        tmp_path,
        "node: n\ndriver: {flavour: compute}\ngpus:\n"
        '  - {address: "0000:08:00.0", model: A2}\n'
        '  - {address: "0000:3b:00.0", model: T4, driver: vfio-pci}\n',
    )
    code, out, _ = run("doctor", "--sim", str(node))
    assert code == 1
    assert "GPU 1 0000:3b:00.0 Tesla T4: fail" in out
    assert "[FAIL] driver: bound to vfio-pci: the GPU is set up for whole-GPU passthrough" in out
    assert "[FAIL] interface: no vGPU types offered" in out
    assert "a GPU in passthrough mode" in out
    assert "GPU 0 0000:08:00.0 A2: ok" in out
    assert "C (compute): compute only: no Q/B/A (graphics) types" in out
    assert "this host cannot run vGPUs as it is" in out

    code, report = doctor_json("--sim", str(node))
    assert code == 1 and report["status"] == "fail"
    assert status(report, "0000:3b:00.0", "driver") == "fail"
    assert report["summary"]["fail"] == 2


def test_unknown_device_no_iommu_and_no_driver_on_a_real_sysfs(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    text = (
        'node: n\ngpus:\n  - {address: "0000:3b:00.0", model: T4}\n'
        '  - {address: "0000:af:00.0", model: T4}\n'
    )
    materialize(render(SimDriver(parse_spec(text, catalog=CATALOG), catalog=CATALOG)), str(root))
    first = root / "bus/pci/devices/0000:3b:00.0"
    (first / "device").write_text("0x1234\n")
    os.unlink(first / "iommu_group")
    os.unlink(root / "bus/pci/devices/0000:af:00.0/driver")
    code, report = doctor_json("--sysfs-root", str(root))
    assert code == 1
    c = checks(report, "0000:3b:00.0")
    assert c["catalog"][0]["status"] == "warn"
    assert "unknown GPU (device 0x1234" in c["catalog"][0]["message"]
    assert c["iommu"][0]["status"] == "fail" and "IOMMU" in c["iommu"][0]["message"]
    assert "intel_iommu=on" in c["iommu"][0]["action"]
    # The catalog miss is said once, not again as a sysfs problem.
    assert "sysfs" not in c
    d = checks(report, "0000:af:00.0")
    assert d["driver"][0]["status"] == "fail"
    assert "not bound to any driver" in d["driver"][0]["message"]
    assert d["interface"][0]["status"] == "fail"
    assert report["gpus"][0]["model"] is None and report["gpus"][0]["device_id"] == "0x1234"


def test_json_shape_is_stable(tmp_path: Path) -> None:
    node = sim_copy(tmp_path, "mixed.yaml")
    code, report = doctor_json("--sim", str(node))
    assert code == 0
    assert sorted(report) == [
        "checks",
        "gpus",
        "node",
        "status",
        "summary",
        "sysfs_root",
        "unknown",
    ]
    assert sorted(report["summary"]) == ["fail", "ok", "warn"]
    for gpu in report["gpus"]:
        assert sorted(gpu) == ["address", "checks", "device_id", "index", "model", "status"]
        assert [c["id"] for c in gpu["checks"]][:6] == [
            "catalog",
            "driver",
            "interface",
            "sriov",
            "iommu",
            "series",
        ]
        for c in gpu["checks"]:
            assert sorted(c) == ["action", "id", "message", "status"]
            assert c["status"] in ("ok", "warn", "fail")
    assert report["unknown"] == [{"id": "gsp", "message": report["unknown"][0]["message"]}]


def test_config_that_fits_and_one_that_is_blocked(tmp_path: Path) -> None:
    node = sim_copy(tmp_path, "l40s-pair.yaml")
    fits = spec(
        tmp_path,
        "version: v1\ndefault: c\nvgpu-configs:\n  c:\n    - devices: [1]\n"
        "      vgpu-devices: {L40S-8Q: 2}\n",
        "fits.yaml",
    )
    code, report = doctor_json("--sim", str(node), "-f", str(fits))
    assert code == 0
    assert report["checks"][0]["message"] == "config 'c' selected (default)"
    (cfg,) = checks(report, "0000:a1:00.0")["config"]
    assert cfg["status"] == "ok" and "fits (2 step(s) to apply)" in cfg["message"]
    assert "config" not in checks(report, "0000:26:00.0")  # not covered by the config

    # On the GPU whose vGPU a VM holds, a layout of another size is blocked.
    blocked = spec(
        tmp_path,
        "version: v1\ndefault: c\nvgpu-configs:\n  c:\n    - devices: all\n"
        "      vgpu-devices: {L40S-8Q: 2}\n",
        "blocked.yaml",
    )
    before = node.read_text()
    files = sorted(tmp_path.iterdir())
    code, out, _ = run("doctor", "--sim", str(node), "-f", str(blocked))
    assert code == 1
    assert "[FAIL] config: the config's layout is blocked: gpu[0000:26:00.0]" in out
    assert "in use by vm default/render-1" in out
    assert node.read_text() == before  # never applied
    assert sorted(tmp_path.iterdir()) == files  # no journal, lock or state file either


def test_config_that_cannot_fit_and_one_the_driver_cannot_offer(tmp_path: Path) -> None:
    node = sim_copy(tmp_path, "t4-pair.yaml")
    too_many = spec(
        tmp_path,
        "version: v1\ndefault: c\nvgpu-configs:\n  c:\n    - devices: all\n"
        "      vgpu-devices: {T4-8Q: 3}\n",
        "big.yaml",
    )
    code, report = doctor_json("--sim", str(node), "-f", str(too_many))
    assert code == 1 and report["status"] == "fail"
    (cfg,) = report["checks"]
    assert cfg["status"] == "fail"
    assert (
        "big.yaml:6:29: T4-8Q: 3" in cfg["message"]
        and "exceeds 2, the most one T4 holds" in cfg["message"]
    )
    # The host checks are still there.
    assert status(report, "0000:3b:00.0", "driver") == "ok"

    graphics = sim_copy(tmp_path, "l40s-pair.yaml")
    compute = spec(
        tmp_path,
        "version: v1\ndefault: c\nvgpu-configs:\n  c:\n    - devices: all\n"
        "      vgpu-devices: {L40S-4C: 2}\n",
        "compute.yaml",
    )
    code, report = doctor_json("--sim", str(graphics), "-f", str(compute))
    assert code == 1
    (cfg,) = checks(report, "0000:a1:00.0")["config"]
    assert cfg["status"] == "fail" and "does not offer L40S-4C" in cfg["message"]


def test_no_config_selected_is_a_failed_check(tmp_path: Path) -> None:
    node = sim_copy(tmp_path, "t4-pair.yaml")
    config = spec(
        tmp_path,
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {T4-4Q: 4}\n",
        "nodefault.yaml",
    )
    code, out, _ = run("doctor", "--sim", str(node), "-f", str(config))
    assert code == 1
    assert "[FAIL] config:" in out and "-c NAME" in out
    code, out, _ = run("doctor", "--sim", str(node), "-f", str(config), "-c", "c")
    assert code == 0 and "config 'c' selected (flag)" in out


def test_errors_exit_1_without_traceback(tmp_path: Path) -> None:
    code, out, err = run("doctor", "--sim", str(tmp_path / "missing.yaml"), "-o", "json")
    assert code == 1
    assert "error" in json.loads(out) and "Traceback" not in err
    code, out, _ = run("doctor", "--sysfs-root", str(tmp_path / "nothing"))
    assert code == 1 and "[FAIL] sysfs: the host could not be read" in out


@pytest.mark.parametrize("name", ["a16-board.yaml", "mixed.yaml"])
def test_shipped_sim_nodes_pass(tmp_path: Path, name: str) -> None:
    code, report = doctor_json("--sim", str(sim_copy(tmp_path, name)))
    assert code == 0, report
    assert report["summary"]["fail"] == 0


def test_vfs_without_an_iommu_group_are_a_warning(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    text = 'node: n\ngpus:\n  - {address: "0000:08:00.0", model: A2}\n'
    materialize(render(SimDriver(parse_spec(text, catalog=CATALOG), catalog=CATALOG)), str(root))
    gpu = root / "bus/pci/devices/0000:08:00.0"
    vfs = sorted(
        (os.path.basename(os.readlink(link)) for link in gpu.glob("virtfn*")),
        key=lambda address: int(address.replace(":", "").replace(".", ""), 16),
    )
    assert len(vfs) == 16
    for address in vfs[3:5]:
        os.unlink(root / "bus/pci/devices" / address / "iommu_group")
    group = os.path.basename(os.readlink(gpu / "iommu_group"))
    code, out, _ = run("doctor", "--sysfs-root", str(root))
    assert code == 0  # the GPU itself has its group: vGPUs on the other VFs can work
    assert f"[WARN] iommu: IOMMU group {group}, but 2 VF(s) have none (first: {vfs[3]})" in out
    assert "→ check the kernel log for IOMMU errors" in out
    assert "this host can run vGPUs, with the warnings above" in out


def test_a_config_warning_is_shown_once_as_a_check(tmp_path: Path) -> None:
    node = sim_copy(tmp_path, "t4-pair.yaml")
    config = spec(
        tmp_path,
        "version: v1\ndefault: c\nvgpu-configs:\n  c:\n    - devices: all\n"
        "      vgpu-devices: {T4-1B: 16}\n",
        "uncatalogued.yaml",
    )
    code, out, err = run("doctor", "--sim", str(node), "-f", str(config))
    warning = "vGPU type 'T4-1B' is not in the catalog's T4 types"
    assert (out + err).count(warning) == 1, out + err
    (line,) = [line for line in out.splitlines() if warning in line]
    assert line.startswith("  [WARN] config: ")
    assert f"{config}:6:22:" in line
    code, report = doctor_json("--sim", str(node), "-f", str(config))
    assert code == 1, report  # the simulated T4 driver does not offer T4-1B either
    warned = [c for c in report["checks"] if c["status"] == "warn"]
    assert len(warned) == 1 and warning in warned[0]["message"]


# With --kubeconfig: the node's labels and the pods' vGPUs come from the cluster.

CLUSTER_CONFIG = REPO / "configs" / "examples" / "mixed-node.yaml"
CLUSTER_NODE = "gpu-node-1"
HELD_T4 = "9a3e5f10-4b6d-4e3c-9f20-3b4c5d6e7f80"


@pytest.fixture
def doctor_cluster(cluster: ControlPlane, tmp_path: Path) -> tuple[ControlPlane, Path, Path]:
    """The real API server with the node (labelled for the ``mixed`` config) and a KubeVirt
    CR; a cluster user's kubeconfig; a copy of the simulated node."""
    cluster.put(
        NODES,
        CLUSTER_NODE,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"labels": {"nvidia.com/vgpu.config": "mixed"}},
        },
    )
    put_kubevirt(cluster)
    node = sim_copy(tmp_path, "mixed.yaml")
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig", identity="user")
    return cluster, kubeconfig, node


def _cluster_doctor(kubeconfig: Path, node: Path, *extra: str | Path) -> tuple[int, str, str]:
    return run(
        "doctor",
        "--node",
        CLUSTER_NODE,
        "--kubeconfig",
        str(kubeconfig),
        "--sim",
        str(node),
        "-f",
        str(CLUSTER_CONFIG),
        *(str(e) for e in extra),
    )


def test_with_a_cluster_labels_come_from_the_node_and_a_pod_held_vgpu_blocks(
    doctor_cluster: tuple[ControlPlane, Path, Path],
) -> None:
    api, kubeconfig, node = doctor_cluster
    objects = {kind: api.all(kind) for kind in (NODES, KUBEVIRT, NODESTATES)}
    mark = api.audit_mark()
    sim_before = node.read_text()
    sock = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp")) / "kubelet.sock"
    kubelet = PodResourcesKubelet(
        [
            PodDevices(
                "vms", "virt-launcher-cad-7xk2p", "compute", "nvidia.com/GRID_T4-8C", [HELD_T4]
            )
        ]
    )
    with serving(sock, kubelet):
        code, out, err = _cluster_doctor(kubeconfig, node, "--pod-resources", sock)
    assert kubelet.calls == 1
    assert code == 1, out + err
    # No label was given on the command line: the Node's label selected the config.
    assert "[ok  ] config: config 'mixed' selected (label" in out
    held = f"gpu[0000:3b:00.0].vgpu[{HELD_T4}]: in use by pod vms/virt-launcher-cad-7xk2p"
    (t4,) = [line for line in out.splitlines() if held in line]
    assert t4.startswith("  [FAIL] config: the config's layout is blocked: ")
    assert "(VM vms/cad)" in t4
    assert "GPU 1 0000:3b:00.0 Tesla T4: fail" in out
    # Doctor only read the cluster, and left the node as it was.
    requests = [f"{e['verb']} {e['requestURI']}" for e in api.audit(mark, USER)]
    assert requests and all(r.split()[0] in ("get", "list", "watch") for r in requests), requests
    assert {kind: api.all(kind) for kind in (NODES, KUBEVIRT, NODESTATES)} == objects
    assert node.read_text() == sim_before


def test_with_a_cluster_a_silent_kubelet_is_one_warn_check(
    doctor_cluster: tuple[ControlPlane, Path, Path], tmp_path: Path
) -> None:
    _, kubeconfig, node = doctor_cluster
    code, out, err = _cluster_doctor(
        kubeconfig, node, "--pod-resources", tmp_path / "no-kubelet.sock"
    )
    assert code == 0, out + err  # a warning, not a failure: the host shows its holders
    warning = "which vGPUs pods hold is unknown"
    assert (out + err).count(warning) == 1, out + err
    (line,) = [line for line in out.splitlines() if warning in line]
    assert line.startswith("  [WARN] config: ")
    assert "Traceback" not in err
