"""The standard-library transport to the API server, with the credentials it reads.

On the real kube-apiserver: the in-cluster service account (its token replaced the
way the kubelet rotates a projected token), TLS verified against the cluster's CA
(a wrong CA, ``insecure-skip-tls-verify``, ``tls-server-name``), certificates inline
in a kubeconfig, and an HTTP proxy (``proxy-url``, ``NO_PROXY``). A kept connection
the server closed meanwhile needs a server that closes one on demand: a small local
HTTP server stands in for it.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import NAMESPACE, ControlPlane, make_pki
from vgpu_state.kube import credentials
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.errors import ClusterError, ClusterUnreachableError
from vgpu_state.kube.transport import Endpoint, Transport

REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
NODE_NAME = "authentication.kubernetes.io/node-name"


def _user(api: KubeApi) -> dict[str, Any]:
    """Who the server takes the sender to be."""
    review = api.create("/apis/authentication.k8s.io/v1/selfsubjectreviews", REVIEW)
    return dict(review["status"]["userInfo"])


def _project_token(account: Path, token: str, generation: int) -> None:
    """Write ``token`` as the kubelet writes a projected volume: a new directory, then
    ``..data`` swapped to it atomically; ``token`` is a link through ``..data``."""
    version = account / f"..gen_{generation}"
    version.mkdir()
    (version / "token").write_text(token)
    (account / "..data_tmp").symlink_to(version.name)
    os.rename(account / "..data_tmp", account / "..data")
    if not (account / "token").is_symlink():
        (account / "token").symlink_to("..data/token")


def test_the_service_account_token_is_read_again_when_the_kubelet_rotates_it(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes((cluster.pki / "ca.crt").read_bytes())
    _project_token(account, cluster.agent_token("node-a"), 1)
    port = cluster.url.rsplit(":", 1)[1]
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    endpoint = credentials.in_cluster(environ, account)
    assert endpoint.server == cluster.url
    api = KubeApi(Transport(endpoint), endpoint.server, (5.0, 10.0))
    assert _user(api)["extra"][NODE_NAME] == ["node-a"]
    _project_token(account, cluster.agent_token("node-b"), 2)
    assert _user(api)["extra"][NODE_NAME] == ["node-b"]


def test_the_service_account_is_refused_clearly_outside_a_pod(tmp_path: Path) -> None:
    with pytest.raises(credentials.CredentialsError, match="not set"):
        credentials.in_cluster({}, tmp_path)
    environ = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(credentials.CredentialsError, match=f"{tmp_path}/token does not exist"):
        credentials.in_cluster(environ, tmp_path)


def _kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_the_server_is_verified_against_the_cluster_ca(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    other = tmp_path / "other-pki"
    other.mkdir()
    make_pki(other)
    admin = {
        "client-certificate": str(cluster.pki / "admin.crt"),
        "client-key": str(cluster.pki / "admin.key"),
    }
    wrong_ca = {"server": cluster.url, "certificate-authority": str(other / "ca.crt")}
    api = KubeApi.connect(str(_kubeconfig(tmp_path / "wrong", wrong_ca, admin)))
    with pytest.raises(ClusterUnreachableError, match="CERTIFICATE_VERIFY_FAILED"):
        api.list("/api/v1/nodes")
    skip = {**wrong_ca, "insecure-skip-tls-verify": True}
    api = KubeApi.connect(str(_kubeconfig(tmp_path / "skip", skip, admin)))
    assert api.list("/api/v1/nodes") is not None
    # The certificate names 127.0.0.1 and localhost.
    right = {"server": cluster.url, "certificate-authority": str(cluster.pki / "ca.crt")}
    for name, works in (("localhost", True), ("elsewhere.example", False)):
        named = {**right, "tls-server-name": name}
        api = KubeApi.connect(str(_kubeconfig(tmp_path / name, named, admin)))
        if works:
            assert api.list("/api/v1/nodes") is not None
        else:
            with pytest.raises(ClusterUnreachableError, match="CERTIFICATE_VERIFY_FAILED"):
                api.list("/api/v1/nodes")


def test_certificates_inline_in_the_kubeconfig(cluster: ControlPlane, tmp_path: Path) -> None:
    def inline(name: str) -> str:
        return base64.b64encode((cluster.pki / name).read_bytes()).decode()

    config = _kubeconfig(
        tmp_path / "kubeconfig",
        {"server": cluster.url, "certificate-authority-data": inline("ca.crt")},
        {"client-certificate-data": inline("user.crt"), "client-key-data": inline("user.key")},
    )
    before = set(Path(tempfile.gettempdir()).glob("vgpu-state-tls-*"))
    api = KubeApi.connect(str(config))
    assert _user(api)["username"] == "vgpu-state-test-user"
    # The key went through a private directory, removed once loaded.
    assert set(Path(tempfile.gettempdir()).glob("vgpu-state-tls-*")) == before
    bad = _kubeconfig(
        tmp_path / "bad",
        {"server": cluster.url, "certificate-authority-data": "not base64!"},
        {"token": "t"},
    )
    with pytest.raises(
        ClusterUnreachableError, match=f"{bad}: certificate-authority-data is not base64"
    ):
        KubeApi.connect(str(bad))


class _ConnectProxy:
    """An HTTP proxy that tunnels ``CONNECT host:port`` and records the targets."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.targets: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            piece = client.recv(4096)
            if not piece:
                client.close()
                return
            head += piece
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
        assert method == "CONNECT"
        self.targets.append(target)
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        pair = [client, upstream]
        try:
            while True:
                readable, _, _ = select.select(pair, [], [], 30)
                if not readable:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (upstream if sock is client else client).sendall(data)
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxy() -> Iterator[_ConnectProxy]:
    running = _ConnectProxy()
    try:
        yield running
    finally:
        running.close()


