"""The Kubernetes client is loaded only by commands that talk to a cluster.

``import kubernetes`` costs about half a second (its generated API modules more
than a second); a plan against a simulated or local node must not pay for it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

REPO = Path(__file__).resolve().parent.parent


def _imported(args: list[str]) -> set[str]:
    """Top-level packages a fresh interpreter imported while running ``args``."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "import time:" in result.stderr, result.stderr[-2000:]
    names: set[str] = set()
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        module = line.rsplit("|", 1)[1].strip()
        names.add(module.split(".")[0])
    return names


def test_a_command_without_cluster_flags_never_loads_kubernetes() -> None:
    spec = REPO / "configs" / "sim" / "mixed.yaml"
    config = REPO / "configs" / "examples" / "mixed-node.yaml"
    names = _imported(["-m", "vgpu_state.cli.main", "plan", "-f", str(config), "--sim", str(spec)])
    assert "vgpu_state" in names  # the measurement itself works
    assert "kubernetes" not in names
    assert "grpc" not in names


def test_importing_the_cluster_package_loads_no_client() -> None:
    names = _imported(
        [
            "-c",
            "import vgpu_state.kube, vgpu_state.kube.api, vgpu_state.kube.kubevirt, "
            "vgpu_state.kube.node",
        ]
    )
    assert "vgpu_state" in names
    assert "kubernetes" not in names
    assert "grpc" not in names


def _plain_kubeconfig(tmp_path: Path) -> Path:
    kubeconfig = tmp_path / "plain"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "x",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    return kubeconfig


def _plugin_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose user is an OIDC auth provider with a valid token (read by the
    client's loader; no request to the provider)."""
    kubeconfig = tmp_path / "plugin"
    provider = {"client-id": "x", "id-token": FRESH, "idp-issuer-url": "http://127.0.0.1:9"}
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "x",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "users": [
                    {"name": "u", "user": {"auth-provider": {"name": "oidc", "config": provider}}}
                ],
            }
        )
    )
    return kubeconfig


CONNECT = (
    "from vgpu_state.kube.api import KubeApi\n"
    "try:\n    KubeApi.connect({kubeconfig!r}, in_cluster={in_cluster})\n"
    "except Exception as e:\n    assert 'cannot load Kubernetes credentials' in str(e), e"
)


def test_the_service_account_or_a_plain_kubeconfig_loads_no_client(tmp_path: Path) -> None:
    """The in-cluster service account and a kubeconfig with a token or certificates are
    read without the official client (nor ``urllib3``, its HTTP library)."""
    for kubeconfig, in_cluster in (
        (str(_plain_kubeconfig(tmp_path)), None),
        (str(tmp_path / "missing"), None),
        (None, True),
    ):
        names = _imported(["-c", CONNECT.format(kubeconfig=kubeconfig, in_cluster=in_cluster)])
        assert "vgpu_state" in names
        assert not {"kubernetes", "urllib3", "yaml"} & names, (kubeconfig, in_cluster)


def test_a_kubeconfig_with_a_credential_plugin_loads_only_the_client_parts_it_uses(
    tmp_path: Path,
) -> None:
    """The client's kubeconfig loader reads what the product does not (here an auth
    provider). Not the dynamic client (jsonschema), streams (websocket), informer or
    leader election, nor the date parser of the generated models (dateutil), nor its
    OAuth support (requests), which refreshes expired OIDC tokens only."""
    heavy = {"kubernetes_validate", "jsonschema", "websocket", "referencing", "dateutil"}
    probe = CONNECT.format(kubeconfig=str(_plugin_kubeconfig(tmp_path)), in_cluster=None)
    names = _imported(["-c", probe])
    assert {"kubernetes", "yaml"} <= names
    assert not (heavy | {"requests_oauthlib", "requests"}) & names


