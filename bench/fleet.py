#!/usr/bin/env python3
"""Benchmark: ``vgpu-state fleet plan`` over a fleet of N nodes (1,000 by default).

The fleet: GPU nodes of six pools (A2, T4, A16 and A40 with mdev, L40S and L4
with vendor-specific VFIO), 1 to 8 GPUs each, each node's existing layout what
the current config made (mdev UUIDs of its own), every fourth node with a vGPU
held by a VM. Each
node's ``VGPUNodeState`` status is built by the status writer's own pieces
(layout, capacity, the encoded scan) from a scan of a simulated node; its Node
object is a realistic one (labels, annotations, conditions, images). The
config under review changes three of the six pools.

A small HTTP server in its own process serves the two lists (as an API server
serves them from its watch cache, paged when the client asks with ``limit``),
so the timing is the command's: start-up and imports, the list requests,
decoding, planning, rendering. Printed per fleet size and output (table,
``-o json``): the median wall time, CPU time (user + system) and peak RSS of
``fleet plan`` as a process, and the ratios to the goals (``TARGETS``: 1,000
nodes in 1 s; 10,000 nodes in 4 s with ``-j 2`` and in 6 s with ``-j 1``; 400 MB).
``--jobs 1,2`` measures each of those (the command's default, one process per
CPU, when not given). ``--compare TREE`` runs another checkout's code
interleaved with this one's, run by run (how "before" is measured), and
several sizes (``--nodes 1000,10000,20000``) print how the wall time grows.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.server
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vgpu_state.model.snapshot import NodeSnapshot

NODES = 1000
RUNS = 5
TARGETS: dict[tuple[int, int | None], tuple[float, float]] = {
    (1000, None): (1.0, 400.0),
    (10000, 2): (4.0, 400.0),
    (10000, 1): (6.0, 400.0),
}
"""(fleet size, ``--jobs``; ``None``: any) -> (wall seconds, peak RSS MB) that ``fleet
plan`` must stay within on a quiet machine."""


def target_for(count: int, jobs: int | None) -> tuple[float, float] | None:
    return TARGETS.get((count, jobs)) or TARGETS.get((count, None))


@dataclass(frozen=True)
class Pool:
    name: str
    model: str
    layout: str
    per_gpu: tuple[tuple[str, int], ...]
    gpu_counts: tuple[int, ...]
    vfs: bool = True


POOLS = (
    Pool("vdi-a2", "A2", "mdev", (("A2-4Q", 4),), (1, 2)),
    Pool("vdi-t4", "T4", "mdev", (("T4-4Q", 4),), (1, 2, 4), vfs=False),
    Pool("vdi-a16", "A16", "mdev", (("A16-4Q", 4),), (4, 8)),
    Pool("ml-a40", "A40", "mdev", (("A40-24C", 2),), (2, 4, 8)),
    Pool("render-l40s", "L40S", "vendor-vfio", (("L40S-12Q", 4),), (2, 4, 8)),
    Pool("infer-l4", "L4", "vendor-vfio", (("L4-6Q", 4),), (1, 2, 4, 8)),
)

# The config under review: vdi-a2 halves its vGPUs' size, render-l40s moves two of
# four vGPUs to the compute series, infer-l4 goes from 6 GB to 4 GB vGPUs.
CONFIG = """\
version: v1
policy:
  in-use: protect
  prune: true
  sriov: auto
node-selectors:
  - match-labels: {pool: vdi-a2}
    config: vdi-a2
  - match-labels: {pool: vdi-t4}
    config: vdi-t4
  - match-labels: {pool: vdi-a16}
    config: vdi-a16
  - match-labels: {pool: ml-a40}
    config: ml-a40
  - match-labels: {pool: render-l40s}
    config: render-l40s
  - match-labels: {pool: infer-l4}
    config: infer-l4
vgpu-configs:
  vdi-a2:
    - devices: all
      vgpu-devices: {A2-2Q: 8}
  vdi-t4:
    - devices: all
      vgpu-devices: {T4-4Q: 4}
  vdi-a16:
    - devices: all
      vgpu-devices: {A16-4Q: 4}
  ml-a40:
    - devices: all
      vgpu-devices: {A40-24C: 2}
  render-l40s:
    - devices: all
      vgpu-devices: {L40S-12Q: 2, L40S-12C: 2}
  infer-l4:
    - devices: all
      vgpu-devices: {L4-4Q: 6}
