#!/usr/bin/env python3
"""Benchmark: ``vgpu-state fleet plan`` over 1,000 nodes (target 3 s, end to end).

The fleet: 1,000 GPU nodes of six pools (A2, T4, A16 and A40 with mdev, L40S
and L4 with vendor-specific VFIO), 1 to 8 GPUs each, each node's existing
layout what the current config made, every fourth node with a vGPU held by a
VM. Each node's ``VGPUNodeState`` status is built by the status writer's own
pieces (layout, capacity, the encoded scan) from a scan of a simulated node;
its Node object is a realistic one (labels, annotations, conditions, images).
The config under review changes three of the six pools.

A small HTTP server in its own process serves the two lists (as an API server
serves them from its watch cache), so the timing is the command's: start-up
and imports, two list requests, decoding, planning, rendering. Printed: the
median wall time of ``fleet plan`` (table and ``-o json``) as a subprocess,
the in-process split (read, plan, render), and the ratio to the target.
"""

from __future__ import annotations

import datetime
import http.server
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TARGET_S = 3.0
NODES = 1000
RUNS = 5


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


def build_fleet(directory: Path) -> dict[str, int]:
    """Write ``nodes.json`` and ``states.json`` (the two list responses); return counts."""
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
    scanned = datetime.datetime.now(tz=datetime.UTC)
    nodes: list[dict[str, Any]] = []
    states: list[dict[str, Any]] = []
    all_shapes = shapes()
    total_gpus = 0
    for i in range(NODES):
        pool, gpus = all_shapes[i % len(all_shapes)]
        total_gpus += gpus
        name = f"gpu-{pool.name}-{i:04d}"
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
        nodes.append(node_object(name, labels, gpus))
        snapshot = scans[(pool.name, gpus)].model_copy(update={"node": name})
        held: dict[str, str] = {}
        if i % 4 == 0:
            first = snapshot.gpus[0].vgpus[0]
            held[first.key] = f"pod vms/virt-launcher-vm-{i}-abcde"
        gpu_status, capacity = layout_status(snapshot, held)
        status = VGPUNodeStateStatus(
            state=ConfigState.SUCCESS,
            gpus=gpu_status,
            capacity=capacity,
            vgpu_count=sum(len(g.vgpus) for g in gpu_status),
            snapshot=encode_snapshot(snapshot, scanned),
        )
        states.append(
            {
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
        )
    for kind, items, path in (
        ("NodeList", nodes, "nodes.json"),
        (f"{KIND}List", states, "states.json"),
    ):
        body = {"kind": kind, "metadata": {"resourceVersion": "3000"}, "items": items}
        (directory / path).write_text(json.dumps(body, separators=(",", ":")))
    return {
        "gpus": total_gpus,
        "nodes_bytes": (directory / "nodes.json").stat().st_size,
        "states_bytes": (directory / "states.json").stat().st_size,
    }


# the server -------------------------------------------------------------------------------
ROUTES = {
    "/api/v1/nodes": "nodes.json",
    "/apis/vgpu-state.io/v1alpha1/vgpunodestates": "states.json",
}


def serve(directory: str) -> None:
    """Serve the two lists on a free port; print the port; stop when stdin closes."""
    bodies = {path: (Path(directory) / name).read_bytes() for path, name in ROUTES.items()}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = bodies.get(self.path.split("?", 1)[0])
            if body is None:
                self.send_error(404)
                return
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
def command() -> list[str]:
    script = Path(sys.executable).with_name("vgpu-state")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "vgpu_state.cli.main"]


def compile_bytecode() -> None:
    """As ``pip install`` leaves an installed tool (see bench/plan.py)."""
    import compileall

    import vgpu_state

    compileall.compile_dir(Path(vgpu_state.__file__).parent, quiet=1)


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


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_runs(argv: list[str], out: Path) -> tuple[float, float, float, int]:
    """Median and max wall time, median CPU time (user + system) of the runs, exit code."""
    env = {**os.environ, "COLUMNS": "160"}
    times = []
    cpu = []
    code = 0
    for _ in range(RUNS + 1):  # the first run warms the page cache
        with out.open("wb") as sink:
            before = _children_cpu()
            started = time.perf_counter()
            done = subprocess.run(argv, stdout=sink, stderr=subprocess.PIPE, env=env)
            times.append(time.perf_counter() - started)
            cpu.append(_children_cpu() - before)
        code = done.returncode
        if code not in (0, 2):
            raise SystemExit(f"fleet plan failed ({code}): {done.stderr.decode()[-2000:]}")
    return statistics.median(times[1:]), max(times[1:]), statistics.median(cpu[1:]), code