def test_requests_go_through_the_proxy_unless_no_proxy_names_the_server(
    cluster: ControlPlane, tmp_path: Path, proxy: _ConnectProxy
) -> None:
    token = cluster.agent_token("node-a")
    server = {
        "server": cluster.url,
        "certificate-authority": str(cluster.pki / "ca.crt"),
        "proxy-url": proxy.url,
    }
    api = KubeApi.connect(str(_kubeconfig(tmp_path / "kubeconfig", server, {"token": token})))
    assert _user(api)["extra"][NODE_NAME] == ["node-a"]
    assert proxy.targets == [cluster.url.removeprefix("https://")]
    direct = Endpoint(
        server=cluster.url,
        ca_file=str(cluster.pki / "ca.crt"),
        token=token,
        proxy=proxy.url,
        no_proxy="example.com, 127.0.0.0/8",
    )
    assert _user(KubeApi(Transport(direct), cluster.url, (5.0, 10.0)))["extra"][NODE_NAME]
    assert len(proxy.targets) == 1


class _ClosesIdle(BaseHTTPRequestHandler):
    """Answers with keep-alive, then closes the connection (as a server timing out an
    idle connection does)."""

    protocol_version = "HTTP/1.1"
    served: list[str] = []  # noqa: RUF012 - one server per test

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.served.append(self.command)
        body = b'{"kind":"Status"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.close_connection = True

    do_GET = do_PATCH = _answer


class _Closing(ThreadingHTTPServer):
    closed = threading.Event()

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.closed.set()


def test_a_kept_connection_the_server_closed_is_replaced() -> None:
    handler = type("Handler", (_ClosesIdle,), {"served": []})
    server = _Closing(("127.0.0.1", 0), handler)
    closed = server.closed = threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        api = KubeApi(Transport(Endpoint(server=url)), url, (2.0, 2.0))
        for _ in range(3):
            assert api.get("/api/v1/nodes/n") == {"kind": "Status"}
            assert closed.wait(5)  # the kept connection is closed now
            closed.clear()
            assert api.patch("/api/v1/nodes/n", {"metadata": {}}, "merge") == {"kind": "Status"}
            assert closed.wait(5)
            closed.clear()
        assert handler.served == ["GET", "PATCH"] * 3
    finally:
        server.shutdown()
        server.server_close()


def test_a_refusal_keeps_its_status_and_reason(cluster: ControlPlane) -> None:
    cluster.refusals_expected = True
    api = KubeApi(cluster.api_client(cluster.agent_token("node-a")), cluster.url, (5.0, 10.0))
    with pytest.raises(ClusterError) as refused:
        api.list(f"/api/v1/namespaces/{NAMESPACE}/secrets")
    assert (refused.value.status, refused.value.api_reason) == (403, "Forbidden")
    assert "the credentials lack permission" in str(refused.value)


def test_a_kubeconfigs_paths_are_read_from_its_directory(tmp_path: Path) -> None:
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "token").write_text("from-the-file\n")
    config = _kubeconfig(
        tmp_path / "kubeconfig",
        {"server": "https://10.0.0.1:6443", "certificate-authority": "creds/ca.crt"},
        {"token": "inline", "tokenFile": "creds/token"},
    )
    endpoint = credentials.from_kubeconfig(str(config), None)
    assert endpoint.ca_file == str(tmp_path / "creds" / "ca.crt")
    assert endpoint.token_file == str(tmp_path / "creds" / "token")
    # As the official client does: the token file, not the inline token.
    assert endpoint.token is None
    endpoint = Endpoint(server="http://10.0.0.1:8080", token_file=endpoint.token_file)
    assert Transport(endpoint).authorization() == "Bearer from-the-file"
    with pytest.raises(credentials.CredentialsError, match=f"{config}: no context named 'other'"):
        credentials.from_kubeconfig(str(config), "other")


def test_several_kubeconfigs_are_merged_by_the_clients_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _kubeconfig(tmp_path / "first", {"server": "https://10.0.0.1:6443"}, {"token": "a"})
    second = tmp_path / "second"
    second.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "d", "cluster": {"server": "https://10.0.0.2:6443"}}],
                "users": [{"name": "v", "user": {"token": "b"}}],
                "contexts": [{"name": "y", "context": {"cluster": "d", "user": "v"}}],
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    endpoint = credentials.from_kubeconfig(None, "y")
    assert endpoint.server == "https://10.0.0.2:6443"
    assert Transport(endpoint).authorization() == "Bearer b"
