"""The layouts webhook against the real API server, as shipped: deploy/'s
ValidatingWebhookConfiguration and Service, the controller's own ServiceAccount (its
RBAC), its own CA in the Secret and the caBundle it keeps, and the real ``kubectl``.

The API server reaches the webhook through the Service's endpoints (the harness runs it
with ``--enable-aggregator-routing``); the test publishes this machine's address as the
Service's endpoint, as the cluster would publish the controller pod's.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import ApiError, ControlPlane
from vgpu_state.catalog import default_catalog
from vgpu_state.controller import tls
from vgpu_state.controller.webhook import WebhookKeeper, WebhookSettings
from vgpu_state.kube.api import KubeApi

REPO = Path(__file__).resolve().parent.parent
NS = "vgpu-state"
SERVICE = "vgpu-state-controller"
SECRET = "vgpu-state-controller-tls"
WEBHOOK = "vgpu-state-layouts"
LAYOUTS = "vgpu-state-config"
VWC = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{WEBHOOK}"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
ENDPOINTS = f"/api/v1/namespaces/{NS}/endpoints"

INVALID = """\
version: v1
vgpu-configs:
  default:
    - devices: all
      vgpu-devices:
        A2-4Q: -1
  broken:
    - devices: [0, zero]
      vgpu-devices:
        NOT-A-TYPE: 2
"""

VALID = """\
version: v1
vgpu-configs:
  default:
    - devices: all
      vgpu-devices:
        A2-4Q: 4
"""


def machine_address() -> str:
    """This machine's own IPv4 address (endpoints may not be loopback addresses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, contextlib.suppress(OSError):
        s.connect(("192.0.2.254", 9))  # no packet is sent: this only picks a route
        address = str(s.getsockname()[0])
        if not address.startswith("127.") and address != "0.0.0.0":
            return address
    for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
        address = str(info[4][0])
        if not address.startswith("127."):
            return address
    pytest.fail("this machine has no non-loopback IPv4 address to publish as an endpoint")


def kubectl(
    cluster: ControlPlane, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("kubectl")
    assert binary, "kubectl is required"
    return subprocess.run(
        [binary, "--kubeconfig", str(cluster.workdir / "kubeconfig"), *args],
        input=stdin, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def configmap(name: str, text: str, namespace: str = NS) -> str:
    lines = "\n".join(f"    {line}" for line in text.splitlines())
    return (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        f"data:\n  config.yaml: |\n{lines}\n"
    )


def publish_endpoint(cluster: ControlPlane, port: int) -> None:
    """The Service's endpoint: this machine at ``port`` (EndpointSlice and Endpoints)."""
    address = machine_address()
    cluster.request("POST", SLICES, {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{SERVICE}-test", "labels": {"kubernetes.io/service-name": SERVICE}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "webhook", "port": port, "protocol": "TCP"}],
    })  # fmt: skip
    cluster.request("POST", ENDPOINTS, {
        "apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": SERVICE},
        "subsets": [{"addresses": [{"ip": address}],
                     "ports": [{"name": "webhook", "port": port, "protocol": "TCP"}]}],
    })  # fmt: skip


class Replica:
    """One controller replica's webhook half, as its own ServiceAccount."""

    def __init__(self, cluster: ControlPlane, tmp: Path, name: str) -> None:
        token = cluster.agent_token(f"node-{name}", service_account="vgpu-state-controller")
        kubeconfig = cluster.write_kubeconfig(tmp / f"{name}.kubeconfig", token=token)
        self.api = KubeApi.connect(str(kubeconfig))
        self.keeper = WebhookKeeper(
            self.api, WebhookSettings(port=0, namespace=NS), default_catalog()
        )

    @property
    def port(self) -> int:
        return self.keeper.server.port

    def start(self) -> None:
        self.keeper.check()
        self.keeper.start()

    def shutdown(self) -> None:
        self.keeper.stop()


@pytest.fixture
def layouts(cluster: ControlPlane, tmp_path: Path) -> Iterator[tuple[ControlPlane, Replica]]:
    original = cluster.request("GET", f"/api/v1/namespaces/{NS}/configmaps/{LAYOUTS}")
    replica = Replica(cluster, tmp_path, "a")
    replica.start()
    publish_endpoint(cluster, replica.port)
    try:
        yield cluster, replica
    finally:
        with contextlib.suppress(ApiError):  # put back what deploy/ installed (if refused, kept)
            current = cluster.request("GET", f"/api/v1/namespaces/{NS}/configmaps/{LAYOUTS}")
            if current["data"] != original["data"]:
                current["data"] = original["data"]
                cluster.request("PUT", f"/api/v1/namespaces/{NS}/configmaps/{LAYOUTS}", current)
        replica.shutdown()
        for path in (f"{SLICES}/{SERVICE}-test", f"{ENDPOINTS}/{SERVICE}", f"{SECRETS}/{SECRET}"):
            with contextlib.suppress(ApiError):
                cluster.request("DELETE", path)
        for name, namespace in (("unrelated", NS), ("unrelated", "default")):
            with contextlib.suppress(ApiError):
                cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/configmaps/{name}")


def validate_lines(tmp_path: Path, text: str) -> list[str]:
    """What ``vgpu-state validate -f config.yaml`` prints for ``text``."""
    (tmp_path / "config.yaml").write_text(text)
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "vgpu-state"), "validate", "-f", "config.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout
    return [line for line in proc.stderr.splitlines() if line.startswith("config.yaml:")]


