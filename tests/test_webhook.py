"""The layouts webhook's answers and its HTTPS server (the API server's side is in
tests/test_webhook_real.py)."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.controller import tls
from vgpu_state.controller.isolated import IsolatedCheck
from vgpu_state.controller.webhook import (
    MAX_BODY,
    MAX_LAYOUTS_BYTES,
    REVIEW_PATH,
    WebhookServer,
    review,
)

GOOD = (
    "version: v1\nvgpu-configs:\n  default:\n    - devices: all\n"
    "      vgpu-devices:\n        A2-4Q: 4\n"
)
CATALOG = default_catalog()
UNKNOWN_TYPE = GOOD.replace("A2-4Q", "XYZ-4Q")  # a family the catalog does not know


def request(obj: dict[str, Any] | None, operation: str = "UPDATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": operation, "object": obj},
    }


def cm(data: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": data, **extra}


def test_a_valid_layout_is_allowed() -> None:
    answer = review(request(cm({"config.yaml": GOOD})), CATALOG)
    assert answer["response"] == {"uid": "u-1", "allowed": True}
    assert answer["kind"] == "AdmissionReview"


def test_an_invalid_layout_is_refused_with_file_line_column() -> None:
    bad = GOOD.replace("A2-4Q: 4", "A2-4Q: many")
    response = review(request(cm({"config.yaml": bad})), CATALOG)["response"]
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert message.startswith("invalid vGPU layouts:\nconfig.yaml:6:16: ")
    assert "'many'" in message


def test_a_type_the_catalog_does_not_know_is_a_warning_not_a_refusal() -> None:
    response = review(request(cm({"config.yaml": UNKNOWN_TYPE})), CATALOG)["response"]
    assert response["allowed"] is True
    assert any("XYZ-4Q" in w and w.startswith("config.yaml:6:") for w in response["warnings"])


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        (cm({"other.yaml": GOOD}), "has no data key 'config.yaml'"),
        (cm(None, binaryData={"config.yaml": "eA=="}), "it is in binaryData"),
    ],
)
def test_a_configmap_without_the_layouts_key_is_refused(obj: dict[str, Any], needle: str) -> None:
    response = review(request(obj), CATALOG)["response"]
    assert response["allowed"] is False
    assert needle in response["status"]["message"]


def test_a_delete_is_not_judged() -> None:
    assert review(request(None, "DELETE"), CATALOG)["response"]["allowed"] is True


def test_a_long_list_of_errors_is_cut_and_counted() -> None:
    entries = "".join(
        f"  c{i}:\n    - devices: all\n      vgpu-devices: {{A2-4Q: x}}\n" for i in range(30)
    )
    response = review(
        request(cm({"config.yaml": f"version: v1\nvgpu-configs:\n{entries}"})), CATALOG
    )
    message = response["response"]["status"]["message"]
    assert message.count("\nconfig.yaml:") == 20
    assert "... and 10 more (vgpu-state validate lists all)" in message


@pytest.fixture
def server() -> Iterator[WebhookServer]:
    material = tls.issue("vgpu-state-controller", "vgpu-state", dt.datetime.now(dt.UTC))
    srv = WebhookServer("127.0.0.1", 0, CATALOG)
    assert srv.load(material) is True
    assert srv.load(material) is False  # unchanged: nothing reloaded
    srv.start()
    srv.ca = material.ca_cert  # type: ignore[attr-defined]
    yield srv
    srv.stop()


def post(server: WebhookServer, path: str, body: bytes) -> tuple[int, bytes]:
    context = ssl.create_default_context(cadata=server.ca.decode())  # type: ignore[attr-defined]
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    # The certificate names the Service, as the API server checks it.
    conn._context.check_hostname = False  # type: ignore[attr-defined]
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


def test_the_server_answers_over_tls_signed_by_its_ca(server: WebhookServer) -> None:
    status, body = post(
        server, REVIEW_PATH, json.dumps(request(cm({"config.yaml": "x: ["}))).encode()
    )
    assert status == 200
    answer = json.loads(body)
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"].startswith("invalid vGPU layouts:\nconfig.yaml:")


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        (REVIEW_PATH, b"not json", 400),
        (REVIEW_PATH, b'{"request": {"operation": "UPDATE"}}', 400),
        ("/elsewhere", b"{}", 404),
    ],
)
def test_bad_requests_get_a_clear_status(
    server: WebhookServer, path: str, body: bytes, status: int
) -> None:
    assert post(server, path, body)[0] == status


def test_renewal_is_needed_near_expiry_and_when_the_names_differ() -> None:
    now = dt.datetime.now(dt.UTC)
    material = tls.issue("vgpu-state-controller", "vgpu-state", now)
    assert tls.needs_renewal(material, "vgpu-state-controller", "vgpu-state", now) is None
    later = now + dt.timedelta(days=340)
    assert "expires" in (
        tls.needs_renewal(material, "vgpu-state-controller", "vgpu-state", later) or ""
    )
    other = tls.needs_renewal(material, "vgpu-state-controller", "elsewhere", now)
    assert other == "the serving certificate does not name vgpu-state-controller.elsewhere.svc"
    renewed = tls.renewed(material, "vgpu-state-controller", "vgpu-state", later)
    assert renewed.ca_cert == material.ca_cert and renewed.cert != material.cert
    assert tls.needs_renewal(renewed, "vgpu-state-controller", "vgpu-state", later) is None


# A layouts check that crashes its process, and one that never ends: module level, so the
# webhook's child process can import them.
def crashing_check(text: str, catalog: Any, key: str) -> tuple[bool, str, tuple[str, ...]]:
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("not reached")


def endless_check(text: str, catalog: Any, key: str) -> tuple[bool, str, tuple[str, ...]]:
    while True:
        pass


def serving(check: Any = None) -> tuple[WebhookServer, bytes]:
    material = tls.issue("vgpu-state-controller", "vgpu-state", dt.datetime.now(dt.UTC))
    srv = WebhookServer("127.0.0.1", 0, CATALOG, check=check)
    srv.load(material)
    srv.start()
    srv.ca = material.ca_cert  # type: ignore[attr-defined]
    return srv, material.ca_cert


def verdict(server: WebhookServer, text: str) -> dict[str, Any]:
    review_body = json.dumps(request(cm({"config.yaml": text}))).encode()
    status, body = post(server, REVIEW_PATH, review_body)
    assert status == 200, body
    response: dict[str, Any] = json.loads(body)["response"]
    return response


SERVER_CHILD = """
import datetime as dt, http.client, json, ssl, sys
from vgpu_state.catalog import default_catalog
from vgpu_state.controller import tls
from vgpu_state.controller.webhook import REVIEW_PATH, WebhookServer
material = tls.issue("vgpu-state-controller", "vgpu-state", dt.datetime.now(dt.UTC))
srv = WebhookServer("127.0.0.1", 0, default_catalog())
srv.load(material)
srv.start()
context = ssl.create_default_context(cadata=material.ca_cert.decode())
context.check_hostname = False
for text in json.loads(sys.stdin.read()):
    review = {"request": {"uid": "u", "operation": "CREATE",
                          "object": {"data": {"config.yaml": text}}}}
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=context, timeout=30)
    conn.request("POST", REVIEW_PATH, json.dumps(review), {"Content-Type": "application/json"})
    print(json.dumps(json.loads(conn.getresponse().read())["response"]), flush=True)
