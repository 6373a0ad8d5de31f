#!/usr/bin/env python3
"""100 nodes add their vGPU resources to one KubeVirt CR at the same moment.

Each simulated node is a thread with its own Kubernetes client (the official
one) talking to the test API server (kmock's emulator, extended in
``tests/apiserver.py``: resource versions, 409/422, JSON Patch ``test`` ops,
KubeVirt's OpenAPI schema). Every node permits one vGPU type of its own and one
shared with other nodes (mdev types in ``mediatedDevices`` on even nodes,
vendor-VFIO types in ``pciHostDevices`` on odd ones), while another controller
keeps appending its own entries with plain read-modify-write PUTs.

Each node syncs as the agent does, with its node name: a node that loses a
race leaves its missing entries in a request annotation on the CR, and every
winning write adds all requests it sees. ``--solo`` turns that off (every node
retries only its own entries, as before); it also runs against older versions
of ``vgpu_state.kube.kubevirt`` (copy this file into an older checkout), to
compare them on the same machine.

Printed per run: guarded writes refused (422, the ``test`` op saw a change),
conflicts (409), retries, requests left on the CR by losing nodes, writes that
served other nodes' requests, wall time until every node is done, and the
entries lost (must be 0: every node's entries and every foreign entry are in
the CR exactly once at the end, the foreign ones in the order they were added,
and no request annotation is left).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.apiserver import write_kubeconfig  # noqa: E402
from vgpu_state.kube import kubevirt  # noqa: E402
from vgpu_state.kube.api import KubeApi  # noqa: E402
from vgpu_state.kube.errors import ClusterError  # noqa: E402
from vgpu_state.kube.kubevirt import Backoff, KubeVirtRef, PermittedEntry  # noqa: E402

REF = KubeVirtRef("kubevirt", "kubevirt")
SHARED_TYPES = 8


@dataclass
class NodeResult:
    attempts: int
    conflicts: int
    waited: float
    seconds: float
    requested: int
    served: int


def node_entries(i: int, own_types: int | None = None) -> list[PermittedEntry]:
    """Node ``i``'s entries: a type of its own (one of ``own_types`` when given, so nodes
    share them as a real fleet shares its few vGPU types) and one of 8 shared types."""
    shared = i % SHARED_TYPES
    own = i if own_types is None else i % own_types
    if i % 2 == 0:
        return [
            PermittedEntry(
                "mediatedDevices", f"nvidia.com/NVIDIA_A16-{own}Q", f"NVIDIA A16-{own}Q"
            ),
            PermittedEntry(
                "mediatedDevices", f"nvidia.com/NVIDIA_A2-{shared}Q", f"NVIDIA A2-{shared}Q"
            ),
        ]
    return [
        PermittedEntry("pciHostDevices", f"nvidia.com/NVIDIA_L40S-{own}Q", "10DE:26B9"),
        PermittedEntry("pciHostDevices", f"nvidia.com/NVIDIA_L4-{shared}Q", "10DE:27B8"),
    ]


@contextmanager
def api_server() -> Iterator[str]:
    """The test API server in its own process (so it does not share the GIL with the nodes)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.apiserver"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the API server did not start: {url!r}")
        yield url
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(30)


