#!/usr/bin/env python3
"""Benchmark: the agent as a real process against the API server emulator and a simulated node.

Prints
* the latency from a Node label change, and from a ConfigMap swap, to the
  device plugin advertising the new devices (a stand-in kubelet on a unix
  socket receives the agent's ListAndWatch updates; timed until it has the new
  list), and to the node converged (the state label back at ``success``);
* idle CPU and RSS over a stretch of resyncs (``--idle`` seconds, default 60;
  the goal is stated for 10 minutes: pass ``--idle 600``) of that agent (enforce,
  ``--sim``);
* the RSS of an agent started as the shipped DaemonSet starts it (deploy/ and the
  Helm chart's defaults, with the container's environment variables): plan-only,
  sysfs (the simulated A2 host served through FUSE at ``--sysfs-root``, the
  simulator in a process of its own), the device
  plugin on, DRA off, the KubeVirt CR read, the kubelet's pod-resources API (a
  stand-in); only the credentials differ (a kubeconfig, not the in-cluster service
  account). It is started twice: the first start compiles the bytecode of what it
  imports, as the image has it compiled (build/bench-pycache); the second is
  measured. With it, where the memory goes: the process's mappings by file;
  without FUSE this part is skipped;
* threads, file descriptors and sockets after 100 and after 1,000 reconciles
  (resync every 20 ms), which must not grow (the host lock's descriptor, open
  while a reconcile runs, is not counted).

    python bench/agent.py [--idle SECONDS] [--reconciles N]
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vgpu_state.kube.api import KubeApi  # noqa: E402
from vgpu_state.testing.deviceplugin_kubelet import DevicePluginKubelet  # noqa: E402

NODE = "a2-node"
STATE = "nvidia.com/vgpu.config.state"
SPEC = REPO / "configs" / "sim" / "a2-host.yaml"
CONFIG = """\
version: v1
vgpu-configs:
  small:
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 1}
  large:
    - devices: all
      vgpu-devices: {A2-4C: 1, A2-4Q: 3}