"""


def shapes() -> list[tuple[Pool, int]]:
    return [(pool, n) for pool in POOLS for n in pool.gpu_counts]


def spec_text(pool: Pool, gpus: int) -> str:
    lines = ["node: shape", "driver: {flavour: all}", "extra-pci-devices: 16", "gpus:"]
    for i in range(gpus):
        lines += [
            f'  - address: "0000:{0x11 + i * 0x10:02x}:00.0"',
            f"    model: {pool.model}",
            f"    layout: {pool.layout}",
            "    vgpus:",
        ]
        vf = 0
        for name, count in pool.per_gpu:
            for _ in range(count):
                where = f", vf: {vf}" if pool.vfs else ""
                lines.append(f"      - {{type: {name}{where}}}")
                vf += 1
    return "\n".join(lines) + "\n"


def node_object(name: str, labels: dict[str, str], gpus: int) -> dict[str, Any]:
    """A Node as the API server lists it (the parts a real one has; no managedFields)."""
    now = "2026-11-23T09:00:00Z"
    conditions = [
        {
            "type": t,
            "status": "False" if t != "Ready" else "True",
            "reason": f"Kubelet{t}",
            "message": f"kubelet reports {t}",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
    ]
    images = [
        {
            "names": [f"registry.example.com/team/image-{k}@sha256:{k:064x}", f"image-{k}:v1"],
            "sizeBytes": 100_000_000 + k,
        }
        for k in range(12)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
            "resourceVersion": "1000",
            "creationTimestamp": now,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
                "vgpu-state.io/applied-config": labels["pool"],
            },
        },
        "spec": {"podCIDR": "10.244.0.0/24", "providerID": f"metal://{name}"},
        "status": {
            "capacity": {"cpu": "64", "memory": "528000000Ki", "pods": "110"},
            "allocatable": {"cpu": "63", "memory": "520000000Ki", "pods": "110"},
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "machineID": "0" * 32,
                "kernelVersion": "6.8.0-45-generic",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.31.2",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
            "images": images,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        },
    }


def fleet_items(
    count: int, scanned: datetime.datetime
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The fleet's ``count`` nodes, in name order: (Node, ``VGPUNodeState``) per node.

    Each shape (pool, GPU count) is scanned once on a simulated node; every node of
    that shape reports that scan under its own name, every fourth node with its
    first vGPU held by a VM.
    """
    from vgpu_state.catalog import default_catalog
    from vgpu_state.kube.nodestate import (
        API_VERSION,
        KIND,
        VGPUNodeStateStatus,
        encode_snapshot,
        layout_status,
    )
    from vgpu_state.model.status import ConfigState
    from vgpu_state.sim.host import SimHost
    from vgpu_state.sim.spec import parse_spec

    scans = {}
    for pool, gpus in shapes():
        with SimHost(
            parse_spec(spec_text(pool, gpus), catalog=default_catalog()), in_memory=True
        ) as host:
            scans[(pool.name, gpus)] = host.scan()
    all_shapes = shapes()
    width = max(4, len(str(count - 1)))
    names = []
    for i in range(count):
        pool, gpus = all_shapes[i % len(all_shapes)]
        names.append((f"gpu-{pool.name}-{i:0{width}d}", i, pool, gpus))
    for name, i, pool, gpus in sorted(names):  # an API server lists in name order
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": f"gpu-{pool.model.lower()}-x{gpus}",
            "topology.kubernetes.io/zone": f"zone-{i % 3}",
            "topology.kubernetes.io/region": "region-1",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": pool.model,
            "nvidia.com/gpu.count": str(gpus),
            "feature.node.kubernetes.io/pci-10de.present": "true",
            "pool": pool.name,
        }
        snapshot = own_uuids(scans[(pool.name, gpus)].model_copy(update={"node": name}))
        held: dict[str, str] = {}
        if i % 4 == 0:
            first = snapshot.gpus[0].vgpus[0]
            # As the agent names a virt-launcher pod's holder (PodHolder).
            held[first.key] = f"pod vms/virt-launcher-vm-{i}-abcde (VM vms/vm-{i})"
        gpu_status, capacity = layout_status(snapshot, held)
        status = VGPUNodeStateStatus(
            state=ConfigState.SUCCESS,
            gpus=gpu_status,
            capacity=capacity,
            vgpu_count=sum(len(g.vgpus) for g in gpu_status),
            snapshot=encode_snapshot(snapshot, scanned),
        )
        state = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": name,
                "resourceVersion": "2000",
                "generation": 1,
                "labels": {"vgpu-state.io/node": name},
            },
            "spec": {"nodeName": name},
            "status": status.to_json(),
        }
        yield node_object(name, labels, gpus), state


