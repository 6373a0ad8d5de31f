#!/usr/bin/env python3
"""Benchmark: the layouts webhook's review time for hostile inputs at its limits.

Starts the webhook's HTTPS server in this process (as the controller serves it: each
review's layouts checked in a child process with a deadline) and POSTs one
AdmissionReview per case, timing the answer as the API server would wait for it
(deploy/webhook.yaml: ``timeoutSeconds: 5``). The layouts texts are at most 1 MiB (the
most a ConfigMap holds; a larger one is refused unread) and the bodies at most the
webhook's 4 MiB body limit. Then, for the flow list that took the webhook 15.8 s of CPU,
the CPU time of the check itself (``check_text``, no child process).

    python bench/webhook_hostile.py [--runs N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import ssl
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vgpu_state.catalog import default_catalog  # noqa: E402
from vgpu_state.controller import tls  # noqa: E402
from vgpu_state.controller.webhook import (  # noqa: E402
    MAX_BODY,
    MAX_LAYOUTS_BYTES,
    REVIEW_PATH,
    WebhookServer,
    check_text,
)

MiB = 1024 * 1024
HEAD = "version: v1\nvgpu-configs:\n  x: "


def fill(unit: str, size: int, head: str = "", tail: str = "") -> str:
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


def real_layouts(size: int) -> str:
    """bench/config_load.py's vgpu-device-manager-style layouts, grown to ``size``."""
    sys.path.insert(0, str(REPO / "bench"))
    from config_load import build

    configs = 700
    while len(text := build(configs)) < size:
        configs += 100
    return build(configs - 100) if len(text) > size else text


def bomb() -> str:
    levels = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        levels.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(levels) + "\n"


LIMIT = MAX_LAYOUTS_BYTES
CASES: dict[str, Callable[[], str]] = {
    "flow list 0.9 MiB, unclosed (a, a, ...)": lambda: fill("a,", int(0.9 * MiB), "["),
    "flow list 1 MiB, unclosed, in vgpu-configs": lambda: fill("a, ", LIMIT, HEAD + "["),
    "flow list 1 MiB of 100-byte items, unclosed": lambda: fill("a" * 99 + ",", LIMIT, "["),
    "flow list 1 MiB of numbers, closed": lambda: fill("1,", LIMIT, "[", "1]"),
    "1 MiB of [ (1,048,576 levels)": lambda: "[" * LIMIT,
    "1 MiB of '- ' (block nesting)": lambda: fill("- ", LIMIT),
    "1 MiB of {a: (flow mappings)": lambda: fill("{a: ", LIMIT),
    "1 MiB of [] items (node count)": lambda: fill("[],", LIMIT, "[", "[]]"),
    "alias bomb (9^9 nodes)": bomb,
    "1 MiB of GPU 0 listed again": lambda: fill(
        "0, ",
        LIMIT,
        "version: v1\nvgpu-configs:\n  x:\n  - devices: [",
        "0]\n    vgpu-devices: {A2-4Q: 4}\n",
    ),
    "1 MiB of errors (many configs, each invalid)": lambda: fill(
        "  c: {}\n", LIMIT, "version: v1\nvgpu-configs:\n"
    ),
    "layouts 1 MiB + 1 byte (refused unread)": lambda: "#" * (LIMIT + 1),
    "149,000 GPU indices listed again (under the node limit)": lambda: (
        "version: v1\nvgpu-configs:\n  x:\n  - devices: ["
        + "0, " * 149_000
        + "0]\n    vgpu-devices: {A2-4Q: 4}\n"
    ),
    "149,000 numbers in a flow list (under the node limit)": lambda: "[" + "1," * 149_000 + "1]",
    "real layouts, just under 1 MiB (valid)": lambda: real_layouts(LIMIT),
}


def review_body(text: str) -> bytes:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"config.yaml": text}}
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "operation": "UPDATE", "object": obj, "oldObject": obj},
    }
    return json.dumps(body).encode()


def post(port: int, ca: bytes, body: bytes) -> tuple[int, bytes, float]:
    context = ssl.create_default_context(cadata=ca.decode())
    context.check_hostname = False
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    start = time.perf_counter()
    conn.request("POST", REVIEW_PATH, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    took = time.perf_counter() - start
    conn.close()
    return response.status, data, took


def post_length(port: int, ca: bytes, length: int) -> tuple[int, bytes, float]:
    """Only the headers of a body of ``length`` bytes: the answer comes before the body."""
    context = ssl.create_default_context(cadata=ca.decode())
    context.check_hostname = False
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    start = time.perf_counter()
    conn.putrequest("POST", REVIEW_PATH)
    conn.putheader("Content-Length", str(length))
    conn.endheaders()
    response = conn.getresponse()
    data = response.read()
    took = time.perf_counter() - start
    conn.close()
    return response.status, data, took


def first_line(status: int, data: bytes) -> str:
    if status != 200:
        return f"HTTP {status}: {data.decode(errors='replace').strip()[:100]}"
    answer = json.loads(data)["response"]
    if answer["allowed"]:
        return "allowed"
    message = answer["status"]["message"].splitlines()
    return "refused: " + " | ".join(message[:2])[:140]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    catalog = default_catalog()
    material = tls.issue("vgpu-state-controller", "vgpu-state", dt.datetime.now(dt.UTC))
    server = WebhookServer("127.0.0.1", 0, catalog)
    server.load(material)
    server.start()
    print(f"load average {os.getloadavg()[0]:.1f}; webhook body limit {MAX_BODY // MiB} MiB")
    try:
        post(server.port, material.ca_cert, review_body("version: v1\n"))  # warm up
        for name, make in CASES.items():
            body = review_body(make())
            times = []
            for _ in range(args.runs):
                status, data, took = post(server.port, material.ca_cert, body)
                times.append(took)
            print(
                f"{name}: body {len(body) / MiB:.2f} MiB, review median "
                f"{statistics.median(times):.3f} s, max {max(times):.3f} s: "
                f"{first_line(status, data)}"
            )
        deep_body = b'{"request": {"uid": "u", "object": ' + b"[" * (MAX_BODY - 40) + b"}}"
        status, data, took = post(server.port, material.ca_cert, deep_body)
        print(f"body of 4 MiB of [ : {took:.3f} s: {first_line(status, data)}")
        many = b'{"request": {"uid": "u", "x": [' + b"[]," * ((MAX_BODY - 40) // 3) + b"[]]}}"
        status, data, took = post(server.port, material.ca_cert, many)
        print(f"body of 4 MiB of [] items: {took:.3f} s: {first_line(status, data)}")
        status, data, took = post_length(server.port, material.ca_cert, MAX_BODY + 1)
        print(f"Content-Length 4 MiB + 1 byte: {took:.3f} s: {first_line(status, data)}")
    finally:
        server.stop()
    text = CASES["flow list 0.9 MiB, unclosed (a, a, ...)"]()
    start = time.process_time()
    _, message, _ = check_text(text, catalog, "config.yaml")
    print(
        f"check_text of the 0.9 MiB unclosed flow list in process: "
        f"{time.process_time() - start:.2f} CPU s: {message.splitlines()[1][:100]}"
    )


if __name__ == "__main__":
    main()
