"""Where the API server is and how to authenticate: the in-cluster service account or a
kubeconfig, read into a :class:`~vgpu_state.kube.transport.Endpoint`.

The in-cluster service account and a kubeconfig whose user has a token, a token
file, a client certificate or a user and password are read here (the YAML with
``ruamel.yaml``, which the layouts loader uses anyway). A kubeconfig that needs
more (a credential plugin, ``exec``; an ``auth-provider``; several files in
``$KUBECONFIG`` to merge) is read by the official ``kubernetes`` client's loader,
loaded only then (:mod:`vgpu_state.kube.clientimport`), and its result taken over,
with the loader's token refresh.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vgpu_state.kube.transport import Endpoint

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialsError(Exception):
    """The credentials could not be read (the caller says from where)."""


def in_cluster(
    environ: Mapping[str, str] = os.environ, account: Path = SERVICE_ACCOUNT
) -> Endpoint:
    """The pod's service account: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the token
    (read again whenever the kubelet rotates it) and the cluster's CA."""
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT")
    if host is None or port is None:
        raise CredentialsError("Service host/port is not set (not running in a pod).")
    if not host or not port:
        raise CredentialsError("Service host/port is set but empty.")
    token, ca = account / "token", account / "ca.crt"
    if not token.is_file():
        raise CredentialsError(f"Service token file {token} does not exist.")
    if not ca.is_file():
        raise CredentialsError(f"Service certification file {ca} does not exist.")
    if not token.read_text(encoding="utf-8").strip():
        raise CredentialsError(f"Service token file {token} is empty.")
    where = f"[{host}]" if ":" in host or "%" in host else host
    return Endpoint(server=f"https://{where}:{port}", ca_file=str(ca), token_file=str(token))


def from_kubeconfig(path: str | None, context: str | None) -> Endpoint:
    """The endpoint of ``context`` (``None``: the current one) in the kubeconfig ``path``
    (``None``: ``$KUBECONFIG``, else ``~/.kube/config``)."""
    if path is None:
        path = os.environ.get("KUBECONFIG") or "~/.kube/config"
    if os.pathsep in path:  # several files to merge
        return _via_client(path, context)
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        raise CredentialsError(f"cannot read {file}: {e.strerror or e}") from None
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        doc = YAML(typ="safe", pure=True).load(text)
    except YAMLError as e:
        raise CredentialsError(f"{file} is not valid YAML: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise CredentialsError(f"{file}: no configuration found")
    name = context or doc.get("current-context")
    if not name:
        raise CredentialsError(f"{file}: no context given and no current-context")
    ctx = _named(doc, "contexts", "context", str(name), file)
    cluster = _named(doc, "clusters", "cluster", str(ctx.get("cluster") or ""), file)
    user_name = ctx.get("user")
    user = _named(doc, "users", "user", str(user_name), file) if user_name else {}
    if "exec" in user or "auth-provider" in user:
        return _via_client(str(file), context)
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise CredentialsError(f"{file}: cluster {ctx.get('cluster')!r} has no server")
    base = file.parent

    def file_of(value: object) -> str | None:
        if not value:
            return None
        return str(base / str(value))  # relative paths: from the kubeconfig's directory

    def data_of(value: object, what: str) -> bytes | None:
        if not value:
            return None
        try:
            return base64.b64decode(str(value), validate=True)
        except ValueError:
            raise CredentialsError(f"{file}: {what} is not base64") from None

    ca_data = data_of(cluster.get("certificate-authority-data"), "certificate-authority-data")
    token = None if user.get("tokenFile") else user.get("token")  # the file first
    return Endpoint(
        server=server,
        ca_file=None if ca_data else file_of(cluster.get("certificate-authority")),
        ca_data=ca_data.decode("ascii", "replace") if ca_data else None,
        verify=not cluster.get("insecure-skip-tls-verify", False),
        tls_server_name=cluster.get("tls-server-name") or None,
        proxy=cluster.get("proxy-url") or None,
        cert_file=file_of(user.get("client-certificate")),
        key_file=file_of(user.get("client-key")),
        cert_data=data_of(user.get("client-certificate-data"), "client-certificate-data"),
        key_data=data_of(user.get("client-key-data"), "client-key-data"),
        token=str(token) if token else None,
        token_file=file_of(user.get("tokenFile")),
        username=str(user["username"]) if user.get("username") else None,
        password=str(user["password"]) if user.get("password") else None,
    )


def _named(doc: Mapping[str, Any], section: str, key: str, name: str, file: Path) -> Any:
    for entry in doc.get(section) or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key) or {}
            if not isinstance(value, dict):
                raise CredentialsError(f"{file}: {section[:-1]} {name!r} is not a mapping")
            return value
    raise CredentialsError(f"{file}: no {section[:-1]} named {name!r}")


def _via_client(path: str, context: str | None) -> Endpoint:
    """The official client's kubeconfig loader (credential plugins, auth providers,
    merged files), its configuration as an endpoint."""
    from vgpu_state.kube.clientimport import client_parts, kubeconfig_loader

    configuration = client_parts().configuration()
    kubeconfig_loader()(
        config_file=path,
        context=context,
        client_configuration=configuration,
        persist_config=False,
    )
    return from_configuration(configuration)


def from_configuration(configuration: Any) -> Endpoint:
    """An endpoint from a ``kubernetes.client.Configuration`` (the client's loaders
    fill one): its token asked of it at each request, so that its refresh hook runs."""
    token_source: Callable[[], str | None] | None = None
    if configuration.api_key or configuration.refresh_api_key_hook is not None:

        def token_source() -> str | None:
            value = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
            return str(value) if value else None

    return Endpoint(
        server=str(configuration.host),
        ca_file=configuration.ssl_ca_cert or None,
        verify=bool(configuration.verify_ssl),
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
        tls_server_name=getattr(configuration, "tls_server_name", None) or None,
        token_source=token_source,
        username=configuration.username or None,
        password=configuration.password or None,
        proxy=getattr(configuration, "proxy", None) or None,
        no_proxy=getattr(configuration, "no_proxy", None) or None,
    )