def own_uuids(snapshot: NodeSnapshot) -> NodeSnapshot:
    """The scan with mdev UUIDs of the node's own, as vgpu-state derives them (uuid5 of
    node, GPU and slot): on a real fleet no two nodes share an mdev UUID."""
    from vgpu_state.planner.identity import derived_uuid

    gpus = []
    for g in snapshot.gpus:
        vgpus = tuple(
            v.model_copy(update={"uuid": derived_uuid(snapshot.node, g.address, slot)})
            if v.uuid is not None
            else v
            for slot, v in enumerate(g.vgpus)
        )
        gpus.append(g.model_copy(update={"vgpus": vgpus}))
    return snapshot.model_copy(update={"gpus": tuple(gpus)})


def build_fleet(directory: Path, count: int) -> dict[str, int]:
    """Write the two list responses, one item per line (``nodes.jsonl``,
    ``states.jsonl``) for the server to page through; return counts and sizes."""
    scanned = datetime.datetime.now(tz=datetime.UTC)
    total_gpus = 0
    with (
        (directory / "nodes.jsonl").open("w") as nodes,
        (directory / "states.jsonl").open("w") as states,
    ):
        for node, state in fleet_items(count, scanned):
            total_gpus += int(node["metadata"]["labels"]["nvidia.com/gpu.count"])
            nodes.write(json.dumps(node, separators=(",", ":")) + "\n")
            states.write(json.dumps(state, separators=(",", ":")) + "\n")
    sizes = {
        "nodes": count,
        "gpus": total_gpus,
        "nodes_bytes": (directory / "nodes.jsonl").stat().st_size,
        "states_bytes": (directory / "states.jsonl").stat().st_size,
    }
    (directory / "fleet.json").write_text(json.dumps(sizes))
    return sizes


# the server -------------------------------------------------------------------------------
ROUTES = {
    "/api/v1/nodes": ("nodes.jsonl", "NodeList"),
    "/apis/vgpu-state.io/v1alpha1/vgpunodestates": ("states.jsonl", "VGPUNodeStateList"),
}


def list_body(
    kind: str, items: list[bytes], start: int, limit: int | None, metadata_only: bool = False
) -> bytes:
    """A list response as the API server sends it: ``limit`` items from ``start`` and,
    when more remain, ``metadata.continue`` (opaque to clients: here the next index).
    ``metadata_only``: a ``PartialObjectMetadataList`` (each object's metadata alone),
    as the API server answers ``Accept: application/json;as=PartialObjectMetadataList``."""
    end = len(items) if not limit else min(len(items), start + limit)
    meta: dict[str, Any] = {"resourceVersion": "3000"}
    if end < len(items):
        meta["continue"] = base64.urlsafe_b64encode(str(end).encode()).decode()
        meta["remainingItemCount"] = len(items) - end
    api_version = "v1"
    chosen = items[start:end]
    if metadata_only:
        kind, api_version = "PartialObjectMetadataList", "meta.k8s.io/v1"
        chosen = [
            json.dumps(
                {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": json.loads(item)["metadata"],
                },
                separators=(",", ":"),
            ).encode()
            for item in chosen
        ]
    head = json.dumps({"kind": kind, "apiVersion": api_version, "metadata": meta})[:-1]
    return head.encode() + b',"items":[' + b",".join(chosen) + b"]}"


