"""The agent part of `make demo`: a simulated node in a cluster emulator, a label change.

Starts a Kubernetes API server emulator (kmock, the suite's), creates the
Node, runs `vgpu-state agent` as a real process against a simulated node in
plan-only mode, as deploy/ installs it, then changes the Node's layout label
the way `kubectl label` does: the agent reports the plan and changes nothing,
`vgpu-state fleet plan` shows it; then the node is promoted with the label
vgpu-state.io/mode=enforce and the agent converges it, the device plugin (a
stand-in kubelet shows what it is told, and writes the Node's allocatable from
it as a kubelet does) and the state label; one pass of `vgpu-state controller`,
the KubeVirt CR's only writer, permits the node's resources there; then the
stand-in kubelet loses one resource and the agent notices and registers it again.
"""

from __future__ import annotations

import importlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vgpu_state.kube.api import KubeApi  # noqa: E402
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet  # noqa: E402

NODE_SPEC = REPO / "configs" / "sim" / "a2-host.yaml"
NODE = "a2-node"
STATE = "nvidia.com/vgpu.config.state"
CONFIG = """\
version: v1
policy: {max-unavailable: 1}
vgpu-configs:
  a2-4g:            # what the node has now
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 1, A2-4A: 1}
  a2-4q:            # the A2-4A goes, two more A2-4Q come (the held A2-4C stays)
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 3}
"""


def wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"demo failed: the agent did not reach {what}")
        time.sleep(0.1)