def ca_bundle(cluster: ControlPlane) -> bytes:
    (hook,) = cluster.request("GET", VWC)["webhooks"]
    return base64.b64decode(hook["clientConfig"].get("caBundle") or "")


def secret(cluster: ControlPlane) -> dict[str, Any]:
    return dict(cluster.request("GET", f"{SECRETS}/{SECRET}"))


def test_an_invalid_layouts_configmap_is_refused_with_the_validate_message(
    layouts: tuple[ControlPlane, Replica], tmp_path: Path
) -> None:
    cluster, _ = layouts
    # The controller made its CA, kept it in the Secret and put it into the shipped object.
    assert ca_bundle(cluster) == base64.b64decode(secret(cluster)["data"]["ca.crt"])
    expected = validate_lines(tmp_path, INVALID)
    assert len(expected) >= 2, expected
    proc = kubectl(cluster, "apply", "-f", "-", stdin=configmap(LAYOUTS, INVALID))
    assert proc.returncode != 0, proc.stdout
    assert 'admission webhook "layouts.vgpu-state.io" denied the request' in proc.stderr
    for line in expected:
        assert line in proc.stderr, f"{line!r} missing from kubectl's error:\n{proc.stderr}"
    live = cluster.request("GET", f"/api/v1/namespaces/{NS}/configmaps/{LAYOUTS}")
    assert "NOT-A-TYPE" not in live["data"]["config.yaml"]

    proc = kubectl(cluster, "apply", "-f", "-", stdin=configmap(LAYOUTS, VALID))
    assert proc.returncode == 0, proc.stderr
    live = cluster.request("GET", f"/api/v1/namespaces/{NS}/configmaps/{LAYOUTS}")
    assert live["data"]["config.yaml"].strip() == VALID.strip()


def test_with_the_controller_stopped_only_layouts_edits_wait(
    layouts: tuple[ControlPlane, Replica],
) -> None:
    cluster, replica = layouts
    replica.shutdown()
    for namespace in (NS, "default"):
        proc = kubectl(
            cluster, "apply", "-f", "-", stdin=configmap("unrelated", INVALID, namespace)
        )
        assert proc.returncode == 0, (
            f"an unrelated ConfigMap in {namespace} was blocked: {proc.stderr}"
        )
    proc = kubectl(cluster, "apply", "-f", "-", stdin=configmap(LAYOUTS, VALID))
    assert proc.returncode != 0, "an unchecked layouts edit went through during the outage"
    assert 'failed calling webhook "layouts.vgpu-state.io"' in proc.stderr


def test_replicas_share_one_certificate_and_a_renewal_keeps_the_ca(
    layouts: tuple[ControlPlane, Replica], tmp_path: Path
) -> None:
    cluster, first = layouts
    before = secret(cluster)
    second = Replica(cluster, tmp_path, "b")
    try:
        second.keeper.check()
        assert second.keeper.server._loaded == first.keeper.server._loaded
        assert (
            secret(cluster)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        )
    finally:
        second.shutdown()

    # A Secret made eleven months ago: its serving certificate has 25 days left and is
    # renewed under the same CA, which the caBundle keeps trusting.
    old = tls.issue(SERVICE, NS, dt.datetime.now(dt.UTC) - dt.timedelta(days=340))
    aged = secret(cluster)
    aged["data"] = old.secret_data()
    cluster.request("PUT", f"{SECRETS}/{SECRET}", aged)
    first.keeper.check()
    after = secret(cluster)
    assert after["data"]["tls.crt"] not in (before["data"]["tls.crt"], aged["data"]["tls.crt"])
    assert after["data"]["ca.crt"] == aged["data"]["ca.crt"]
    assert ca_bundle(cluster) == base64.b64decode(after["data"]["ca.crt"])
    served = served_certificate(first.port)
    assert served == ssl.PEM_cert_to_DER_cert(base64.b64decode(after["data"]["tls.crt"]).decode())
    # And the API server, trusting the same caBundle, still reaches the webhook.
    proc = kubectl(cluster, "apply", "-f", "-", stdin=configmap(LAYOUTS, INVALID))
    assert 'admission webhook "layouts.vgpu-state.io" denied the request' in proc.stderr


def served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + 5
    while True:
        try:
            name = f"{SERVICE}.{NS}.svc"
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                context.wrap_socket(raw, server_hostname=name) as conn,
            ):
                der = conn.getpeercert(binary_form=True)
                assert der is not None
                return der
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
