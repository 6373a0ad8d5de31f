"""The agent as a real process on a FUSE-simulated node, for tests against the real kube-apiserver.

:func:`running_agent` mounts the node, writes the agent's command line as the
DaemonSet gives it (its ServiceAccount's token bound to a Pod on the node, a
ConfigMap directory, a device-plugin directory), optionally runs the stand-in
kubelet, and at exit kills what still runs and prints the agent's log.
:class:`Running` is the agent's handle: start it, read the Node, its status
and the probes, label the node, edit the ConfigMap, run a controller pass.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.kubelet_node import KubeletNodeStatus
from tests.realcluster import ControlPlane
from vgpu_state.catalog import default_catalog
from vgpu_state.host import scan
from vgpu_state.sim.fuse import mounted
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet

CATALOG = default_catalog()

REPO = Path(__file__).resolve().parent.parent
A2_SPEC = REPO / "configs" / "sim" / "a2-host.yaml"
NODE = "a2-node"
STATE_LABEL = "nvidia.com/vgpu.config.state"
CONFIG = """\
version: v1
vgpu-configs:
  a2-4g:           # what the node has: nothing to do
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 1, A2-4A: 1}
  grow:            # one more A2-4Q
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 2, A2-4A: 1}
"""


def swap_configmap(directory: Path, generation: int, text: str) -> None:
    """Update a ConfigMap volume as the kubelet does (new dir, atomic ``..data`` rename)."""
    version = directory / f"..2026_11_23_{generation}"
    version.mkdir()
    (version / "config.yaml").write_text(text)
    (directory / "..data_tmp").symlink_to(version.name)
    os.rename(directory / "..data_tmp", directory / "..data")
    if not (directory / "config.yaml").is_symlink():
        (directory / "config.yaml").symlink_to("..data/config.yaml")


SERVING = re.compile(r"serving /healthz, /readyz and /metrics on [^ ]+:(\d+)$", re.MULTILINE)


def wait_for(
    what: str,
    check: Callable[[], bool],
    proc: subprocess.Popen[str] | list[subprocess.Popen[str]],
    timeout: float = 30,
) -> None:
    """Poll ``check`` until true; fail at once if any of the agents ``proc`` exits.

    A check that fails an assertion (an object the agent has not written yet: it sets
    the state label before it writes the ``VGPUNodeState``) counts as not yet true.
    """
    procs = proc if isinstance(proc, list) else [proc]
    deadline = time.monotonic() + timeout

    def holds() -> bool:
        try:
            return check()
        except AssertionError:
            return False

    while not holds():
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"the agent exited ({p.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def layout(root: str) -> dict[str, int]:
    """How many vGPUs of each type the node's sysfs shows."""
    counts: dict[str, int] = {}
    for gpu in scan(root, catalog=CATALOG).gpus:
        for v in gpu.vgpus:
            counts[str(v.type_name)] = counts.get(str(v.type_name), 0) + 1
    return counts


def uuids(root: str, type_name: str) -> set[str]:
    gpus = scan(root, catalog=CATALOG).gpus
    return {v.uuid or "" for g in gpus for v in g.vgpus if v.type_name == type_name}