def main() -> int:
    # The emulator's event loop may drop a finished watch stream at shutdown; say nothing.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    work = Path(tempfile.mkdtemp(prefix="vgpu-state-agent-demo-"))
    spec = work / "node.yaml"
    spec.write_text(NODE_SPEC.read_text())
    config_dir = work / "configmap"
    (config_dir / "..2026_11_23_1").mkdir(parents=True)
    (config_dir / "..2026_11_23_1" / "config.yaml").write_text(CONFIG)
    (config_dir / "..data").symlink_to("..2026_11_23_1")
    (config_dir / "config.yaml").symlink_to("..data/config.yaml")
    log = work / "agent.log"

    # The test suite's API server emulator (kmock); loaded by name, it is test code.
    kube: Any = importlib.import_module("tests.kube_emulator").RunningEmulator().start()
    proc: subprocess.Popen[bytes] | None = None
    kubelet = DevicePluginKubelet(str(work / "device-plugins"))
    kubelet.start()
    try:
        kube.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4g"}}})
        kube.put(
            "kubevirt.io/v1/kubevirts",
            "kubevirt",
            {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "spec": {"configuration": {}}},
            namespace="kubevirt",
        )
        kubeconfig = kube.write_kubeconfig(work / "kubeconfig")
        api = KubeApi(kube.api_client(), kube.url, (5.0, 10.0))
        # The Node's status.allocatable follows what the stand-in kubelet is told (test code).
        node_status = importlib.import_module("tests.kubelet_node").KubeletNodeStatus(
            kube, NODE, kubelet
        )

        def state() -> str | None:
            node = kube.get("v1/nodes", NODE) or {}
            value = node.get("metadata", {}).get("labels", {}).get(STATE)
            return str(value) if value is not None else None

        args = [
            "agent", "--node", NODE, "--config", str(config_dir / "config.yaml"),
            "--kubeconfig", str(kubeconfig), "--sim", str(spec),
            "--state-dir", str(work / "state"), "--listen", "", "--resync", "300",
            "--device-plugin-dir", kubelet.plugin_dir, "--allocatable-grace", "2",
            "--mode", "plan-only",
        ]  # fmt: skip
        print("\n=== 9. The agent: a simulated node in a cluster emulator")
        print("   installed as deploy/ installs it: plan-only, nothing is applied until promoted")
        print(f"$ vgpu-state {' '.join(args)}")
        proc = subprocess.Popen(
            [sys.executable, "-m", "vgpu_state.cli.main", *args],
            cwd=REPO,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        wait_for("its first reconcile", lambda: state() == "success", proc)
        print(f"   node {NODE}: {STATE}={state()} (layout a2-4g: nothing to change)")

        def advertised() -> dict[str, int]:
            return {r: len(d) for r, d in sorted(kubelet.resources().items()) if d}

        wait_for("the kubelet", lambda: advertised().get("nvidia.com/NVIDIA_A2-4Q") == 1, proc)
        print(f"   kubelet sees: {_devices(advertised())}")

        print(f"\n$ kubectl label node {NODE} nvidia.com/vgpu.config=a2-4q --overwrite")
        before = (work / "node.yaml").read_text()
        api.patch(
            f"/api/v1/nodes/{NODE}",
            {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4q"}}},
            "merge",
        )
        wait_for("the plan", lambda: state() == "pending", proc)
        planned = next(
            line for line in reversed(log.read_text().splitlines()) if "plan-only" in line
        )
        print("   | " + planned.split(" ", 2)[-1])
        print(f"   node {NODE}: {STATE}={state()}; the host is unchanged (plan-only)")
        if (work / "node.yaml").read_text() != before:
            raise SystemExit("demo failed: the plan-only agent changed the node")
        fleet = [
            "fleet", "plan", "-f", str(config_dir / "config.yaml"),
            "--kubeconfig", str(kubeconfig),
        ]  # fmt: skip
        print(f"\n$ vgpu-state {' '.join(fleet)}")
        shown = subprocess.run(
            [sys.executable, "-m", "vgpu_state.cli.main", *fleet],
            cwd=REPO, capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"},
        )  # fmt: skip
        sys.stdout.write(shown.stdout + shown.stderr)
        if shown.returncode != 0:
            raise SystemExit(f"demo failed: fleet plan exited {shown.returncode}")

        print(f"\n$ kubectl label node {NODE} vgpu-state.io/mode=enforce   # promote the node")
        seen = len(log.read_text().splitlines())
        api.patch(
            f"/api/v1/nodes/{NODE}",
            {"metadata": {"labels": {"vgpu-state.io/mode": "enforce"}}},
            "merge",
        )

        def converged() -> bool:
            return "config 'a2-4q'" in log.read_text() and state() == "success"

        wait_for("the new layout", converged, proc)
        print("   what the agent did:")
        for line in log.read_text().splitlines()[seen:]:
            print("   | " + line.split(" ", 2)[-1])
        # The KubeVirt CR has one writer, the controller (deploy/ runs it as a Deployment):
        # one pass derives the permitted devices from every node's VGPUNodeState, within
        # what the layouts document (the agents' ConfigMap, mounted) can produce.
        controller = [
            "controller", "--kubeconfig", str(kubeconfig), "--once", "--config", "",
            "-f", str(config_dir / "config.yaml"),
            "--webhook-port", "0", "--listen", "", "--log-level", "warning",
        ]  # fmt: skip
        print(f"\n$ vgpu-state {shlex.join(controller)}   # the KubeVirt CR's only writer")
        passed = subprocess.run(
            [sys.executable, "-m", "vgpu_state.cli.main", *controller],
            cwd=REPO, capture_output=True, text=True,
        )  # fmt: skip
        for line in (passed.stdout + passed.stderr).splitlines():
            print("   | " + line)
        if passed.returncode != 0:
            raise SystemExit(f"demo failed: the controller's pass exited {passed.returncode}")
        cr = kube.get("kubevirt.io/v1/kubevirts", "kubevirt", "kubevirt") or {}
        permitted = cr.get("spec", {}).get("configuration", {}).get("permittedHostDevices", {})
        names = sorted(e["resourceName"] for e in permitted.get("mediatedDevices", []))
        if "nvidia.com/NVIDIA_A2-4Q" not in names:
            raise SystemExit(f"demo failed: the KubeVirt CR permits {names or 'nothing'}")
        print(f"   KubeVirt CR permits: {', '.join(names)}")
        wait_for("the kubelet", lambda: advertised().get("nvidia.com/NVIDIA_A2-4Q") == 3, proc)
        print(f"   kubelet sees: {_devices(advertised())}")
        print(f"   node {NODE}: {STATE}={state()}")

        def allocatable() -> dict[str, Any]:
            found = kube.get("vgpu-state.io/v1alpha1/vgpunodestates", NODE) or {}
            for c in found.get("status", {}).get("conditions", []):
                if c["type"] == "KubeletAllocatable":
                    return dict(c)
            return {}

        def offered(count: int) -> bool:
            c = allocatable()
            return c.get("status") == "True" and f"NVIDIA_A2-4Q: {count}" in c.get("message", "")

        wait_for("KubeletAllocatable True", lambda: offered(3), proc)
        c = allocatable()
        print(f"   VGPUNodeState KubeletAllocatable={c['status']} ({c['reason']}): {c['message']}")

        print("\n   the kubelet loses the A2-4Q device plugin (allocatable 0, nobody tells it):")
        node_status.lose("nvidia.com/NVIDIA_A2-4Q")

        def reregistered() -> list[dict[str, Any]]:
            return [e for e in kube.all("v1/events") if e["reason"] == "DevicePluginReregistered"]

        wait_for("the re-registration", lambda: bool(reregistered()), proc)
        history = kube.history("vgpu-state.io/v1alpha1/vgpunodestates", NODE)
        false = next(
            c
            for version in history
            for c in version.get("status", {}).get("conditions", [])
            if c["type"] == "KubeletAllocatable" and c["status"] == "False"
        )
        print(f"   VGPUNodeState KubeletAllocatable=False ({false['reason']}): {false['message']}")
        event = reregistered()[0]
        print(f"   Event {event['type']} {event['reason']}: {event['message']}")
        wait_for("KubeletAllocatable True again", lambda: offered(3), proc)
        c = allocatable()
        print(f"   VGPUNodeState KubeletAllocatable={c['status']} ({c['reason']}): {c['message']}")
        proc.send_signal(signal.SIGTERM)
        if proc.wait(30) != 0:
            raise SystemExit("demo failed: the agent did not exit 0 on SIGTERM")
        print(
            "   SIGTERM: the agent stopped cleanly (exit 0); "
            f"kubelet sees: {_devices(advertised())}"
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        kubelet.stop()
        kube.stop()
    scan = subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", "scan", "--sim", str(spec)],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"},
    )  # fmt: skip
    print(f"\n$ vgpu-state scan --sim node.yaml\n{scan.stdout}")
    return 0


def _devices(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} x {r}" for r, n in counts.items()) or "no devices"


if __name__ == "__main__":
    raise SystemExit(main())