def serve(directory: str) -> None:
    """Serve the two lists on a free port (paged when asked with ``limit``/``continue``,
    as the API server pages its watch cache); print the port; stop when stdin closes."""
    lists = {
        path: (kind, (Path(directory) / name).read_bytes().splitlines())
        for path, (name, kind) in ROUTES.items()
    }
    answers: dict[tuple[str, int, int | None, bool], bytes] = {}
    """Each answer as first sent (a watch cache's lists do not change either): the
    server's own work is not what is timed."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            found = lists.get(path)
            if found is None:
                self.send_error(404)
                return
            kind, items = found
            args = urllib.parse.parse_qs(query)
            limit = int(args.get("limit", ["0"])[0]) or None
            token = args.get("continue", [""])[0]
            start = int(base64.urlsafe_b64decode(token)) if token else 0
            accept = self.headers.get("Accept", "").split(",")[0]
            partial = "as=PartialObjectMetadataList" in accept.replace(" ", "").split(";")
            key = (path, start, limit, partial)
            body = answers.get(key) or answers.setdefault(
                key, list_body(kind, items, start, limit, partial)
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()
    server.shutdown()


# the measurement -------------------------------------------------------------------------
LAUNCH = (
    "import runpy, sys; tree = sys.argv.pop(1); sys.path.insert(0, tree); "
    "sys.meta_path[:] = [f for f in sys.meta_path "
    "if not type(f).__module__.startswith('__editable__')]; "
    "sys.argv[0] = 'vgpu-state'; runpy.run_module('vgpu_state.cli.main', run_name='__main__')"
)
"""Runs the ``vgpu-state`` command from a given checkout: the checkout first on the
path, the virtualenv's editable install of this one set aside."""


def command(tree: Path) -> list[str]:
    return [sys.executable, "-c", LAUNCH, str(tree)]


def compile_bytecode(tree: Path) -> None:
    """As ``pip install`` leaves an installed tool (see bench/plan.py)."""
    import compileall

    compileall.compile_dir(tree / "vgpu_state", quiet=1)


def kubeconfig(path: Path, port: int) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "b", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "b", "user": {"token": "bench"}}],
        "contexts": [{"name": "b", "context": {"cluster": "b", "user": "b"}}],
        "current-context": "b",
    }
    path.write_text(json.dumps(config))
    return path


@dataclass
class Run:
    wall: float
    cpu: float
    rss_mb: float
    code: int
    out_bytes: int


def run_once(args: list[str], tree: Path, out: Path) -> Run:
    """One ``fleet plan`` as a process of the code in ``tree``: wall time, its own CPU
    time (user + system) and peak RSS (from ``wait4``, this child only)."""
    env = {**os.environ, "COLUMNS": "160"}
    with out.open("wb") as sink:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [*command(tree), *args], stdout=sink, stderr=subprocess.PIPE, env=env
        )
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 2):
        raise SystemExit(f"fleet plan failed ({proc.returncode}): {err.decode()[-2000:]}")
    return Run(
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
        proc.returncode,
        out.stat().st_size,
    )


def which_code(tree: Path) -> str:
    probe = LAUNCH.replace(
        "runpy.run_module('vgpu_state.cli.main', run_name='__main__')",
        "import vgpu_state, pathlib; print(pathlib.Path(vgpu_state.__file__).parent.parent)",
    )
    found = subprocess.run(
        [sys.executable, "-c", probe, str(tree)], capture_output=True, text=True, check=True
    ).stdout.strip()
    if Path(found).resolve() != tree.resolve():
        raise SystemExit(f"{tree}: the interpreter imports vgpu_state from {found} instead")
    rev = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{tree} ({rev or '?'}{' + changes' if dirty else ''})"