def test_the_kubernetes_package_is_whole_for_other_code_after_connecting(
    tmp_path: Path,
) -> None:
    probe = (
        "import sys\n"
        "from vgpu_state.kube.api import KubeApi\n"
        f"KubeApi.connect({str(_plugin_kubeconfig(tmp_path))!r})\n"
        "assert 'kubernetes.client.configuration' in sys.modules\n"
        "assert 'kubernetes.dynamic' not in sys.modules\n"
        "import kubernetes\n"
        "from kubernetes import dynamic, config, utils\n"
        "assert kubernetes.__version__\n"
        "assert kubernetes.watch.Watch and kubernetes.stream.stream\n"
        "assert dynamic.DynamicClient and config.load_kube_config\n"
        "assert config.new_client_from_config\n"
        "assert utils.parse_quantity('1Ki') == 1024\n"
        "when = kubernetes.client.ApiClient().deserialize(\n"
        "    '\"2024-05-06T07:08:09Z\"', 'datetime', 'application/json')\n"
        "assert (when.year, when.hour, when.utcoffset().total_seconds()) == (2024, 7, 0)\n"
        "assert 'kubernetes.dynamic' in sys.modules\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


# OIDC: the kubeconfig loader refreshes an expired ID token at the identity provider ---------
def _jwt(claims: dict[str, object]) -> str:
    def part(doc: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.c2lnbmF0dXJl"


EXPIRED = _jwt({"sub": "alice", "exp": int(time.time()) - 3600})
FRESH = _jwt({"sub": "alice", "exp": int(time.time()) + 3600})
REFRESHED = _jwt({"sub": "alice", "exp": int(time.time()) + 7200})


class _IdentityProvider(BaseHTTPRequestHandler):
    """An OpenID Connect provider's discovery document and token endpoint (the identity
    provider is outside Kubernetes; the kubeconfig loader asks it for a new ID token)."""

    refuse = False
    refreshes: ClassVar[list[bytes]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, status: int, document: dict[str, object]) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        issuer = f"http://{self.headers['Host']}"
        self._answer(200, {"issuer": issuer, "token_endpoint": f"{issuer}/token"})

    def do_POST(self) -> None:
        self.refreshes.append(self.rfile.read(int(self.headers["Content-Length"])))
        if self.refuse:
            self._answer(400, {"error": "invalid_request", "error_description": "unknown client"})
            return
        self._answer(
            200,
            {
                "access_token": "access",
                "token_type": "Bearer",
                "id_token": REFRESHED,
                "refresh_token": "refresh-2",
                "expires_in": 3600,
            },
        )


@pytest.fixture
def identity_provider() -> Iterator[tuple[str, type[_IdentityProvider]]]:
    handler = type("Provider", (_IdentityProvider,), {"refreshes": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _oidc_credentials(tmp_path: Path, issuer: str, id_token: str) -> tuple[str, bool]:
    """The bearer token a fresh process loads from an OIDC kubeconfig, and whether it
    loaded the OAuth support (``requests_oauthlib``) meanwhile."""
    user = {
        "auth-provider": {
            "name": "oidc",
            "config": {
                "client-id": "vgpu-state",
                "client-secret": "secret",
                "id-token": id_token,
                "refresh-token": "refresh-1",
                "idp-issuer-url": issuer,
            },
        }
    }
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "oidc",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "contexts": [{"name": "oidc", "context": {"cluster": "c", "user": "oidc"}}],
                "users": [{"name": "oidc", "user": user}],
            }
        )
    )
    probe = (
        "import json, os, sys\n"
        "os.environ['OAUTHLIB_INSECURE_TRANSPORT'] = '1'  # the provider speaks plain HTTP\n"
        "from vgpu_state.kube.api import KubeApi\n"
        f"api = KubeApi.connect({str(kubeconfig)!r})\n"
        "print(json.dumps([api.client.authorization(),\n"
        "                  'requests_oauthlib' in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    token, oauth_loaded = json.loads(done.stdout)
    return str(token), bool(oauth_loaded)


def test_an_expired_oidc_token_is_refreshed_at_the_identity_provider(
    tmp_path: Path, identity_provider: tuple[str, type[_IdentityProvider]]
) -> None:
    issuer, provider = identity_provider
    token, oauth_loaded = _oidc_credentials(tmp_path, issuer, EXPIRED)
    assert token == f"Bearer {REFRESHED}"
    assert len(provider.refreshes) == 1
    assert b"refresh_token=refresh-1" in provider.refreshes[0]
    assert oauth_loaded


def test_a_refresh_the_provider_refuses_keeps_the_token_from_the_kubeconfig(
    tmp_path: Path, identity_provider: tuple[str, type[_IdentityProvider]]
) -> None:
    issuer, provider = identity_provider
    provider.refuse = True
    token, _ = _oidc_credentials(tmp_path, issuer, EXPIRED)
    assert token == f"Bearer {EXPIRED}"
    assert len(provider.refreshes) == 1


def test_a_valid_oidc_token_is_used_as_it_is_without_loading_the_oauth_support(
    tmp_path: Path, identity_provider: tuple[str, type[_IdentityProvider]]
) -> None:
    issuer, provider = identity_provider
    token, oauth_loaded = _oidc_credentials(tmp_path, issuer, FRESH)
    assert token == f"Bearer {FRESH}"
    assert provider.refreshes == []
    assert not oauth_loaded