class Running:
    """One agent's command line, files and handles; :meth:`start` runs it."""

    def __init__(self, kube: ControlPlane, tmp: Path, root: str, node: str = NODE) -> None:
        self.kube = kube
        self.root = root
        self.tmp = tmp
        self.node_name = node
        self.config_dir = tmp / "config"
        self.config_dir.mkdir()
        swap_configmap(self.config_dir, 1, CONFIG)
        self.generation = 1
        self.log = tmp / "agent.log"
        # A short directory: unix socket paths have a length limit the pytest one exceeds.
        self.plugin_dir = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
        self.kubelet: DevicePluginKubelet | None = None
        in_use = tmp / "in-use.json"
        in_use.write_text('{"f715f63c-0d00-4007-9c5a-b07b0c6c05de": "vm default/win-1"}')
        # The agent's identity in a DaemonSet: its ServiceAccount, bound to a Pod on the node.
        self.token = kube.agent_token(node)
        kubeconfig = kube.write_kubeconfig(tmp / "kubeconfig", token=self.token)
        self.args = [
            sys.executable, "-m", "vgpu_state.cli.main", "agent",
            "--node", node, "--config", str(self.config_dir / "config.yaml"),
            "--kubeconfig", str(kubeconfig), "--sysfs-root", root,
            "--state-dir", str(tmp / "state"), "--in-use-file", str(in_use),
            "--listen", "127.0.0.1:0", "--resync", "300", "--mode", "enforce",
            "--namespace", "vgpu-state", "--device-plugin-dir", str(self.plugin_dir),
        ]  # fmt: skip
        self.proc: subprocess.Popen[str] | None = None
        self.started_at = 0  # where the running agent's part of the log begins

    def start(self) -> subprocess.Popen[str]:
        self.started_at = self.log.stat().st_size if self.log.exists() else 0
        self.proc = subprocess.Popen(
            self.args, cwd=REPO, stdout=self.log.open("a"), stderr=subprocess.STDOUT, text=True
        )
        return self.proc

    def close(self) -> None:
        """Kill the agent if it still runs, stop the kubelet, print the agent's log."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.kubelet is not None:
            self.kubelet.stop()
        shutil.rmtree(self.plugin_dir, ignore_errors=True)
        print(self.log.read_text() if self.log.exists() else "(no agent log)")

    def node(self) -> dict[str, Any]:
        found = self.kube.get("v1/nodes", self.node_name)
        assert found is not None
        return found

    def advertised(self) -> dict[str, set[str]]:
        """What the kubelet was last told: resource -> healthy device IDs (empty lists too)."""
        assert self.kubelet is not None
        return {
            r: {d.id for d in devices if d.health == "Healthy"}
            for r, devices in self.kubelet.resources().items()
        }

    def state(self) -> str | None:
        state: str | None = self.node()["metadata"].get("labels", {}).get(STATE_LABEL)
        return state

    def nodestate(self) -> dict[str, Any]:
        found = self.kube.get("vgpu-state.io/v1alpha1/vgpunodestates", self.node_name)
        assert found is not None, "no VGPUNodeState"
        return dict(found["status"])

    def nodestate_so_far(self) -> dict[str, Any]:
        """The status as it stands, empty while the object or its status is not yet
        written (for polling: the label and the status are two writes)."""
        found = self.kube.get("vgpu-state.io/v1alpha1/vgpunodestates", self.node_name)
        return dict((found or {}).get("status") or {})

    def annotation(self, key: str) -> str:
        return str(self.node()["metadata"].get("annotations", {}).get(key, ""))

    def label(self, value: str) -> None:
        """``kubectl label node --overwrite``: a merge patch over HTTP."""
        from vgpu_state.kube.api import KubeApi

        api = KubeApi(self.kube.api_client(), self.kube.url, (5.0, 10.0))
        api.patch(
            f"/api/v1/nodes/{self.node_name}",
            {"metadata": {"labels": {"nvidia.com/vgpu.config": value}}},
            "merge",
        )

    def controller_pass(self) -> Any:
        """``vgpu-state controller --once`` against the same API server, as the controller's
        own ServiceAccount (its token bound to its pod)."""
        from click.testing import CliRunner

        from vgpu_state.cli.main import cli

        kubeconfig = self.kube.controller_kubeconfig(self.tmp / "controller")
        args = ["controller", "--kubeconfig", str(kubeconfig), "--once", "--identity", "c-1",
                "-f", str(self.config_dir / "config.yaml")]  # fmt: skip
        return CliRunner().invoke(cli, args)

    def edit_config(self, text: str) -> None:
        self.generation += 1
        swap_configmap(self.config_dir, self.generation, text)

    def port(self) -> int | None:
        """The probe port the running agent logged (it binds port 0: no free port to race for)."""
        if not self.log.exists():
            return None
        with self.log.open("rb") as f:
            f.seek(self.started_at)
            found = SERVING.search(f.read().decode(errors="replace"))
        return int(found.group(1)) if found else None

    def get(self, path: str) -> tuple[int, str]:
        port = self.port()
        if port is None:
            return 0, ""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return 0, ""


@contextmanager
def running_agent(
    kube: ControlPlane,
    tmp: Path,
    spec: Path = A2_SPEC,
    *,
    save: bool = False,
    kubelet: bool = False,
    allocatable: bool = False,
) -> Iterator[Running]:
    """The node ``spec`` FUSE-mounted under ``tmp`` and an agent for it, not yet started.

    ``save`` writes the simulated driver's state back to ``spec`` at unmount;
    ``kubelet`` runs the stand-in kubelet in the plugin directory, and
    ``allocatable`` makes the Node's ``status.allocatable`` follow its lists, as a
    real kubelet does. At exit: :meth:`Running.close`.
    """
    with mounted(spec, tmp / "sys", save=save) as m:
        running = Running(kube, tmp, str(m.root))
        try:
            if kubelet:
                running.kubelet = DevicePluginKubelet(str(running.plugin_dir))
                if allocatable:
                    KubeletNodeStatus(kube, running.node_name, running.kubelet)
                running.kubelet.start()
            yield running
        finally:
            running.close()
