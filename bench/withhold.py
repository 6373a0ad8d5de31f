#!/usr/bin/env python3
"""Benchmark: how soon the kubelet stops offering the vGPUs a pending layout switch withholds.

A simulated A2 (``configs/sim/a2-host.yaml``: an A2-4C a VM holds, a free A2-4Q and
A2-4A) is served by vgpu-state's device plugin to the kubelet's own device manager
(``hack/k8s/cmd/kubelet-harness devicemanager``). Each run reverts the layout
(everything offered, the kubelet counting all three), then changes it to
``A2-2Q: 8`` under ``in-use: evacuate`` and times, from the moment the agent's
reconcile starts on the change (what the config watch or a label change triggers:
the reconcile reads the config, the Node's labels, scans, reads the holders and
plans):

* ``plugin``: the device plugin's lists leave the withheld vGPUs out (its change
  hook: the open ``ListAndWatch`` streams have been handed the new lists);
* ``kubelet``: the kubelet's device manager no longer counts them in the Node's
  allocatable (polled every 5 ms).

Two cases: the switch deferred by the held A2-4C (the free A2-4Q and A2-4A are
withheld), and the held VM gone, so the switch destroys vGPUs and waits for a
rollout slot that is not granted (all three withheld, before the slot is asked).

Then the whole agent as a process (as ``bench/agent.py`` runs it: ``--sim``, the
API server emulator, a stand-in kubelet on the plugin's sockets), from the Node's
layout label changing to the kubelet having lists without the withheld vGPUs:
the Node watch, the reconcile and the push, end to end; and back after the label
is reverted.

Goal: ≤ 1 s. ``--runs N`` (default 12).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.kubelet_harness import Harness, Unavailable, binary, running
from tests.withhold_support import (
    HELD_4C,
    KEEP,
    NODE,
    R_4A,
    R_4C,
    R_4Q,
    SWITCH,
    VM_HOLDER,
    a2_host,
    config,
    settings,
)
from vgpu_state.deviceplugin import DevicePluginManager
from vgpu_state.kube.api import KubeApi
from vgpu_state.model.plan import Plan
from vgpu_state.reconcile import Mode, Ports, reconcile_once
from vgpu_state.sim.host import SimHost
from vgpu_state.testing import FakeCluster

GOAL_S = 1.0
POLL_S = 0.005


def _allocatable(k: Harness) -> dict[str, int]:
    return {r: n for r, n in k.ask("capacity")["allocatable"].items() if n}


def _until(k: Harness, want: dict[str, int], timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        if _allocatable(k) == want:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the kubelet's allocatable never became {want}")
        time.sleep(POLL_S)


def run(runs: int) -> int:
    try:
        binary()
    except Unavailable as e:
        print(f"skipped: {e}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="bwh-", dir="/tmp"))
    host = SimHost(a2_host(work))
    cluster = FakeCluster(NODE)
    plugin_dir = work / "dp"
    manager = DevicePluginManager(
        str(plugin_dir), poll_interval=0.05, iommufd=False, present=lambda d: True
    )
    sent: list[float] = []

    def changed() -> None:
        if manager.withheld and not sent:
            sent.append(time.monotonic())

    manager.on_change = changed

    def reconcile(layout: str, policy: str, gate: Any = None) -> None:
        ports = Ports(host, cluster, config(layout, policy), manager)
        reconcile_once(
            ports,
            settings(),
            mode=Mode.APPLY,
            config_name="a2",
            skip_blocked=True,
            gate=gate,
        )

    def no_slot(plan: Plan) -> bool:
        return False

    results: dict[str, tuple[list[float], list[float]]] = {}
    cases: tuple[tuple[str, dict[str, str], dict[str, int]], ...] = (
        ("deferred (a VM holds the A2-4C)", {HELD_4C: VM_HOLDER}, {R_4C: 1}),
        ("planned, waiting for a rollout slot", {}, {}),
    )
    try:
        with running("devicemanager", "--dir", str(plugin_dir), log=work / "k.log") as k:
            for name, held, after in cases:
                plugin_s: list[float] = []
                kubelet_s: list[float] = []
                for _ in range(runs):
                    cluster._in_use = type(cluster._in_use)(held)
                    reconcile(KEEP, "evacuate")
                    _until(k, {R_4C: 1, R_4Q: 1, R_4A: 1})
                    sent.clear()
                    started = time.monotonic()
                    worker = threading.Thread(target=reconcile, args=(SWITCH, "evacuate", no_slot))
                    worker.start()
                    seen = _until(k, after)
                    worker.join()
                    assert sent, "the plugin's lists never left them out"
                    kubelet_s.append(seen - started)
                    plugin_s.append(sent[0] - started)
                results[name] = (plugin_s, kubelet_s)
    finally:
        manager.stop()
        host.close()
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"withheld vGPUs leave the kubelet's allocatable ({runs} runs, load {load:.1f}):")
    worst = 0.0
    for name, (plugin_s, kubelet_s) in results.items():
        med, top = statistics.median(kubelet_s), max(kubelet_s)
        worst = max(worst, top)
        print(
            f"  {name}: plugin median {statistics.median(plugin_s) * 1000:.0f} ms, "
            f"max {max(plugin_s) * 1000:.0f} ms; kubelet median {med * 1000:.0f} ms, "
            f"max {top * 1000:.0f} ms"
        )
    print(f"goal <= {GOAL_S:.0f} s: {'met' if worst <= GOAL_S else 'NOT met'}")
    return 0


AGENT_CONFIG = f"""\
version: v1
policy:
  in-use: evacuate