def run(
    nodes: int,
    foreign_writes: int,
    tmp: Path,
    backoff: Backoff,
    own_types: int | None = None,
    solo: bool = False,
) -> dict[str, Any]:
    with api_server() as url:
        config = str(write_kubeconfig(tmp / f"kubeconfig-{nodes}", url))
        admin = KubeApi.connect(config)
        admin.create(
            "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts",
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "KubeVirt",
                "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
                "spec": {
                    "configuration": {
                        "permittedHostDevices": {
                            "mediatedDevices": [
                                {"mdevNameSelector": "GRID T4-1Q", "resourceName": "x.io/t4"}
                            ]
                        }
                    }
                },
            },
        )
        barrier = threading.Barrier(nodes + 2)
        results: list[NodeResult] = []
        errors: list[str] = []
        lock = threading.Lock()

        def node(i: int) -> None:
            api = KubeApi.connect(config, pool_size=1)
            entries = node_entries(i, own_types)
            barrier.wait()
            started = time.perf_counter()
            try:
                # Without a node name (--solo) this runs older versions of the code too.
                named: dict[str, Any] = {} if solo else {"node": f"node-{i}"}
                r = kubevirt.sync(api, REF, entries, backoff=backoff, **named)
            except Exception as e:  # reported below; a bench must not hide failures
                with lock:
                    errors.append(f"node {i}: {e}")
                return
            with lock:
                results.append(
                    NodeResult(
                        r.attempts,
                        r.conflicts,
                        r.waited,
                        time.perf_counter() - started,
                        getattr(r, "requested", 0),
                        len(getattr(r, "served", ())),
                    )
                )

        foreign_done: list[str] = []
        foreign_conflicts = [0]

        def foreign() -> None:
            api = KubeApi.connect(config, pool_size=1)
            barrier.wait()
            for n in range(foreign_writes):
                item = {"mdevNameSelector": f"OTHER {n}", "resourceName": f"x.io/other-{n}"}
                while True:
                    cr = api.get(REF.path)
                    new = copy.deepcopy(cr)
                    devices = new["spec"]["configuration"]["permittedHostDevices"]
                    devices["mediatedDevices"] = [*devices["mediatedDevices"], item]
                    try:
                        api.replace(REF.path, new)  # a plain read-modify-write PUT
                        foreign_done.append(item["resourceName"])
                        break
                    except ClusterError:
                        foreign_conflicts[0] += 1

        threads = [threading.Thread(target=node, args=(i,)) for i in range(nodes)]
        threads.append(threading.Thread(target=foreign))
        for t in threads:
            t.start()
        barrier.wait()
        started = time.perf_counter()
        for t in threads:
            t.join(600)
        wall = time.perf_counter() - started

        cr = admin.get(REF.path)
        devices = cr["spec"]["configuration"]["permittedHostDevices"]
        present = [
            e["resourceName"]
            for name in ("mediatedDevices", "pciHostDevices")
            for e in devices.get(name, [])
        ]
        expected = {e.resource for i in range(nodes) for e in node_entries(i, own_types)}
        expected |= {"x.io/t4", *foreign_done}
        lost = sorted(expected - set(present))
        foreign_order = [
            e["resourceName"]
            for e in devices.get("mediatedDevices", [])
            if e["resourceName"].startswith("x.io/")
        ]
        annotations = cr["metadata"].get("annotations") or {}
        requests_left = [k for k in annotations if k.startswith("pending.vgpu-state.io/")]
        return {
            "nodes": nodes,
            "entries": len(present),
            "conflicts": sum(r.conflicts for r in results),
            "foreign_409": foreign_conflicts[0],
            "retries": sum(r.attempts - 1 for r in results),
            "max_retries": max((r.attempts - 1 for r in results), default=0),
            "backoff_s": sum(r.waited for r in results),
            "median_s": statistics.median(r.seconds for r in results) if results else 0.0,
            "wall_s": wall,
            "requested": sum(r.requested for r in results),
            "serving_writes": sum(1 for r in results if r.served),
            "lost": len(lost),
            "duplicates": len(present) - len(set(present)),
            "reordered": foreign_order != ["x.io/t4", *foreign_done],
            "requests_left": len(requests_left),
            "errors": errors,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[25, 50, 100])
    parser.add_argument("--foreign-writes", type=int, default=20)
    parser.add_argument("--base", type=float, default=Backoff().base, help="backoff base, s")
    parser.add_argument("--cap", type=float, default=Backoff().cap, help="backoff cap, s")
    parser.add_argument(
        "--own-types",
        type=int,
        default=None,
        help="distinct per-node types (default: one per node, the worst case; a fleet "
        "shares a few, e.g. 8)",
    )
    parser.add_argument(
        "--solo",
        action="store_true",
        help="nodes leave no requests for each other (each retries only its own entries)",
    )
    args = parser.parse_args()
    backoff = Backoff(base=args.base, cap=args.cap, attempts=Backoff().attempts)
    print(
        f"backoff: full jitter, base {backoff.base} s, cap {backoff.cap} s, "
        f"{backoff.attempts} attempts; own types per node: "
        f"{args.own_types or 'one each (worst case)'}; "
        f"{'solo (no requests)' if args.solo else 'losing nodes leave requests'}"
    )
    print(
        f"{'nodes':>5} {'entries':>7} {'conflicts':>9} {'foreign 409':>11} {'retries':>7} "
        f"{'max':>4} {'requests':>8} {'serving':>7} {'backoff s':>9} {'median s':>8} "
        f"{'converge s':>10} {'lost':>4} {'dups':>4} {'server cpu':>10} {'nodes cpu':>10}"
    )
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.nodes:
            before = os.times()
            r = run(n, args.foreign_writes, Path(tmp), backoff, args.own_types, args.solo)
            after = os.times()  # the API server's process has ended: its CPU time is in
            server_cpu = after.children_user + after.children_system
            server_cpu -= before.children_user + before.children_system
            client_cpu = after.user + after.system - before.user - before.system
            print(
                f"{r['nodes']:>5} {r['entries']:>7} {r['conflicts']:>9} {r['foreign_409']:>11} "
                f"{r['retries']:>7} {r['max_retries']:>4} {r['requested']:>8} "
                f"{r['serving_writes']:>7} {r['backoff_s']:>9.2f} "
                f"{r['median_s']:>8.2f} {r['wall_s']:>10.2f} {r['lost']:>4} {r['duplicates']:>4} "
                f"{server_cpu:>10.2f} {client_cpu:>10.2f}"
            )
            if r["reordered"]:
                print("  ! the foreign entries are not in the order they were added")
            if r["requests_left"]:
                print(f"  ! {r['requests_left']} request annotations left on the CR")
            for line in r["errors"]:
                print(f"  ! {line}")
            failed |= bool(
                r["lost"] or r["duplicates"] or r["errors"] or r["reordered"] or r["requests_left"]
            )
    print("conflicts: guarded JSON Patches refused (422) because the CR changed since the read;")
    print("foreign 409: the other controller's stale PUTs; retries: re-reads after a refusal;")
    print("requests: missing entries left on the CR by losing nodes; serving: nodes whose")
    print("accepted write also added other nodes' requests;")
    print("converge: from the common start to the last node done; lost must be 0;")
    print("server cpu: the test API server's process (one core at most); nodes cpu: all node")
    print("threads and the foreign writer together (one interpreter, so one core at most).")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
