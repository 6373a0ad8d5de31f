"""The agent's ``--proc-root`` and ``--sriov-manage``, as a real process on a FUSE-simulated node.

The agent talks to the harness's real kube-apiserver (``cluster``) as its
ServiceAccount, with a token bound to a Pod on its node, as the DaemonSet runs
it: a request the shipped RBAC refuses fails the test.

* A process holding a vGPU's VFIO node open (as a VM's QEMU does) blocks that
  vGPU in the agent's reconcile, read from ``--proc-root``; the node's status
  names the process, and the agent never fails on the driver's EBUSY.
* A GPU whose VFs are off gets them through the ``--sriov-manage`` command
  (the simulated driver refuses a raw ``sriov_numvfs`` write, as NVIDIA's does).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import AGENT_USER, NAMESPACE, WRITE_VERBS, ControlPlane
from tests.test_holders_fuse import HELD, SPEC, _group, qemu_holding
from vgpu_state.catalog import default_catalog
from vgpu_state.host import scan
from vgpu_state.sim.fuse import mounted
from vgpu_state.sim.tree import VFIO_NODES

CATALOG = default_catalog()
REPO = Path(__file__).resolve().parent.parent

CONFIG = """\
version: v1
vgpu-configs:
  a2-2q:
    - devices: all
      vgpu-devices: {A2-2Q: 8}
  a16:
    - devices: all
      vgpu-devices: {A16-4Q: 4}
"""


def start_agent(
    cluster: ControlPlane, tmp: Path, node: str, root: Path, *extra: str, config: str = CONFIG
) -> tuple[subprocess.Popen[str], Path]:
    """The agent of ``node`` on the sysfs at ``root``, its state in ``tmp/state``, as its
    ServiceAccount with a token bound to a Pod on ``node``."""
    config_dir = tmp / "config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "config.yaml").write_text(config)
    in_use = tmp / "in-use.json"
    in_use.write_text("{}")  # no pod holds anything (and no kubelet to ask)
    log = tmp / "agent.log"
    kubeconfig = cluster.write_kubeconfig(tmp / "kubeconfig", token=cluster.agent_token(node))
    args = [
        sys.executable, "-m", "vgpu_state.cli.main", "agent",
        "--node", node, "--config", str(config_dir / "config.yaml"),
        "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE,
        "--sysfs-root", str(root), "--state-dir", str(tmp / "state"),
        "--in-use-file", str(in_use), "--listen", "", "--resync", "300",
        "--no-device-plugin", "--no-kubevirt", "--mode", "enforce", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(args, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, log


def wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if check():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the agent exited ({proc.returncode}): {log.read_text()}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {log.read_text()}")


def conditions(cluster: ControlPlane, node: str) -> dict[str, dict[str, Any]]:
    found = cluster.get("vgpu-state.io/v1alpha1/vgpunodestates", node)
    if found is None:
        return {}
    return {c["type"]: c for c in found.get("status", {}).get("conditions", [])}


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.usefixtures("require_fuse")
def test_agent_blocks_a_vgpu_a_process_holds(cluster: ControlPlane, tmp_path: Path) -> None:
    node = "a2-node"
    cluster.ensure_node(node, {"nvidia.com/vgpu.config": "a2-2q"})
    (tmp_path / "node.yaml").write_text(SPEC)
    with mounted(tmp_path / "node.yaml", tmp_path / "mnt") as m:
        vfio = m.root / VFIO_NODES / _group(m.root, HELD)
        with qemu_holding(vfio) as qemu:
            mark = cluster.audit_mark()
            proc, log = start_agent(cluster, tmp_path, node, m.root, "--proc-root", "/proc")
            try:
                holder = f"VM win-7 (process {qemu.pid}, qemu-system-x86_64)"

                def blocked() -> bool:
                    c = conditions(cluster, node).get("Blocked")
                    return c is not None and c["status"] == "True" and holder in c["message"]

                wait_for("the Blocked condition naming the process", blocked, proc, log)
                gpu = scan(str(m.root), catalog=CATALOG).gpus[0]
                assert HELD in {v.uuid for v in gpu.vgpus}, "the held vGPU is still there"
                assert "EBUSY" not in log.read_text()

                # One Warning per reason, not one per blocked item (11 here): a node
                # with hundreds of blocked steps writes a few Events per reconcile.
                def warnings() -> dict[str, dict[str, Any]]:
                    return {
                        e["reason"]: e
                        for e in cluster.all("v1/events")
                        if e["involvedObject"]["name"] == node and e["type"] == "Warning"
                    }

                wait_for("the Warnings", lambda: {"InUse"} <= set(warnings()), proc, log)
                time.sleep(1)  # any further Event write of this reconcile
                found = warnings()
                assert {r: e["count"] for r, e in found.items()} == dict.fromkeys(found, 1)
                assert set(found) == {"InUse", "SwitchDeferred"}
                assert holder in found["InUse"]["message"]  # the one held vGPU
                deferred = found["SwitchDeferred"]["message"]  # 2 free vGPUs and 8 creates
                assert deferred.startswith("10 plan items blocked: gpu[0000:08:00.0]"), deferred
                assert deferred.endswith("; and 8 more"), deferred
                writes = [
                    e["verb"]
                    for e in cluster.audit(mark, AGENT_USER)
                    if e["objectRef"].get("resource") == "events" and e["verb"] in WRITE_VERBS
                ]
                assert writes == ["create"] * len(found), writes
            finally:
                stop(proc)


@pytest.mark.usefixtures("require_fuse")
def test_agent_enables_sriov_through_sriov_manage(cluster: ControlPlane, tmp_path: Path) -> None:
    node = "a16-node"
    cluster.ensure_node(node, {"nvidia.com/vgpu.config": "a16"})
    with mounted(REPO / "configs" / "sim" / "a16-board.yaml", tmp_path / "mnt") as m:
        off = [g.address for g in scan(str(m.root), catalog=CATALOG).gpus if not g.sriov_numvfs]
        assert off, "the example board has a GPU with its VFs off"

        def state() -> str | None:
            found = cluster.get("v1/nodes", node) or {}
            labels = found.get("metadata", {}).get("labels", {})
            return labels.get("nvidia.com/vgpu.config.state")

        # Without it the agent writes sriov_numvfs, which the driver refuses (ENOENT).
        proc, log = start_agent(cluster, tmp_path, node, m.root, "--sriov-manage", "")
        try:
            wait_for("failed", lambda: state() == "failed", proc, log)
        finally:
            stop(proc)
        assert "sriov_numvfs" in log.read_text()
        command = shlex.join(m.sriov_manage_command())
        proc, log = start_agent(cluster, tmp_path, node, m.root, "--sriov-manage", command)
        try:
            wait_for("success", lambda: state() == "success", proc, log)
        finally:
            stop(proc)
        after = scan(str(m.root), catalog=CATALOG)
        for address in off:
            g = after.gpu(address)
            assert g is not None and g.sriov_numvfs == g.sriov_totalvfs
            assert sorted(v.type_name or "" for v in g.vgpus) == ["A16-4Q"] * 4