srv.stop()
"""


def test_a_deeply_nested_layout_is_refused_naming_the_limit_and_the_server_lives_on() -> None:
    """In a child process: before, the parse crashed the whole controller (SIGSEGV)."""
    texts = ["[" * 30_000, "- " * 500_000, "{a: " * 100_000, GOOD]
    done = subprocess.run(
        [sys.executable, "-c", SERVER_CHILD], input=json.dumps(texts),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    *deep, good = [json.loads(line) for line in done.stdout.splitlines()]
    for response in deep:
        assert response["allowed"] is False
        assert "nested more than 64 levels deep" in response["status"]["message"]
    assert good["allowed"] is True


def test_a_review_body_nested_too_deep_or_too_large_is_refused_unparsed(
    server: WebhookServer,
) -> None:
    status, body = post(server, REVIEW_PATH, b'{"request": ' + b"[" * 1_000_000 + b"}")
    assert status == 400 and b"nested more than 64 levels deep" in body
    # 1.3 million empty lists (3.9 MB) would be 90 MB of objects in the controller.
    many = b'{"request": {"uid": "u", "x": [' + b"[]," * 1_300_000 + b"[]]}}"
    status, body = post(server, REVIEW_PATH, many)
    assert status == 400 and b"values, more than the limit of 100000" in body
    # Over the body limit: answered from the headers, the body never read.
    context = ssl.create_default_context(cadata=server.ca.decode())  # type: ignore[attr-defined]
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    conn._context.check_hostname = False  # type: ignore[attr-defined]
    conn.putrequest("POST", REVIEW_PATH)
    conn.putheader("Content-Length", str(MAX_BODY + 1))
    conn.endheaders()
    assert conn.getresponse().status == 413
    assert verdict(server, GOOD)["allowed"] is True


def test_layouts_larger_than_a_configmap_holds_are_refused_unread() -> None:
    response = review(request(cm({"config.yaml": "#" * (MAX_LAYOUTS_BYTES + 1)})), CATALOG)
    assert response["response"]["allowed"] is False
    assert "more than the limit of 1048576 bytes" in response["response"]["status"]["message"]


def test_a_check_that_crashes_is_a_refusal_and_the_server_lives_on() -> None:
    srv, _ = serving(IsolatedCheck(crashing_check, seconds=10))
    try:
        response = verdict(srv, GOOD)
        assert response["allowed"] is False
        assert "the check ended with signal 11" in response["status"]["message"]
        assert verdict(srv, GOOD)["allowed"] is False  # and again: the server still answers
    finally:
        srv.stop()


def test_a_check_past_its_deadline_is_a_refusal_within_the_deadline() -> None:
    srv, _ = serving(IsolatedCheck(endless_check, seconds=1))
    try:
        start = time.monotonic()
        response = verdict(srv, GOOD)
        assert time.monotonic() - start < 4  # the API server waits 5 s
        assert response["allowed"] is False
        assert "could not be checked within 1 s" in response["status"]["message"]
    finally:
        srv.stop()


def test_a_request_the_handler_fails_on_is_a_500_for_it_alone() -> None:
    def broken(text: str, catalog: Any, key: str) -> tuple[bool, str, tuple[str, ...]]:
        raise RuntimeError("boom")

    srv, _ = serving(broken)
    try:
        good = json.dumps(request(cm({"config.yaml": GOOD}))).encode()
        status, body = post(srv, REVIEW_PATH, good)
        assert status == 500 and b"the review failed" in body
        status, _ = post(srv, REVIEW_PATH, b"not json")
        assert status == 400, "the server still answers"
    finally:
        srv.stop()
