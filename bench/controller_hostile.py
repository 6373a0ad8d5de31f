"""Benchmark: the controller's memory while hostile nodes rewrite huge statuses.

``vgpu-state controller`` (its own process, its ServiceAccount's token, the fleet view
on, a pass every ``--interval`` seconds) against upstream's kube-apiserver and etcd
(tests/realcluster.py, ``deploy/`` installed), with ``--honest`` nodes reporting an
A2 host once and ``--hostile`` nodes each rewriting its status every second, as its
own agent (a pod-bound token), for ``--seconds``:

- ``--status maximal``: the largest status the CRD admits (tests/hostile_status.py:
  32 GPUs, 1,024 vGPUs, every string at its bound, a scan as long and as costly to
  decode as admitted), about 1 MB;
- ``--status wide``: a status of 2,350 GPUs (0.41 MiB), which the CRD refuses.

Prints the controller's RSS over time, its peak (``VmHWM``) and final RSS, their ratio
to the Deployment's memory limit (160 MiB), the passes completed (its
``vgpu_state_controller_passes_total``) and the hostile writes the API server accepted
and refused. ``--tree DIR`` runs the controller of another checkout (e.g. a worktree
of an older commit) and installs that checkout's CRD instead.

    python bench/controller_hostile.py [--status maximal|wide] [--hostile 10] [--seconds 60]
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.apiserver import put_kubevirt  # noqa: E402
from tests.hostile_status import maximal_status, wide_status  # noqa: E402
from tests.realcluster import ControlPlane, api_path, free_port, running  # noqa: E402
from vgpu_state.kube.nodestate import API_VERSION, KIND, VGPUNodeStateStatus, encode_snapshot  # noqa: E402
from vgpu_state.sim.host import SimHost  # noqa: E402

LIMIT_MIB = 160  # deploy/controller.yaml
NODESTATES = "vgpu-state.io/v1alpha1/vgpunodestates"
LAYOUT_LABEL = "nvidia.com/vgpu.config"
LAYOUTS = """\
version: v1
vgpu-configs:
  a2-4q:
    - devices: all
      vgpu-devices: {A2-4Q: 2}
"""


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def passes(port: int) -> tuple[int, int]:
    """``vgpu_state_controller_passes_total`` ok and error, from the controller's /metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return -1, -1
    found = dict(
        re.findall(
            r'^vgpu_state_controller_passes_total\{result="(\w+)"\} ([0-9.e+]+)$', text, re.M
        )
    )
    return int(float(found.get("ok", 0))), int(float(found.get("error", 0)))


def honest(plane: ControlPlane, node: str) -> None:
    with SimHost(REPO / "configs" / "sim" / "a2-host.yaml", in_memory=True) as host:
        scan = host.scan().model_copy(update={"node": node})
    status = VGPUNodeStateStatus(snapshot=encode_snapshot(scan, dt.datetime.now(dt.UTC)))
    plane.ensure_node(node, {LAYOUT_LABEL: "a2-4q"})
    plane.put(NODESTATES, node, {"spec": {"nodeName": node}, "status": status.to_json()})


