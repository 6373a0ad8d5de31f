"""Benchmark: a fleet of agents and the controller against the real kube-apiserver.

N agents (100 by default; in-memory simulated A2 nodes, each a full ``vgpu-state
agent`` assembled as in the DaemonSet, with its own pod-bound token, run as threads
of this process) and ``vgpu-state controller`` (its own process, its own token)
against upstream's kube-apiserver and etcd (tests/realcluster.py, ``deploy/``
installed). Prints:

- steady state: API requests per node per minute (and how many are writes), from
  the API server's audit log, over ``--steady`` seconds with nothing changing;
- a fleet-wide layout change (one ConfigMap edit: every node destroys one free vGPU
  and creates two) under ``policy.max-unavailable`` = 10 % of the nodes: the time
  until every node reports success with the new layout, the most nodes seen
  holding a rollout slot at once, and the KubeVirt CR writes (the controller's)
  per change of the set of permitted resources;
- the controller's peak RSS.

Past 100 nodes (or with ``--light``) the agents are light: one thread pool writes each
node's status through the agent's own status code (``KubeCluster.write_status``, with the
node's pod-bound token) instead of running an agent per node, and the controller gets
the layouts document (``--config-file``) so that it reads every report (and makes its
fleet view every 60 s). Printed, each with its goal and the ratio to it:

- the controller's steady-state requests per minute, watches excepted, from the API
  server's audit log (by verb and resource);
- the time from one node's status change to the KubeVirt CR write it causes (median and
  p90 over ``--changes`` changes: one node starts reporting a type no other node has);
- the controller's peak RSS and the API server's CPU over the steady state;
- the controller's memory with ``--memory-nodes`` (10,000) nodes' statuses fed in
  process through the watch's decoding and the controller's cache (a process of its
  own, its peak RSS).

    python bench/fleet_cluster.py [--nodes 100] [--steady 60]
    python bench/fleet_cluster.py --nodes 1000 [--steady 120] [--changes 20]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.agent_process import A2_SPEC, STATE_LABEL, swap_configmap  # noqa: E402
from tests.apiserver import put_kubevirt  # noqa: E402
from tests.realcluster import AGENT_USER, CONTROLLER_USER, WRITE_VERBS, ControlPlane, running  # noqa: E402
from vgpu_state.agent.assemble import AgentFlags, build  # noqa: E402
from vgpu_state.agent.run import Agent  # noqa: E402

LAYOUT_LABEL = "nvidia.com/vgpu.config"
GRACE = 5  # seconds: a resource no node reports leaves the CR within the run

LAYOUTS = """\
version: v1
policy:
  max-unavailable: {slots}
vgpu-configs:
  a2-4g:
    - devices: all
      vgpu-devices: {{A2-4C: 1, A2-4Q: 1, A2-4A: 1}}
"""
# The change: the A2-4A goes (free, destroyed), two more A2-4Q come. Disruptive: a slot each.
CHANGED = LAYOUTS.replace("{{A2-4C: 1, A2-4Q: 1, A2-4A: 1}}", "{{A2-4C: 1, A2-4Q: 3}}")


def labels(plane: ControlPlane, prefix: str) -> dict[str, str | None]:
    return {
        n["metadata"]["name"]: n["metadata"].get("labels", {}).get(STATE_LABEL)
        for n in plane.list("v1/nodes")
        if n["metadata"]["name"].startswith(prefix)
    }


def host_types(agent: Agent) -> Counter[str]:
    """The vGPU types on the agent's (simulated) host, read fresh."""
    snapshot = agent.parts.ports.host.scan()
    return Counter(v.type_name for g in snapshot.gpus for v in g.vgpus if v.type_name)


def rss_peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def audit_counts(plane: ControlPlane, mark: int) -> tuple[Counter[str], Counter[str]]:
    """Requests and writes since ``mark``, by user (agents as one)."""
    requests: Counter[str] = Counter()
    writes: Counter[str] = Counter()
    for e in plane.audit(mark):
        user = e.get("user", {}).get("username", "")
        who = "agents" if user == AGENT_USER else "controller" if user == CONTROLLER_USER else ""
        if not who:
            continue
        requests[who] += 1
        if e.get("verb") in WRITE_VERBS:
            writes[who] += 1
            writes[f"{who} {e.get('objectRef', {}).get('resource', '?')}"] += 1
    return requests, writes


