"""Benchmark: what the controller's evacuation step (``in-use: evacuate``) costs per pass.

Upstream's kube-apiserver and etcd (tests/realcluster.py, ``deploy/`` installed) with
KubeVirt's VM, VMI and migration CRDs (KubeVirt's own OpenAPI, ``hack/kubevirt/fetch.sh``).
``--nodes`` nodes (500 by default) report statuses in the agents' shape (written as the
admin, as bench/fleet_cluster.py's light agents do): ``--evacuating`` of them (5) have an
A2 whose switch to 8 × A2-2Q is deferred for one running VM each, the rest offer free
A2-4Q. The controller runs in this process as its own ServiceAccount. Printed, with the
machine's load:

- a pass that starts a migration (the budget free): its wall time and the controller's
  requests, by verb and resource, from the API server's audit log;
- a pass while that migration runs (the budget of 1 spent): the same;
- the pure decision over the fleet (``evacuation.decide``), median of 20.

    python bench/evacuation.py [--nodes 500] [--evacuating 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.realcluster import CONTROLLER_USER, running  # noqa: E402
from tests.test_evacuation_real import (  # noqa: E402
    NS,
    Clock,
    controller,
    layouts,
    migrations,
    place_vm,
    report,
    status,
)
from vgpu_state.controller import evacuation as ev  # noqa: E402
from vgpu_state.model.policy import Evacuation  # noqa: E402


def requests(plane: object, mark: int) -> Counter[str]:
    by: Counter[str] = Counter()
    for e in plane.audit(mark, CONTROLLER_USER):  # type: ignore[attr-defined]
        if e.get("stage") != "ResponseComplete":
            continue
        by[f"{e['verb']} {e.get('objectRef', {}).get('resource', e.get('requestURI'))}"] += 1
    return by


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--evacuating", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} cores, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {args.nodes} nodes, "
        f"{args.evacuating} evacuating"
    )
    work = Path(tempfile.mkdtemp(prefix="vgpu-evac-bench-"))
    with running(work / "k8s") as plane:
        plane.install_kubevirt_vms()
        plane.write("kubevirt.io/v1/kubevirts", "kubevirt", {"spec": {}}, "kubevirt")
        names = [f"gpu-{i:05d}" for i in range(args.nodes)]

        def register(i: int) -> None:
            node = names[i]
            if i < args.evacuating:
                plane.ensure_node(node, {"nvidia.com/vgpu.config": "a2-2q"})
                report(plane, node, status(node, [f"{NS}/vm-{i}"], switch=True))
                place_vm(plane, f"vm-{i}", node)
            else:
                plane.ensure_node(node, {"nvidia.com/vgpu.config": "a2-4q"})
                report(plane, node, status(node, [f"{NS}/held-{i}"], switch=False))

        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(register, range(args.nodes)))
        print(f"{args.nodes} nodes reporting in {time.monotonic() - started:.1f} s")
        ctl = controller(plane, work, layouts(), Clock())
        ctl.run_once()  # the first pass: leads, lists, writes the CR; one migration starts
        assert len(migrations(plane)) == 1
        for label in ("budget free: starts a migration", "budget spent: a migration runs"):
            if label.startswith("budget free"):
                plane.request(
                    "DELETE",
                    f"/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachineinstancemigrations",
                )
            mark = plane.audit_mark()
            t0 = time.perf_counter()
            ctl.run_once()
            took = time.perf_counter() - t0
            by = requests(plane, mark)
            print(f"pass, {label}: {took * 1000:.0f} ms, {sum(by.values())} requests")
            print(f"  {dict(sorted(by.items()))}")

        nodes = [ev.read_node(obj) for obj in plane.list("vgpu-state.io/v1alpha1/vgpunodestates")]
        configs = {
            n.name: ev.NodeConfig(n.name < names[args.evacuating], Evacuation(), "fp")
            for n in nodes
        }
        vmis = {}
        for i in range(args.evacuating):
            vmi = plane.get("kubevirt.io/v1/virtualmachineinstances", f"vm-{i}", NS)
            if vmi is None:
                raise SystemExit(f"VMI {NS}/vm-{i} was not created")
            vmis[f"{NS}/vm-{i}"] = ev.read_vmi(vmi)
        now = dt.datetime.now(dt.UTC)
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            ev.decide(nodes, configs, Evacuation(max_in_flight=10), [], vmis, {}, {}, now)
            times.append(time.perf_counter() - t0)
        print(f"decide over {len(nodes)} nodes: median {statistics.median(times) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