def in_process(config: Path, kube: Path) -> dict[str, float]:
    """The command's parts, timed in this process (imports already paid)."""
    import io

    from pydantic_core import to_json

    from vgpu_state.catalog import default_catalog
    from vgpu_state.cli.fleet import gc_paused, render_table
    from vgpu_state.config import load_file
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.fleet import read_fleet
    from vgpu_state.reconcile.fleet import fleet_document, plan_fleet
    from vgpu_state.reconcile.settings import Settings

    t0 = time.perf_counter()
    settings = Settings(catalog=default_catalog())
    document = load_file(config, catalog=settings.catalog)
    t1 = time.perf_counter()
    api = KubeApi.connect(str(kube))
    t_connect = time.perf_counter()
    with gc_paused():  # as the command does
        nodes = read_fleet(api)
        t2 = time.perf_counter()
        now = datetime.datetime.now(tz=datetime.UTC)
        result = plan_fleet(document, nodes, settings, now, None)
        t3 = time.perf_counter()
        render_table(result, str(config), io.StringIO())
        t4 = time.perf_counter()
        to_json(fleet_document(result, str(config)), indent=2)
        t5 = time.perf_counter()
    t = result.totals
    assert t.nodes == NODES and t.unknown == 0 and t.errors == 0, t
    return {
        "config": t1 - t0,
        "connect": t_connect - t1,
        "read": t2 - t_connect,
        "plan": t3 - t2,
        "table": t4 - t3,
        "json": t5 - t4,
        "changed": t.changed,
        "create": t.create,
        "destroy": t.destroy,
        "blocked": t.blocked,
    }


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
        return 0
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()}")
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="vgpu-fleet-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        sizes = build_fleet(root)
        print(
            f"fleet: {NODES} nodes, {sizes['gpus']} GPUs; lists "
            f"{sizes['nodes_bytes'] / 1e6:.1f} MB (Nodes) + "
            f"{sizes['states_bytes'] / 1e6:.1f} MB (VGPUNodeStates); "
            f"built in {time.perf_counter() - started:.1f} s"
        )
        config = root / "fleet.yaml"
        config.write_text(CONFIG)
        server = subprocess.Popen(
            [sys.executable, __file__, "serve", str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            kube = kubeconfig(root / "kubeconfig", port)
            parts = in_process(config, kube)
            print(
                f"in process: config {parts['config']:.3f} s, client load and connect "
                f"{parts['connect']:.3f} s, read (2 lists + decode) "
                f"{parts['read']:.3f} s, plan {parts['plan']:.3f} s, table {parts['table']:.3f} s, "
                f"json {parts['json']:.3f} s; {parts['changed']:.0f} nodes change "
                f"({parts['create']:.0f} create, {parts['destroy']:.0f} destroy, "
                f"{parts['blocked']:.0f} blocked)"
            )
            base = [*command(), "fleet", "plan", "-f", str(config), "--kubeconfig", str(kube)]
            ok = True
            for label, extra in (("table", []), ("-o json", ["-o", "json"])):
                median, worst, cpu, code = timed_runs([*base, *extra], root / "out")
                good = median <= TARGET_S
                ok = ok and good
                print(
                    f"vgpu-state fleet plan {label}, {NODES} nodes: median {median:.3f} s "
                    f"(max {worst:.3f}, CPU {cpu:.3f} s) of {RUNS}, exit {code}, output "
                    f"{(root / 'out').stat().st_size / 1e6:.1f} MB; target {TARGET_S} s, "
                    f"ratio {median / TARGET_S:.2f} {'OK' if good else 'SLOW'}"
                )
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(10)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