class Hostile(threading.Thread):
    """One compromised node: its status rewritten every second with its agent's token."""

    def __init__(
        self, plane: ControlPlane, node: str, status: dict[str, Any], stop: threading.Event
    ):
        super().__init__(name=node, daemon=True)
        self.plane, self.node, self.status, self.stop = plane, node, status, stop
        self.token = plane.agent_token(node)
        self.accepted = 0
        self.refused: dict[int, int] = {}
        self.message = ""
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": node},
                "spec": {"nodeName": node}}  # fmt: skip
        created = plane.request("POST", api_path(NODESTATES), body, token=self.token)
        self.version = str(created["metadata"]["resourceVersion"])

    def run(self) -> None:
        """PUT after PUT on one kept-alive connection; the body is serialised once and only
        its resourceVersion and ``blockedCount`` (a change every time) are filled in."""
        path = api_path(NODESTATES, self.node) + "/status"
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": self.node, "resourceVersion": "@@RV@@"},
            "status": {**self.status, "blockedCount": 918273645},
        }
        head, rest = json.dumps(body, separators=(",", ":")).encode().split(b"@@RV@@")
        middle, tail = rest.split(b"918273645")
        del body, rest
        host = urllib.parse.urlparse(self.plane.url)
        context = self.plane.ssl_context(None)
        connection = http.client.HTTPSConnection(
            host.hostname or "127.0.0.1", host.port, context=context, timeout=60
        )
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                   "Accept": "application/json"}  # fmt: skip
        i = 0
        while not self.stop.is_set():
            started = time.monotonic()
            i += 1
            data = head + self.version.encode() + middle + str(i).encode() + tail
            try:
                connection.request("PUT", path, data, headers)
                response = connection.getresponse()
                answer = response.read()
            except OSError as e:
                self.refused[0] = self.refused.get(0, 0) + 1
                self.message = f"no answer: {e}"
                connection.close()
                continue
            if response.status == 200:
                # the first one is the metadata's (a custom resource's keys are sorted)
                found = re.search(rb'"resourceVersion":"(\d+)"', answer)
                self.version = found.group(1).decode() if found else self.version
                self.accepted += 1
            else:
                self.refused[response.status] = self.refused.get(response.status, 0) + 1
                self.message = f"{response.status} {answer[:300].decode(errors='replace')}"
            del answer
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--status", choices=["maximal", "wide"], default="maximal")
    parser.add_argument("--hostile", type=int, default=10)
    parser.add_argument("--honest", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=2.0, help="controller pass interval")
    parser.add_argument("--no-fleet-view", action="store_true", help="the controller without -f")
    parser.add_argument(
        "--tree", type=Path, default=REPO, help="checkout whose controller and CRD run"
    )
    args = parser.parse_args()
    tree = args.tree.resolve()
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    load = os.getloadavg()
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} cores, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; controller of {tree} ({commit})"
    )
    work = Path(tempfile.mkdtemp(prefix="vgpu-hostile-"))
    controller: subprocess.Popen[bytes] | None = None
    stop = threading.Event()
    try:
        with running(work / "k8s") as plane:
            if tree != REPO:
                plane.kubectl("apply", "--server-side", "--force-conflicts",
                              "-f", str(tree / "deploy" / "crd.yaml"))  # fmt: skip
                plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                              "crd/vgpunodestates.vgpu-state.io")  # fmt: skip
            put_kubevirt(plane)
            for i in range(args.honest):
                honest(plane, f"gpu-{i:03d}")
            build = maximal_status if args.status == "maximal" else wide_status
            t0 = time.monotonic()
            statuses = {f"hostile-{i:02d}": build(f"hostile-{i:02d}") for i in range(args.hostile)}
            size = len(json.dumps(next(iter(statuses.values())), separators=(",", ":")))
            print(f"{args.hostile} hostile statuses ({args.status}, {size / 2**20:.2f} MiB each) "
                  f"built in {time.monotonic() - t0:.1f} s")  # fmt: skip
            hostile = [Hostile(plane, node, s, stop) for node, s in statuses.items()]
            del statuses
            layouts = work / "layouts.yaml"
            layouts.write_text(LAYOUTS)
            port = free_port()
            ckube = plane.controller_kubeconfig(work / "controller.kubeconfig")
            controller = subprocess.Popen(
                [sys.executable, "-m", "vgpu_state.cli.main", "controller",
                 "--kubeconfig", str(ckube), "--identity", "c-1", "--webhook-port", "0",
                 "--interval", str(args.interval), "--listen", f"127.0.0.1:{port}",
                 "-f", "" if args.no_fleet_view else str(layouts),
                 "--fleet-interval", "10", "--max-age", "0",
                 "--log-level", "warning"],
                cwd=tree, stdout=(work / "controller.log").open("wb"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while passes(port)[0] < 1:
                if time.monotonic() > deadline or controller.poll() is not None:
                    raise SystemExit("controller_hostile: the controller made no pass in 60 s")
                time.sleep(0.5)
            idle = rss_kb(controller.pid) / 1024
            base_ok, base_err = passes(port)
            print(f"controller up, first pass done; RSS {idle:.0f} MiB")
            for h in hostile:
                h.start()
            start = time.monotonic()
            print("   t  RSS MiB  passes ok/error")
            while time.monotonic() - start < args.seconds:
                time.sleep(5)
                if controller.poll() is not None:
                    print(f"controller exited with {controller.returncode}")
                    break
                ok, err = passes(port)
                print(f"{time.monotonic() - start:4.0f}  {rss_kb(controller.pid) / 1024:7.0f}"
                      f"  {ok - base_ok}/{err - base_err}")  # fmt: skip
            stop.set()
            for h in hostile:
                h.join(30)
            alive = controller.poll() is None
            peak = rss_kb(controller.pid, "VmHWM") / 1024 if alive else float("nan")
            final = rss_kb(controller.pid) / 1024 if alive else float("nan")
            ok, err = passes(port) if alive else (-1, -1)
            accepted = sum(h.accepted for h in hostile)
            refused: dict[int, int] = {}
            for h in hostile:
                for code, count in h.refused.items():
                    refused[code] = refused.get(code, 0) + count
            print(f"hostile writes: {accepted} accepted, refused {refused or 'none'}")
            if refused:
                print(f"  e.g. {next(h.message for h in hostile if h.message)}")
            print(
                f"controller RSS: before the hostile writes {idle:.0f} MiB, peak {peak:.0f} MiB, "
                f"final {final:.0f} MiB; peak / limit ({LIMIT_MIB} MiB) = {peak / LIMIT_MIB:.2f}"
            )
            print(f"passes in {args.seconds:.0f} s: {ok - base_ok} ok, {err - base_err} failed "
                  f"(interval {args.interval:g} s)")  # fmt: skip
            log = (work / "controller.log").read_text(errors="replace").splitlines()
            failed = [line for line in log if "pass failed" in line]
            print(f"controller log: {len(log)} lines, {len(failed)} failed passes")
            for line in (failed or log)[-3:]:
                print(f"  {line[:300]}")
    finally:
        stop.set()
        if controller is not None:
            controller.terminate()
            try:
                controller.wait(10)
            except subprocess.TimeoutExpired:
                controller.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