vgpu-configs:
  small:
    - devices: all
      vgpu-devices: {KEEP}
  large:
    - devices: all
      vgpu-devices: {SWITCH}
"""


def agent_process(runs: int) -> None:
    """The agent as a process: label change -> the stand-in kubelet's lists."""
    here = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location("bench_agent", here / "agent.py")
    assert spec is not None and spec.loader is not None
    bench_agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_agent)
    work = Path(tempfile.mkdtemp(prefix="bwh-agent-"))
    kube: Any = importlib.import_module("tests.kube_emulator").RunningEmulator().start()
    label = "nvidia.com/vgpu.config"
    withheld_s: list[float] = []
    back_s: list[float] = []
    try:
        kube.write("v1/nodes", NODE, {"metadata": {"labels": {label: "small"}}})
        api = KubeApi(kube.api_client(), kube.url, (5.0, 10.0))
        agent = bench_agent.Agent(kube, work, 600.0)
        bench_agent.swap(agent.config, 2, AGENT_CONFIG)

        def offered(r4q: int, r4a: int) -> bool:
            return bool(agent.advertised(R_4Q) == r4q and agent.advertised(R_4A) == r4a)

        bench_agent.wait_for(lambda: offered(1, 1), 60)
        try:
            for _ in range(runs):
                for want, count, into in (("large", 0, withheld_s), ("small", 1, back_s)):
                    start = time.perf_counter()
                    api.patch(
                        f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {label: want}}}, "merge"
                    )
                    bench_agent.wait_for(lambda c=count: offered(c, c))
                    into.append(time.perf_counter() - start)
        finally:
            agent.stop()
    finally:
        kube.stop()
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]

    def ms(values: list[float]) -> str:
        return (
            f"median {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"
        )

    print(f"the agent process ({runs} runs, load {load:.1f}):")
    print(f"  label change -> kubelet lists without the withheld vGPUs: {ms(withheld_s)}")
    print(f"  label reverted -> kubelet lists with them again: {ms(back_s)}")
    worst = max(withheld_s)
    print(f"goal <= {GOAL_S:.0f} s: {'met' if worst <= GOAL_S else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--no-agent", action="store_true", help="skip the agent process part")
    args = parser.parse_args()
    code = run(args.runs)
    if not args.no_agent:
        agent_process(args.runs)
    return code


if __name__ == "__main__":
    sys.exit(main())