def kubevirt_writes(plane: ControlPlane, mark: int) -> int:
    return sum(
        1
        for e in plane.audit(mark, CONTROLLER_USER)
        if e.get("verb") == "patch"
        and e.get("objectRef", {}).get("resource") == "kubevirts"
        and e.get("responseStatus", {}).get("code") == 200
    )


def permitted(plane: ControlPlane) -> set[str]:
    cr = plane.get("kubevirt.io/v1/kubevirts", "kubevirt", "kubevirt") or {}
    devices = cr.get("spec", {}).get("configuration", {}).get("permittedHostDevices") or {}
    return {d.get("resourceName", "") for d in devices.get("mediatedDevices") or []}


def wait(what: str, check: Any, timeout: float, every: float = 0.5) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"fleet_cluster: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of steady state")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--light", action="store_true", help="light agents (past 100 nodes)")
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--memory-nodes", type=int, default=10_000)
    parser.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child)
        return
    if args.light or args.nodes > 100:
        light(args)
        return
    n = args.nodes
    slots = max(1, n // 10)
    load = os.getloadavg()
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} cores, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC"
    )
    work = Path(tempfile.mkdtemp(prefix="vgpu-fleet-cluster-"))
    agents: list[Agent] = []
    threads: list[threading.Thread] = []
    controller: subprocess.Popen[bytes] | None = None
    try:
        with running(work / "k8s") as plane:
            print(f"kube-apiserver ready in {plane.startup_seconds:.1f} s")
            put_kubevirt(plane)
            config_dir = work / "config"  # one ConfigMap, mounted on every node
            config_dir.mkdir()
            swap_configmap(config_dir, 1, LAYOUTS.format(slots=slots))
            spec_text = A2_SPEC.read_text()
            started = time.monotonic()
            for i in range(n):
                node = f"gpu-{i:03d}"
                plane.ensure_node(node, {LAYOUT_LABEL: "a2-4g"})
                home = work / node
                home.mkdir()
                spec = home / "node.yaml"
                spec.write_text(spec_text.replace("node: a2-node", f"node: {node}"))
                kubeconfig = plane.write_kubeconfig(
                    home / "kubeconfig", token=plane.agent_token(node)
                )
                flags = AgentFlags(
                    node=node,
                    config_file=config_dir / "config.yaml",
                    mode="enforce",
                    resync=300.0,
                    listen="",
                    kubeconfig=str(kubeconfig),
                    sim_spec=str(spec),
                    state_dir=home / "state",
                    device_plugin=False,
                )
                agent = build(flags)
                agents.append(agent)
                thread = threading.Thread(
                    target=agent.run, kwargs={"install_signals": False}, name=node, daemon=True
                )
                thread.start()
                threads.append(thread)
            ckube = plane.controller_kubeconfig(work / "controller.kubeconfig")
            controller = subprocess.Popen(
                [sys.executable, "-m", "vgpu_state.cli.main", "controller",
                 "--kubeconfig", str(ckube), "--identity", "c-1", "--grace", str(GRACE),
                 "--webhook-port", "0", "--log-level", "warning"],
                cwd=REPO, stdout=(work / "controller.log").open("wb"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            ready = wait(
                "every node ready",
                lambda: list(labels(plane, "gpu-").values()).count("success") == n,
                args.timeout,
            )
            wait("the KubeVirt CR permits A2-4A", lambda: any(
                "A2-4A" in r for r in permitted(plane)), 60)  # fmt: skip
            print(f"{n} agents started and reported success in {time.monotonic() - started:.1f} s"
                  f" ({ready:.1f} s after the last agent started)")  # fmt: skip

            # Steady state: nothing changes.
            time.sleep(5)
            mark = plane.audit_mark()
            time.sleep(args.steady)
            requests, writes = audit_counts(plane, mark)
            minutes = args.steady / 60
            per_node = requests["agents"] / n / minutes
            print(
                f"steady state over {args.steady:.0f} s: agents {per_node:.2f} requests per node "
                f"per minute ({writes['agents'] / n / minutes:.2f} writes), controller "
                f"{requests['controller'] / minutes:.1f} requests per minute "
                f"({writes['controller'] / minutes:.2f} writes)"
            )
            detail = {k: v for k, v in writes.items() if " " in k}
            if detail:
                print(f"  steady-state writes by resource: {dict(sorted(detail.items()))}")

            # The fleet-wide change.
            mark = plane.audit_mark()
            before = permitted(plane)
            most = 0
            holding = threading.Event()

            def watch_slots() -> None:
                nonlocal most
                while not holding.is_set():
                    held = sum(
                        1
                        for lease in plane.list("coordination.k8s.io/v1/leases", "vgpu-state")
                        if lease["metadata"]["name"].startswith("vgpu-state-rollout-")
                        and lease.get("spec", {}).get("holderIdentity")
                    )
                    most = max(most, held)
                    time.sleep(0.2)

            sampler = threading.Thread(target=watch_slots, daemon=True)
            sampler.start()
            swap_configmap(config_dir, 2, CHANGED.format(slots=slots))

            def converged() -> bool:
                if list(labels(plane, "gpu-").values()).count("success") != n:
                    return False
                wanted = Counter({"A2-4C": 1, "A2-4Q": 3})
                return all(host_types(agent) == wanted for agent in agents)

            took = wait("the fleet to converge", converged, args.timeout, every=1.0)
            holding.set()
            sampler.join(5)
            wait("A2-4A to leave the KubeVirt CR", lambda: not any(
                "A2-4A" in r for r in permitted(plane)), GRACE + 60)  # fmt: skip
            after = permitted(plane)
            cr_writes = kubevirt_writes(plane, mark)
            set_changes = 1 if after != before else 0
            print(
                f"fleet-wide change on {n} nodes, max-unavailable {slots}: converged in "
                f"{took:.1f} s; at most {most} rollout slots held at once"
            )
            print(
                f"KubeVirt CR writes: {cr_writes} for {set_changes} change of the set of "
                f"permitted resources ({len(before)} -> {len(after)})"
            )
            print(f"controller peak RSS {rss_peak_kb(controller.pid) / 1024:.0f} MB")
    finally:
        for agent in agents:
            agent.stop()
        for thread in threads:
            thread.join(10)
        if controller is not None:
            controller.terminate()
            try:
                controller.wait(10)
            except subprocess.TimeoutExpired:
                controller.kill()
        shutil.rmtree(work, ignore_errors=True)


# light agents --------------------------------------------------------------------------
GOAL_REQUESTS = 10.0  # per minute, watches excepted
GOAL_RSS_MB = 120.0  # at 1,000 nodes
GOAL_LATENCY = 2.0  # seconds, median
GOAL_MEMORY_MB = 200.0  # with 10,000 nodes


def snapshots() -> tuple[Any, Any]:
    """The A2 host's scan with its A2-4A vGPU, and without it."""
    from vgpu_state.sim.node import open_sim

    sim = open_sim(A2_SPEC)
    full = sim.host.scan()
    sim.close()
    gpus = tuple(
        g.model_copy(update={"vgpus": tuple(v for v in g.vgpus if v.type_name != "A2-4A")})
        for g in full.gpus
    )
    return full, full.model_copy(update={"gpus": gpus})


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def goal(label: str, value: float, target: float, unit: str) -> str:
    verdict = "ok" if value <= target else "MISSED"
    ratio = value / target
    return f"{label}: {value:.2f} {unit} (goal <= {target:g} {unit}, ratio {ratio:.2f}, {verdict})"


def light(args: argparse.Namespace) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.cluster import KubeCluster
    from vgpu_state.model.status import ConfigState

    n = args.nodes
    load = os.getloadavg()
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} cores, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {n} light agents"
    )
    full, without = snapshots()
    work = Path(tempfile.mkdtemp(prefix="vgpu-fleet-light-"))
    controller: subprocess.Popen[bytes] | None = None
    try:
        with running(work / "k8s") as plane:
            print(f"kube-apiserver ready in {plane.startup_seconds:.1f} s")
            put_kubevirt(plane)
            config_dir = work / "config"
            config_dir.mkdir()
            swap_configmap(config_dir, 1, LAYOUTS.format(slots=max(1, n // 10)))
            names = [f"gpu-{i:05d}" for i in range(n)]
            clusters: dict[str, KubeCluster] = {}

            def register(node: str) -> None:
                plane.ensure_node(node, {LAYOUT_LABEL: "a2-4g"})
                api = KubeApi(plane.api_client(plane.agent_token(node)), plane.url, (5.0, 30.0))
                cluster = KubeCluster(api, node, pod_resources=None)
                cluster.write_status(state=ConfigState.SUCCESS, snapshot=without)
                clusters[node] = cluster

            started = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(register, names))
            print(f"{n} nodes registered and reporting in {time.monotonic() - started:.1f} s")
            ckube = plane.controller_kubeconfig(work / "controller.kubeconfig")
            controller = subprocess.Popen(
                [sys.executable, "-m", "vgpu_state.cli.main", "controller",
                 "--kubeconfig", str(ckube), "--identity", "c-1", "--grace", str(GRACE),
                 "--config-file", str(config_dir / "config.yaml"),
                 "--webhook-port", "0", "--log-level", "warning"],
                cwd=REPO, stdout=(work / "controller.log").open("wb"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            wait("the KubeVirt CR to permit A2-4Q", lambda: any(
                "A2-4Q" in r for r in permitted(plane)), 120)  # fmt: skip

            # Steady state.
            time.sleep(15)
            apiserver = plane.procs[-1].pid
            mark, cpu0, t0 = plane.audit_mark(), cpu_seconds(apiserver), time.monotonic()
            time.sleep(args.steady)
            cpu = cpu_seconds(apiserver) - cpu0
            span = time.monotonic() - t0
            by: Counter[str] = Counter()
            for e in plane.audit(mark, CONTROLLER_USER):
                if e.get("stage") != "ResponseComplete" or e.get("verb") == "watch":
                    continue
                what = e.get("objectRef", {}).get("resource", e.get("requestURI"))
                by[f"{e.get('verb')} {what}"] += 1
            per_minute = sum(by.values()) / (span / 60)
            print(goal(f"controller steady state over {span:.0f} s, requests per minute "
                       "(watches excepted)", per_minute, GOAL_REQUESTS, "req/min"))  # fmt: skip
            print(f"  by verb and resource: {dict(sorted(by.items()))}")
            print(f"  kube-apiserver CPU over the steady state: {cpu / span * 100:.1f} % of a core")

            # Status change -> CR write.
            latencies: list[float] = []
            for i in range(args.changes):
                node = names[(i * 7919) % n]
                sent = time.monotonic()
                clusters[node].write_status(state=ConfigState.SUCCESS, snapshot=full)
                written = time.monotonic()
                wait("A2-4A in the KubeVirt CR", lambda: any(
                    "A2-4A" in r for r in permitted(plane)), 60, every=0.02)  # fmt: skip
                latencies.append(time.monotonic() - written)
                del sent
                clusters[node].write_status(state=ConfigState.SUCCESS, snapshot=without)
                wait("A2-4A to leave the KubeVirt CR", lambda: not any(
                    "A2-4A" in r for r in permitted(plane)), GRACE + 60, every=0.1)  # fmt: skip
            print(goal(f"status change -> KubeVirt CR write, median of {len(latencies)}",
                       percentile(latencies, 0.5), GOAL_LATENCY, "s"))  # fmt: skip
            print(f"  p90 {percentile(latencies, 0.9):.2f} s, max {max(latencies):.2f} s")
            print(goal(f"controller peak RSS at {n} nodes", rss_peak_kb(controller.pid) / 1024,
                       GOAL_RSS_MB, "MB"))  # fmt: skip
    finally:
        if controller is not None:
            controller.terminate()
            try:
                controller.wait(10)
            except subprocess.TimeoutExpired:
                controller.kill()
        shutil.rmtree(work, ignore_errors=True)
    if args.memory_nodes:
        child = subprocess.run(
            [sys.executable, __file__, "--memory-child", str(args.memory_nodes)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        print(child.stdout.strip())


def memory_child(n: int) -> None:
    """``n`` nodes' statuses (as the agent builds them) through the watch's event decoding
    and the controller's caches (each node's report, and its part of the fleet view,
    planned from the status with its Node's labels), then one pass's reports and one
    fleet view from them: the peak RSS."""
    import json

    from vgpu_state.catalog import default_catalog
    from vgpu_state.config.source import FileConfigSource
    from vgpu_state.controller.fleetcache import FleetCache
    from vgpu_state.controller.informers import NodeStateCache
    from vgpu_state.controller.run import Controller, ControllerSettings
    from vgpu_state.kube import informer, nodestate
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.transport import Endpoint, Transport
    from vgpu_state.reconcile.settings import Settings

    full, _ = snapshots()
    work = Path(tempfile.mkdtemp(prefix="vgpu-fleet-memory-"))
    layouts = work / "layouts.yaml"
    layouts.write_text(LAYOUTS.format(slots=1))
    catalog = default_catalog()
    ctl = Controller(
        KubeApi(Transport(Endpoint(server="http://127.0.0.1:9")), "memory", (1.0, 1.0)),
        ControllerSettings("m", layouts=FileConfigSource(layouts, catalog), catalog=catalog),
    )
    bounds, _ = ctl._layout_bounds()
    assert bounds is not None
    changes = []
    cache = ctl._cache = NodeStateCache(ctl._read_kept, lambda: changes.append(1))
    cache.listed({}, {}, bounds)
    source = FileConfigSource(layouts, catalog)
    fleet = FleetCache(Settings(catalog=catalog), dt.timedelta(minutes=30), lambda: now)
    fleet._document, fleet._ready = source.document(), True  # as after a list of none
    before = rss_peak_kb(os.getpid())
    now = dt.datetime.now(dt.UTC)

    class Lines:
        def __init__(self, lines: list[bytes]) -> None:
            self.lines = lines

        def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
            yield from self.lines

    for i in range(n):
        labels = {LAYOUT_LABEL: "a2-4g"}
        fleet.node_event("ADDED", {"metadata": {"name": f"gpu-{i:05d}", "labels": labels}})
    for start in range(0, n, 500):
        lines = []
        for i in range(start, min(n, start + 500)):
            node = f"gpu-{i:05d}"
            snap = full.model_copy(update={"node": node})
            gpus, capacity = nodestate.layout_status(snap, {})
            status = nodestate.VGPUNodeStateStatus(
                state="success", gpus=gpus, capacity=capacity,
                vgpu_count=sum(len(g.vgpus) for g in gpus),
                snapshot=nodestate.reported_snapshot(snap, now, None),
            )  # fmt: skip
            obj = {
                "apiVersion": nodestate.API_VERSION, "kind": nodestate.KIND,
                "metadata": {"name": node, "resourceVersion": str(i + 10), "uid": f"uid-{i}"},
                "spec": {"nodeName": node}, "status": status.to_json(),
            }  # fmt: skip
            lines.append(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
        for event in informer.events(Lines(lines), "a watch event"):
            cache.event(str(event["type"]), event["object"])
            fleet.state_event(str(event["type"]), event["object"])
        del lines
    reports = ctl._current(bounds)
    totals = fleet.totals(ctl.api)
    assert totals.nodes == n and totals.unchanged == n, totals
    peak = rss_peak_kb(os.getpid()) / 1024
    justified = sum(1 for r in reports if r.entries)
    assert justified == n, f"{justified} of {n} reports justify entries"
    print(goal(f"controller memory with {len(reports)} nodes' statuses (fed in process "
               f"through the watch's decoding, the reports' and the fleet view's caches; "
               f"{before / 1024:.0f} MB before the first)",
               peak, GOAL_MEMORY_MB, "MB"))  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