def fleet_dir(root: Path, count: int, cache: Path | None) -> Path:
    """The fleet's directory: built in ``root``, or kept in ``cache`` between runs."""
    where = (cache / f"fleet-{count}") if cache is not None else root / f"fleet-{count}"
    if (where / "fleet.json").exists():
        sizes = json.loads((where / "fleet.json").read_text())
        print(f"fleet: {count} nodes, {sizes['gpus']} GPUs (kept in {where})")
        return where
    where.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    sizes = build_fleet(where, count)
    print(
        f"fleet: {count} nodes, {sizes['gpus']} GPUs; lists "
        f"{sizes['nodes_bytes'] / 1e6:.1f} MB (Nodes) + "
        f"{sizes['states_bytes'] / 1e6:.1f} MB (VGPUNodeStates); "
        f"built in {time.perf_counter() - started:.1f} s"
    )
    return where


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nodes",
        default=str(NODES),
        help="fleet size, or sizes separated by commas (default %(default)s)",
    )
    parser.add_argument("--runs", type=int, default=RUNS, help="timed runs per case")
    parser.add_argument(
        "--output", choices=("table", "json", "both"), default="both", help="which output"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        help="another checkout (e.g. a worktree of main): its runs interleave with this "
        "tree's, run by run",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the built fleets in this directory and reuse them"
    )
    parser.add_argument(
        "--in-use",
        choices=("protect", "evacuate"),
        default="protect",
        help="the config's in-use policy (evacuate: fleet plan also lists the moves)",
    )
    parser.add_argument(
        "--jobs",
        help="--jobs values of fleet plan to measure, separated by commas (default: the "
        "command's own default)",
    )
    return parser.parse_args(argv)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
        return 0
    args = parse_args(sys.argv[1:])
    counts = [int(n.replace("_", "")) for n in args.nodes.split(",")]
    here = Path(__file__).resolve().parent.parent
    trees = [("this", here)] + ([("compare", args.compare.resolve())] if args.compare else [])
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, "
        f"load {Path('/proc/loadavg').read_text().strip()}, "
        f"{datetime.datetime.now(tz=datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )
    for label, tree in trees:
        print(f"{label}: {which_code(tree)}")
        compile_bytecode(tree)
    choices: dict[str, list[list[str]]] = {
        "table": [[]],
        "json": [["-o", "json"]],
        "both": [[], ["-o", "json"]],
    }
    outputs = choices[args.output]
    jobs_list: list[int | None] = [int(j) for j in args.jobs.split(",")] if args.jobs else [None]
    ok = True
    medians: dict[tuple[str, str], list[tuple[int, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="vgpu-fleet-") as tmp:
        root = Path(tmp)
        config = root / "fleet.yaml"
        config.write_text(CONFIG.replace("in-use: protect", f"in-use: {args.in_use}"))
        for count in counts:
            directory = fleet_dir(root, count, args.keep)
            server = subprocess.Popen(
                [sys.executable, __file__, "serve", str(directory)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            try:
                assert server.stdout is not None
                port = int(server.stdout.readline())
                kube = kubeconfig(root / "kubeconfig", port)
                # Any age: a kept fleet's scans grow older than the default 30 minutes,
                # and a stale node is listed, not planned.
                base = ["fleet", "plan", "-f", str(config), "--kubeconfig", str(kube)]
                base += ["--max-age", "0"]
                for output, jobs in itertools.product(outputs, jobs_list):
                    what = "table" if not output else "-o json"
                    extra = output if jobs is None else [*output, "-j", str(jobs)]
                    what += "" if jobs is None else f" -j {jobs}"
                    runs: dict[str, list[Run]] = {label: [] for label, _ in trees}
                    for i in range(args.runs + 1):  # the first round warms the page cache
                        for label, tree in trees:
                            run = run_once([*base, *extra], tree, root / f"out-{label}")
                            if i:
                                runs[label].append(run)
                    for label, _ in trees:
                        rs = runs[label]
                        wall = statistics.median(r.wall for r in rs)
                        cpu = statistics.median(r.cpu for r in rs)
                        rss = statistics.median(r.rss_mb for r in rs)
                        target = target_for(count, jobs)
                        verdict = ""
                        if target is not None and label == "this":
                            good = wall <= target[0] and rss <= target[1]
                            ok = ok and good
                            verdict = (
                                f"; goal {target[0]} s, {target[1]} MB: ratio "
                                f"{wall / target[0]:.2f} / {rss / target[1]:.2f} "
                                f"{'OK' if good else 'MISSED'}"
                            )
                        medians.setdefault((label, what), []).append((count, wall))
                        print(
                            f"[{label}] fleet plan {what}, {count} nodes: wall median "
                            f"{wall:.3f} s (min {min(r.wall for r in rs):.3f}, max "
                            f"{max(r.wall for r in rs):.3f}), CPU {cpu:.3f} s, peak RSS "
                            f"{rss:.0f} MB (max {max(r.rss_mb for r in rs):.0f}) of {len(rs)}, "
                            f"exit {rs[-1].code}, output {rs[-1].out_bytes / 1e6:.1f} MB"
                            f"{verdict}",
                            flush=True,
                        )
            finally:
                assert server.stdin is not None
                server.stdin.close()
                server.wait(10)
    for (label, what), points in medians.items():
        for (n1, t1), (n2, t2) in itertools.pairwise(points):
            exponent = math.log(t2 / t1) / math.log(n2 / n1)
            print(f"[{label}] {what}: {n1} -> {n2} nodes, wall grows as n^{exponent:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