"""
LATENCY_GOAL = 1.0  # seconds, plus driver time
RSS_GOAL_MB = 60.0
SHIPPED_SETTLE_S = 20.0  # seconds before the shipped agent is measured
WARM_UP_S = 8.0  # the shipped agent's first start, which compiles its modules
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"


def swap(directory: Path, generation: int, text: str) -> None:
    version = directory / f"..gen_{generation}"
    version.mkdir()
    (version / "config.yaml").write_text(text)
    (directory / "..data_tmp").symlink_to(version.name)
    os.rename(directory / "..data_tmp", directory / "..data")
    if not (directory / "config.yaml").is_symlink():
        (directory / "config.yaml").symlink_to("..data/config.yaml")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    def __init__(self, kube: Any, work: Path, resync: float) -> None:
        self.kube = kube
        self.kubelet = DevicePluginKubelet(str(work / f"dp-{resync}"))
        self.kubelet.start()
        self.work = work
        self.config = work / f"config-{resync}"
        self.config.mkdir()
        swap(self.config, 1, CONFIG)
        spec = work / f"node-{resync}.yaml"
        spec.write_text(SPEC.read_text())
        self.port = free_port()
        args = [
            "agent",
            "--node",
            NODE,
            "--config",
            str(self.config / "config.yaml"),
            "--kubeconfig",
            str(kube.write_kubeconfig(work / "kubeconfig")),
            "--sim",
            str(spec),
            "--state-dir",
            str(work / f"state-{resync}"),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--resync",
            str(resync),
            "--mode",
            "enforce",
            "--no-kubevirt",
            "--device-plugin-dir",
            self.kubelet.plugin_dir,
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vgpu_state.cli.main", *args],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=(work / f"agent-{resync}.log").open("w"),
        )

    def metric(self, name: str) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return 0.0  # not serving yet
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    def proc_stats(self) -> dict[str, float]:
        """The smallest of a few samples: a scrape of /metrics in flight has its own thread."""
        samples = []
        for _ in range(5):
            time.sleep(0.05)
            samples.append(self._sample())
        return {k: min(s[k] for s in samples) for k in samples[0]} | {"cpu_s": samples[-1]["cpu_s"]}

    def _sample(self) -> dict[str, float]:
        pid = self.proc.pid
        targets = self.fd_targets()
        # The host lock is open while a reconcile runs (nearly always, at a 20 ms resync).
        fds = [t for t in targets if not t.endswith("/apply.lock")]
        sockets = sum(1 for t in fds if t.startswith("socket:"))
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(
            next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
        )
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        return {
            "threads": len(os.listdir(f"/proc/{pid}/task")),
            "fds": len(fds),
            "sockets": sockets,
            "rss_mb": rss_kb / 1024,
            "cpu_s": cpu,
        }

    def fd_targets(self) -> list[str]:
        pid = self.proc.pid
        targets = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
        return sorted(targets)

    def advertised(self, resource: str) -> int:
        """Healthy devices the kubelet was last told of."""
        return sum(d.health == "Healthy" for d in self.kubelet.devices(resource) or ())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self.kubelet.stop()
        return code


def has_devices(agent: Agent, n: int) -> bool:
    return agent.advertised(A2_4Q) == n


def wait_for(check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("bench failed: timed out")
        time.sleep(0.002)


def shipped_rss(
    kube: Any, work: Path, settle: float
) -> tuple[float, list[tuple[str, float]]] | None:
    """The idle RSS (MB) of an agent started with the DaemonSet's flags, and its mappings'
    RSS by file (MB, largest first); ``None`` without FUSE."""
    from vgpu_state.sim.fuse import fuse_unavailable_reason

    reason = fuse_unavailable_reason()
    if reason:
        print(f"shipped configuration: skipped ({reason})")
        return None
    pods = importlib.import_module("tests.kubelet_podresources")
    root = work / "shipped"
    root.mkdir()
    mount = root / "sys"
    spec = root / "node.yaml"
    spec.write_text(SPEC.read_text())
    subprocess.run(
        [sys.executable, "-m", "vgpu_state.sim", "mount", "--spec", str(spec), str(mount)],
        check=True,
    )
    kubelet = DevicePluginKubelet(str(root / "dp"))
    kubelet.start()
    config = root / "config"
    config.mkdir()
    swap(config, 1, CONFIG)
    try:
        with pods.serving(root / "pod-resources.sock", pods.PodResourcesKubelet()):
            # deploy/daemonset.yaml's arguments; the paths are this machine's.
            args = [
                "agent",
                "--node",
                NODE,
                "--mode",
                "plan-only",
                "--config",
                str(config / "config.yaml"),
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--proc-root",
                "/proc",
                "--sysfs-root",
                str(mount),
                "--state-dir",
                str(root / "state"),
                "--device-plugin-dir",
                kubelet.plugin_dir,
                "--pod-resources",
                str(root / "pod-resources.sock"),
                "--kubeconfig",
                str(kube.write_kubeconfig(root / "kubeconfig")),
            ]
            # A first start writes the bytecode of every module it imports (as the image
            # has it compiled); the second is measured.
            for run, wait in (("warm-up", min(settle, WARM_UP_S)), ("measured", settle)):
                proc = subprocess.Popen(
                    [sys.executable, *daemonset_flags(), "-m", "vgpu_state.cli.main", *args],
                    cwd=REPO,
                    env=shipped_env(),
                    stdout=subprocess.DEVNULL,
                    stderr=(root / f"agent-{run}.log").open("w"),
                )
                try:
                    time.sleep(wait)
                    if proc.poll() is not None:
                        raise SystemExit(
                            f"bench failed: the shipped agent exited ({root}/agent-{run}.log)"
                        )
                    rss = _rss_mb(proc.pid)
                    where = mappings_mb(proc.pid)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
    finally:
        kubelet.stop()
        subprocess.run(["fusermount3", "-u", str(mount)], check=False)
    return rss, where


def shipped_env() -> dict[str, str]:
    """The shipped agent's environment: the DaemonSet's values, and the bytecode of
    every module compiled as the image has it (deploy/Dockerfile: ``-OO`` bytecode
    without column tables), kept in build/bench-pycache (``PYTHONPYCACHEPREFIX``),
    whatever this machine's interpreter has compiled."""
    env = {**os.environ, **daemonset_env()}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(REPO / "build" / "bench-pycache")
    return env


