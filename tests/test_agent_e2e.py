"""The agent as a real process: a real API server, a FUSE-simulated sysfs, a ConfigMap directory.

The API server is upstream's kube-apiserver with etcd (``tests/realcluster.py``),
with ``deploy/`` installed; each agent runs with the token of its
ServiceAccount bound to a Pod on its Node, as in the DaemonSet, so the shipped
RBAC is what allows or refuses each request (a refused one fails the test) and
every object written passes the server's own validation.

What a cluster operator sees: label a node and its vGPUs follow, and the
kubelet is told (a fake kubelet on a unix socket records every device list);
edit the ConfigMap and they follow again; break the config and nothing on the
host changes while the node says why; stop the agent and it exits cleanly,
having withdrawn its devices.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_process import (
    A2_SPEC,
    CATALOG,
    CONFIG,
    NODE,
    STATE_LABEL,
    Running,
    layout,
    running_agent,
    swap_configmap,
    uuids,
    wait_for,
)
from tests.apiserver import put_kubevirt
from tests.realcluster import ControlPlane
from vgpu_state.host import scan
from vgpu_state.sim.fuse import mounted

A2_4Q = "nvidia.com/NVIDIA_A2-4Q"


@pytest.fixture
def agent(cluster: ControlPlane, tmp_path: Path, require_fuse: None) -> Iterator[Running]:
    cluster.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4g"}}})
    put_kubevirt(cluster)
    # As a real kubelet does, the Node's status.allocatable follows the plugin's lists.
    with running_agent(cluster, tmp_path, kubelet=True, allocatable=True) as running:
        yield running


def test_label_change_configmap_edit_bad_config_and_sigterm(agent: Running) -> None:
    proc = agent.start()
    wait_for("the first reconcile", lambda: agent.state() == "success", proc)
    assert layout(agent.root) == {"A2-4C": 1, "A2-4Q": 1, "A2-4A": 1}
    # Ready once the first reconcile has finished (the state label is written inside it).
    wait_for("ready", lambda: agent.get("/readyz")[0] == 200, proc)
    told = lambda: agent.advertised().get(A2_4Q) == uuids(agent.root, "A2-4Q")  # noqa: E731
    wait_for("the kubelet told", told, proc)
    assert set(agent.advertised()) == {A2_4Q, "nvidia.com/NVIDIA_A2-4C", "nvidia.com/NVIDIA_A2-4A"}

    # A label change: the layout is created, the state label says success, and the
    # kubelet's ListAndWatch stream carries the new vGPU.
    agent.label("grow")
    wait_for("the grown layout", lambda: layout(agent.root).get("A2-4Q") == 2, proc)
    wait_for("success", lambda: agent.state() == "success", proc)
    grown = uuids(agent.root, "A2-4Q")
    assert len(grown) == 2
    wait_for("the kubelet told", lambda: agent.advertised().get(A2_4Q) == grown, proc)
    wait_for("the status", lambda: agent.nodestate_so_far().get("vgpuCount") == 4, proc)
    # The controller permits the node's types in the KubeVirt CR, from its status.
    assert agent.controller_pass().exit_code == 0
    cr = agent.kube.get("kubevirt.io/v1/kubevirts", "kubevirt", "kubevirt")
    assert cr is not None
    mdevs = cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    assert {e["mdevNameSelector"] for e in mdevs} >= {"NVIDIA A2-4Q", "NVIDIA A2-4C"}
    status = agent.nodestate()
    assert status["state"] == "success"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Synced"] == "True"
    # The kubelet offers what the plugin advertised (the Node's status.allocatable).
    offered = lambda: any(  # noqa: E731
        c["type"] == "KubeletAllocatable"
        and c["status"] == "True"
        and f"{A2_4Q}: 2" in c["message"]
        for c in agent.nodestate()["conditions"]
    )
    wait_for("KubeletAllocatable True", offered, proc)

    # A ConfigMap edit (symlink swap), no label change: re-applied.
    agent.edit_config(CONFIG.replace("{A2-4C: 1, A2-4Q: 2, A2-4A: 1}", "{A2-4C: 1, A2-4Q: 3}"))
    wait_for("the edited layout", lambda: layout(agent.root) == {"A2-4C": 1, "A2-4Q": 3}, proc)
    wait_for("success", lambda: agent.state() == "success", proc)
    a2_4a = "nvidia.com/NVIDIA_A2-4A"
    wait_for("A2-4A withdrawn", lambda: agent.advertised().get(a2_4a) == set(), proc)
    wait_for("the kubelet told", told, proc)

    # A kubelet restart (a new kubelet.sock, every socket gone): the plugins register
    # again, the devices are listed again, and the agent re-reads the node.
    assert agent.kubelet is not None
    agent.kubelet.restart()
    wait_for("re-registration", told, proc)
    wait_for("a reconcile", lambda: "reconcile (kubelet" in agent.log.read_text(), proc)

    # The config made invalid: the node says where; the host is left as it is.
    before = scan(agent.root, catalog=CATALOG).fingerprint()
    agent.edit_config(CONFIG.replace("A2-4Q: 2", "A2-4Q: lots"))
    wait_for("failed", lambda: agent.state() == "failed", proc)
    message = agent.annotation("vgpu-state.io/last-plan")
    assert "config.yaml:8:39:" in message and "lots" in message, message
    assert scan(agent.root, catalog=CATALOG).fingerprint() == before
    status = agent.nodestate()
    degraded = {c["type"]: c for c in status["conditions"]}["Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "ConfigInvalid"
    assert "config.yaml:8:39:" in degraded["message"]

    # The reconcile counts itself after it reported (the state label comes first).
    counter = 'vgpu_state_reconciles_total{result="degraded"}'
    wait_for("the degraded reconcile counted", lambda: counter in agent.get("/metrics")[1], proc)
    metrics = agent.get("/metrics")[1]
    assert "vgpu_state_config_generation 2.0" in metrics, "the invalid one does not count"

    # SIGTERM: exit 0, every resource withdrawn first.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert agent.advertised() and all(not ids for ids in agent.advertised().values())
    # The server took every field the agent sent (it warns of, and drops, unknown ones).
    assert "the Kubernetes API server warns" not in agent.log.read_text()


def test_kubevirt_managing_mdevs_stops_the_agent_and_it_says_why(agent: Running) -> None:
    """KubeVirt's own mdev management (``mediatedDevicesConfiguration`` set, no
    ``DisableMDEVConfiguration`` gate) would undo the agent's work: the agent applies
    nothing, and the state label, the status, the last-plan annotation and an Event
    say why, until the CR hands the mdevs over."""
    put_kubevirt(agent.kube, mdev_types=["nvidia-745"], gates=())
    agent.label("grow")
    before = scan(agent.root, catalog=CATALOG).fingerprint()
    proc = agent.start()

    def reported() -> bool:
        found = agent.kube.get("vgpu-state.io/v1alpha1/vgpunodestates", NODE)
        conditions = ((found or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Blocked" and c["status"] == "True" for c in conditions)

    # The status and the state label are two writes: wait for both.
    wait_for(
        "the status and the state label",
        lambda: reported() and agent.state() == "failed",
        proc,
    )
    time.sleep(1)  # a reconcile that would apply has had its chance
    assert scan(agent.root, catalog=CATALOG).fingerprint() == before, "nothing applied"
    conditions = {c["type"]: c for c in agent.nodestate()["conditions"]}
    assert conditions["Blocked"]["reason"] == "KubeVirtMdevManagementActive"
    assert conditions["Synced"]["reason"] == "KubeVirtMdevManagementActive"
    assert "nothing was applied" in conditions["Synced"]["message"]
    assert "KubeVirt manages mediated devices" in agent.annotation("vgpu-state.io/last-plan")
    events = [
        e for e in agent.kube.all("v1/events") if e.get("reason") == "KubeVirtMdevManagementActive"
    ]
    assert events and "KubeVirt manages mediated devices" in events[0]["message"]

    # The CR hands the mdevs over: the agent applies the layout.
    put_kubevirt(agent.kube, mdev_types=["nvidia-745"])
    agent.edit_config(CONFIG + "  # touched\n")  # a trigger: the agent does not watch the CR
    wait_for("the grown layout", lambda: layout(agent.root).get("A2-4Q") == 2, proc)
    wait_for("success", lambda: agent.state() == "success", proc)


SLOW_SPEC = A2_SPEC.read_text() + "faults:\n  - {op: any, delay-ms: 400}\n"
SWAP = (
    CONFIG
    + """\
  swap:            # the A2-4A goes, two A2-4Q come: one destroy, two creates
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 3}
"""
)


def journal_steps(state_dir: Path) -> int:
    journal = state_dir / "journal.jsonl"
    if not journal.exists():
        return 0
    return sum(1 for line in journal.read_text().splitlines() if '"event": "action"' in line)


@pytest.mark.usefixtures("require_fuse")
def test_sigkill_mid_apply_then_the_restarted_agent_converges_without_duplicates(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    kube = cluster
    spec = tmp_path / "slow.yaml"
    spec.write_text(SLOW_SPEC)
    kube.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "swap"}}})
    with running_agent(kube, tmp_path, spec) as running:
        swap_configmap(running.config_dir, 2, SWAP)
        proc = running.start()
        state_dir = tmp_path / "state"
        wait_for("the first step", lambda: journal_steps(state_dir) >= 1, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert layout(running.root) != {"A2-4C": 1, "A2-4Q": 3}, "killed mid-apply"
        proc = running.start()
        wait_for("the layout", lambda: layout(running.root) == {"A2-4C": 1, "A2-4Q": 3}, proc)
        wait_for("success", lambda: running.state() == "success", proc)
        uuids = [v.uuid for g in scan(running.root, catalog=CATALOG).gpus for v in g.vgpus]
        assert len(uuids) == len(set(uuids)) == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def apply_window(log: Path) -> tuple[float, float]:
    """First and last host change the agent logged (seconds since the epoch)."""
    import datetime as dt

    times = [
        dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for line in log.read_text().splitlines()
        if "vgpu_state.executor.apply:" in line and line.endswith(": ok")
    ]
    assert times, f"{log} shows no host change"
    return min(times), max(times)


@pytest.mark.usefixtures("require_fuse")
def test_two_agents_with_max_unavailable_1_never_apply_at_once(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    kube = cluster
    spec = tmp_path / "slow.yaml"
    spec.write_text(SLOW_SPEC.replace("node: a2-node", "node: sim"))
    config_dir = tmp_path / "config"  # one ConfigMap, mounted on both nodes
    config_dir.mkdir()
    swap_configmap(config_dir, 1, SWAP)
    procs: list[subprocess.Popen[str]] = []
    logs: list[Path] = []
    with mounted(spec, tmp_path / "sys-1") as m1, mounted(spec, tmp_path / "sys-2") as m2:
        try:
            for i, m in ((1, m1), (2, m2)):
                node = f"gpu-{i}"
                kube.write(
                    "v1/nodes", node, {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4g"}}}
                )
                work = tmp_path / node
                work.mkdir()
                running = Running(kube, work, str(m.root), node)
                running.args[running.args.index("--config") + 1] = str(config_dir / "config.yaml")
                procs.append(running.start())
                logs.append(running.log)

            def state(node: str) -> str | None:
                found = kube.get("v1/nodes", node) or {}
                return found.get("metadata", {}).get("labels", {}).get(STATE_LABEL)

            wait_for(
                "both nodes ready",
                lambda: all(state(f"gpu-{i}") == "success" for i in (1, 2)),
                procs,
            )
            # One disruptive change for both nodes: a new layout in the shared ConfigMap.
            swap_configmap(
                config_dir, 2, SWAP.replace("a2-4g:", "old-a2-4g:").replace("swap:", "a2-4g:")
            )
            for m in (m1, m2):
                wait_for(
                    "both converged",
                    lambda m=m: layout(str(m.root)) == {"A2-4C": 1, "A2-4Q": 3},
                    procs,
                    60,
                )
            for i in (1, 2):
                wait_for("success", lambda i=i: state(f"gpu-{i}") == "success", procs)
            (a_start, a_end), (b_start, b_end) = (apply_window(log) for log in logs)
            overlap = f"{a_start:.2f}-{a_end:.2f} and {b_start:.2f}-{b_end:.2f}"
            assert a_end < b_start or b_end < a_start, f"both nodes applied at once: {overlap}"
            for p in procs:
                p.send_signal(signal.SIGTERM)
            assert [p.wait(30) for p in procs] == [0, 0]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for log in logs:
                print(log.read_text())


class Proxy:
    """A TCP forwarder to the API server that can drop every connection and refuse new ones
    (TLS passes through: the server's certificate names 127.0.0.1)."""

    def __init__(self, target: str) -> None:
        scheme, _, address = target.partition("://")
        host, _, port = address.partition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"{scheme}://127.0.0.1:{self.listener.getsockname()[1]}"
        self.up = True
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        self.up = False
        with self.lock:
            for s in self.open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.open.clear()

    def close(self) -> None:
        self.down()
        self.listener.close()


@pytest.mark.usefixtures("require_fuse")
def test_an_unreachable_api_server_leaves_the_host_alone_and_the_agent_reports_once_back(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    kube = cluster
    kube.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4g"}}})
    with contextlib.closing(Proxy(kube.url)) as proxy, running_agent(kube, tmp_path) as running:
        kubeconfig = kube.write_kubeconfig(
            tmp_path / "via-proxy", token=running.token, server=proxy.url
        )
        running.args[running.args.index("--kubeconfig") + 1] = str(kubeconfig)
        proc = running.start()
        wait_for("the first reconcile", lambda: running.state() == "success", proc)
        proxy.down()
        before = scan(running.root, catalog=CATALOG).fingerprint()
        # While the API server is away the config asks for a change: nothing happens.
        running.edit_config(CONFIG.replace("a2-4g:", "old:").replace("grow:", "a2-4g:"))
        time.sleep(3)
        after = scan(running.root, catalog=CATALOG).fingerprint()
        assert after == before, "no host change without the API"
        assert proc.poll() is None, "the agent keeps running"
        assert running.get("/readyz")[0] == 503
        assert running.get("/healthz")[0] == 200
        proxy.up = True
        wait_for("the new layout", lambda: layout(running.root).get("A2-4Q") == 2, proc, 60)
        wait_for("success", lambda: running.state() == "success", proc, 60)
        wait_for("ready", lambda: running.get("/readyz")[0] == 200, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.usefixtures("require_fuse")
def test_a_deferred_switch_runs_when_its_holder_goes_not_at_the_next_resync(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """The held A2-4C keeps every A2-8Q out: the switch waits and the free vGPUs stay;
    the VM stops (the in-use file empties) and the switch runs within seconds,
    although the resync is 300 s away."""
    kube = cluster
    kube.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "a2-4g"}}})
    # The in-use file says who holds the A2-4C; the simulated driver holds nothing
    # itself, so once the file lets go the vGPU can be destroyed.
    spec = tmp_path / "a2.yaml"
    spec.write_text(A2_SPEC.read_text().replace(', in-use: "vm default/win-1"', ""))
    with running_agent(kube, tmp_path, spec) as running:
        running.edit_config(
            CONFIG + "  a2-8q:\n    - devices: all\n      vgpu-devices: {A2-8Q: 2}\n"
        )
        running.args += ["--holder-poll", "0.5"]
        proc = running.start()
        wait_for("the first reconcile", lambda: running.state() == "success", proc)
        running.label("a2-8q")
        deferred = lambda: "switch deferred" in json.dumps(running.nodestate_so_far())  # noqa: E731
        wait_for("the deferred switch reported", deferred, proc)
        assert layout(running.root) == {"A2-4C": 1, "A2-4Q": 1, "A2-4A": 1}, "none destroyed"
        assert running.state() == "pending"

        (tmp_path / "in-use.json").write_text("{}")
        wait_for("the switch", lambda: layout(running.root) == {"A2-8Q": 2}, proc, 60)
        wait_for("success", lambda: running.state() == "success", proc)
        counted = 'vgpu_state_triggers_total{source="holders"} 1.0'
        wait_for("the trigger counted", lambda: counted in running.get("/metrics")[1], proc)
        assert 'vgpu_state_triggers_total{source="resync"} 0.0' in running.get("/metrics")[1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