def _agent_container() -> dict[str, Any]:
    from ruamel.yaml import YAML

    daemonset = YAML(typ="safe").load((REPO / "deploy" / "daemonset.yaml").read_text())
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    agent: dict[str, Any] = next(c for c in containers if c["name"] == "agent")
    return agent


def daemonset_flags() -> list[str]:
    """The interpreter's flags of the DaemonSet's ``command`` (``-OO -X no_debug_ranges``):
    what stands between the interpreter and ``-m``."""
    command = [str(c) for c in _agent_container().get("command") or ()]
    if "-m" not in command:
        return []
    return command[1 : command.index("-m")]


def daemonset_env() -> dict[str, str]:
    """The environment variables deploy/daemonset.yaml gives the agent's container as
    plain values (not those taken from the pod: the node's name, the namespace)."""
    agent = _agent_container()
    return {e["name"]: str(e["value"]) for e in agent.get("env") or () if "value" in e}


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
        / 1024
    )


def mappings_mb(pid: int) -> list[tuple[str, float]]:
    """RSS by mapped file (``[anon]`` and ``[heap]``: the interpreter's objects and C
    allocations), from /proc/PID/smaps, largest first."""
    found: dict[str, float] = {}
    where = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and "-" in parts[0] and ":" in parts[3]:
            name = parts[5] if len(parts) > 5 else "[anon]"
            where = "[anon]" if name.startswith("[stack") else name
        elif parts and parts[0] == "Rss:":
            found[where] = found.get(where, 0.0) + int(parts[1]) / 1024
    return sorted(found.items(), key=lambda item: -item[1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--reconciles", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--settle", type=float, default=SHIPPED_SETTLE_S)
    opts = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vgpu-bench-agent-"))
    kube: Any = importlib.import_module("tests.kube_emulator").RunningEmulator().start()
    try:
        kube.write("v1/nodes", NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": "small"}}})
        api = KubeApi(kube.api_client(), kube.url, (5.0, 10.0))

        def state() -> str | None:
            node = kube.get("v1/nodes", NODE) or {}
            value = node.get("metadata", {}).get("labels", {}).get(STATE)
            return str(value) if value is not None else None

        def config_name() -> str:
            node = kube.get("v1/nodes", NODE) or {}
            return str(
                node.get("metadata", {}).get("annotations", {}).get("vgpu-state.io/applied-config")
            )

        # 1. Latency (resync far away: only the watches can trigger).
        agent = Agent(kube, work, 600.0)
        wait_for(lambda: state() == "success" and config_name() == "small")
        label_times: list[float] = []
        label_kubelet: list[float] = []
        for i in range(opts.rounds):
            want = "large" if i % 2 == 0 else "small"
            devices = 3 if want == "large" else 1
            done = agent.metric("vgpu_state_reconciles_total")
            start = time.perf_counter()
            api.patch(
                f"/api/v1/nodes/{NODE}",
                {"metadata": {"labels": {"nvidia.com/vgpu.config": want}}},
                "merge",
            )

            def switched(want: str = want, done: float = done) -> bool:
                return (
                    config_name() == want
                    and state() == "success"
                    and agent.metric("vgpu_state_reconciles_total") > done
                )

            wait_for(partial(has_devices, agent, devices))
            label_kubelet.append(time.perf_counter() - start)
            wait_for(switched)
            label_times.append(time.perf_counter() - start)
        swap_times: list[float] = []
        swap_kubelet: list[float] = []
        text = CONFIG
        for i in range(opts.rounds):
            # The label stays; the layout it names changes (A2-4Q 3 <-> 2).
            text = (
                text.replace("A2-4Q: 3", "A2-4Q: 2")
                if i % 2 == 0
                else text.replace("A2-4Q: 2", "A2-4Q: 3")
            )
            devices = 2 if i % 2 == 0 else 3
            done = agent.metric("vgpu_state_reconciles_total")
            start = time.perf_counter()
            swap(agent.config, i + 2, text)
            wait_for(partial(has_devices, agent, devices))
            swap_kubelet.append(time.perf_counter() - start)

            def applied(done: float = done) -> bool:
                return agent.metric("vgpu_state_reconciles_total") > done and state() == "success"

            wait_for(applied)
            swap_times.append(time.perf_counter() - start)
        # 2. Idle.
        before = agent.proc_stats()
        time.sleep(opts.idle)
        after = agent.proc_stats()
        assert agent.stop() == 0
        idle_cpu = (after["cpu_s"] - before["cpu_s"]) / opts.idle * 100

        # 3. Many reconciles (resync every 20 ms).
        busy = Agent(kube, work, 0.02)
        wait_for(lambda: busy.metric("vgpu_state_reconciles_total") >= 100, 120)
        at_100 = busy.proc_stats()
        fds_100 = busy.fd_targets()
        n100 = busy.metric("vgpu_state_reconciles_total")
        wait_for(
            lambda: busy.metric("vgpu_state_reconciles_total") >= opts.reconciles,
            5.0 * opts.reconciles,
        )
        at_n = busy.proc_stats()
        fds_n = busy.fd_targets()
        n = busy.metric("vgpu_state_reconciles_total")
        assert busy.stop() == 0

        # 4. The shipped configuration.
        shipped = shipped_rss(kube, work, opts.settle)
    finally:
        kube.stop()

    def ms(values: list[float]) -> str:
        return f"median {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"

    print(
        f"label change -> kubelet has the new devices:   {ms(label_kubelet)} "
        f"over {len(label_kubelet)} (goal <= {LATENCY_GOAL:.0f} s + driver time; "
        f"ratio {statistics.median(label_kubelet) / LATENCY_GOAL:.2f})"
    )
    print(
        f"ConfigMap swap -> kubelet has the new devices: {ms(swap_kubelet)} "
        f"over {len(swap_kubelet)} (ratio {statistics.median(swap_kubelet) / LATENCY_GOAL:.2f})"
    )
    print(
        f"label change -> converged:   {ms(label_times)} over {len(label_times)} "
        f"(goal <= {LATENCY_GOAL:.0f} s + driver time; "
        f"ratio {statistics.median(label_times) / LATENCY_GOAL:.2f})"
    )
    print(
        f"ConfigMap swap -> converged: {ms(swap_times)} over {len(swap_times)} "
        f"(ratio {statistics.median(swap_times) / LATENCY_GOAL:.2f})"
    )
    print(
        f"idle {opts.idle:.0f} s, resync 600 s (enforce, --sim): CPU {idle_cpu:.2f} %, "
        f"RSS {after['rss_mb']:.1f} MB"
    )
    if shipped is not None:
        rss, where = shipped
        print(
            f"shipped configuration (plan-only, sysfs, device plugin, no DRA), idle "
            f"{opts.settle:.0f} s: RSS {rss:.1f} MB (goal <= {RSS_GOAL_MB:.0f} MB; "
            f"ratio {rss / RSS_GOAL_MB:.2f})"
        )
        shown = [(name, mb) for name, mb in where if mb >= 0.3]
        rest = sum(mb for name, mb in where if mb < 0.3)
        print(
            "  by mapping: "
            + ", ".join(f"{Path(name).name} {mb:.1f}" for name, mb in shown)
            + f", other files {rest:.1f} MB"
        )
    for label, s, count in (("after", at_100, n100), ("after", at_n, n)):
        print(
            f"{label} {count:.0f} reconciles: threads {s['threads']:.0f}, fds {s['fds']:.0f}, "
            f"sockets {s['sockets']:.0f}, RSS {s['rss_mb']:.1f} MB"
        )
    grew = [k for k in ("threads", "fds", "sockets") if at_n[k] > at_100[k]]
    new = sorted((Counter(fds_n) - Counter(fds_100)).elements())
    if new:
        print("descriptors open at the end and not after 100: " + ", ".join(new))
    print("growth over the reconciles: " + (", ".join(grew) if grew else "none"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
