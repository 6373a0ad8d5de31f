"""A real Kubernetes control plane for tests: upstream etcd and kube-apiserver on 127.0.0.1.

The binaries are built from the Go module proxy by ``hack/k8s/build.sh`` (the
Kubernetes release ``hack/k8s/go.mod`` pins) into ``hack/k8s/bin/``. The API
server runs as production clusters run it: TLS only, client certificates for
the admin, ``--authorization-mode=Node,RBAC``, the ``NodeRestriction``
admission plugin beside the default ones (ValidatingAdmissionPolicy,
validating and mutating webhooks), bound ServiceAccount tokens. No
scheduler or kubelet runs: a test creates the Node and a Pod with
``spec.nodeName`` itself when it needs the identity of an agent on that node
(:meth:`ControlPlane.agent_token`). A test that needs the garbage collector starts
kube-controller-manager with only that controller
(:meth:`ControlPlane.start_controller_manager`); one that needs the storage to fail
kills etcd and starts it again on its data (:meth:`ControlPlane.kill_etcd`,
:meth:`ControlPlane.restart_etcd`).

:meth:`ControlPlane.install` applies the rendered ``deploy/`` (CRD, RBAC,
namespace, ConfigMap, DaemonSet) and a KubeVirt CRD whose schema is KubeVirt's
own OpenAPI definitions (:func:`kubevirt_crd`), so every object a test or the
product writes is checked by the server's own validation.

``python -m tests.realcluster DIR`` (``make cluster``) runs one in the
foreground and writes ``DIR/kubeconfig`` for the user; ``python -m
tests.realcluster agent-kubeconfig DIR NODE`` writes one with the agent's token
for NODE beside it.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack" / "k8s"
BIN = Path(os.environ.get("VGPU_STATE_K8S_BIN") or HACK / "bin")
KUBEVIRT_OPENAPI = Path("/work/shared/reference/kubevirt-cr.openapi.json")  # as tests/apiserver.py
KUBEVIRT_SWAGGER = (
    Path(os.environ.get("VGPU_STATE_KUBEVIRT_BIN") or REPO / "hack" / "kubevirt" / "bin")
    / "swagger.json"
)
"""KubeVirt's own OpenAPI document (``hack/kubevirt/fetch.sh``): the VM, VMI and migration
CRDs' schemas."""
NAMESPACE = "vgpu-state"
AGENT_SA = "vgpu-state-agent"
CONTROLLER_SA = "vgpu-state-controller"
FLEET_READER_SA = "vgpu-state-fleet-reader"
"""The read-only ServiceAccount of ``examples/gitops/fleet-reader.yaml``."""


def service_account_user(name: str, namespace: str = NAMESPACE) -> str:
    """The user name the API server (and its audit log) gives a ServiceAccount's token."""
    return f"system:serviceaccount:{namespace}:{name}"


AGENT_USER = service_account_user(AGENT_SA)
CONTROLLER_USER = service_account_user(CONTROLLER_SA)
FLEET_READER_USER = service_account_user(FLEET_READER_SA)
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
"""The audit log's verbs of the requests that change objects."""
ADMIN = "vgpu-state-test-admin"
USER = "vgpu-state-test-user"
"""A second cluster admin (``system:masters``): the person running ``fleet plan`` or
``kubectl`` in a test, so the audit log tells their requests from the test's own."""


class Unavailable(Exception):
    """The control plane cannot run on this machine (no Go, or a build failed); says why."""


# binaries -----------------------------------------------------------------------------
def binaries(build: bool = True) -> tuple[Path, Path]:
    """``(kube-apiserver, etcd)``, built by ``hack/k8s/build.sh`` when missing or stale."""
    wanted = (BIN / "kube-apiserver", BIN / "etcd")
    go = os.environ.get("GO") or shutil.which("go") or _go_in_usual_places()
    if go is not None and not os.access(go, os.X_OK):
        go = None
    if go is None:
        if all(p.exists() for p in wanted):
            return wanted
        raise Unavailable(
            "Go is not installed: the real-cluster tests build kube-apiserver and etcd "
            "from the Go module proxy (hack/k8s/build.sh)"
        )
    if build:
        _build(go)
    missing = [str(p) for p in wanted if not p.exists()]
    if missing:
        raise Unavailable(f"not built: {', '.join(missing)}")
    return wanted


def built(program: str) -> Path:
    """Another program of ``hack/k8s/cmd`` (``vap-status``), built by ``hack/k8s/build.sh``
    into the same directory when missing or stale."""
    go = os.environ.get("GO") or shutil.which("go") or _go_in_usual_places()
    if go is None or not os.access(go, os.X_OK):
        if (BIN / program).exists():
            return BIN / program
        raise Unavailable(f"Go is not installed: {program} is built from hack/k8s/cmd")
    _build(go, program)
    return BIN / program


def _build(go: str, *programs: str) -> None:
    proc = subprocess.run(
        ["sh", str(HACK / "build.sh"), *programs],
        env={**os.environ, "GO": go, "VGPU_STATE_K8S_BIN": str(BIN)},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise Unavailable(f"hack/k8s/build.sh failed ({proc.returncode}): {proc.stderr[-2000:]}")


def controller_manager() -> Path:
    """kube-controller-manager, built with the others (:func:`binaries`); :class:`Unavailable`
    when it is not."""
    binary = BIN / "kube-controller-manager"
    if not binary.exists():
        raise Unavailable(
            f"no kube-controller-manager: {binary} is not built "
            "(hack/k8s/build.sh kube-controller-manager)"
        )
    return binary


def _go_in_usual_places() -> str | None:
    for candidate in ("/usr/local/go/bin/go", str(Path.home() / "go" / "bin" / "go")):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# certificates ---------------------------------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr}")


def make_pki(directory: Path) -> None:
    """A CA, the API server's serving certificate (127.0.0.1, localhost), an admin client
    certificate (group ``system:masters``) and the ServiceAccount token signing key."""
    if shutil.which("openssl") is None:
        raise Unavailable("openssl is not installed (it makes the test cluster's certificates)")
    d = directory
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
             "-subj", "/CN=vgpu-state-test-ca", cwd=d)  # fmt: skip
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\n"
    )
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject, ext in (
        ("server", "/CN=kube-apiserver", "server.ext"),
        ("admin", f"/O=system:masters/CN={ADMIN}", "client.ext"),
        ("user", f"/O=system:masters/CN={USER}", "client.ext"),
    ):
        _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "30", "-extfile", ext,
                 cwd=d)  # fmt: skip
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=d)
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


# the KubeVirt CRD --------------------------------------------------------------------------
_KEEP = {"type", "format", "enum", "required", "nullable", "pattern", "minimum", "maximum"}


def structural(definitions: dict[str, Any], node: dict[str, Any], seen: frozenset[str]) -> Any:
    """One OpenAPI v2 definition as a structural schema: ``$ref``s inlined, descriptions and
    defaults dropped, quantities int-or-string, free-form objects kept as they come."""
    ref = node.get("$ref")
    if ref is not None:
        name = ref.rsplit("/", 1)[-1]
        if name == "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta":
            return {"type": "object"}
        if name in seen:  # recursion: stop describing here
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return structural(definitions, definitions[name], seen | {name})
    if node.get("format") == "int-or-string" or node.get("x-kubernetes-int-or-string"):
        return {"x-kubernetes-int-or-string": True}
    out: dict[str, Any] = {k: v for k, v in node.items() if k in _KEEP}
    if isinstance(out.get("type"), list):  # ["string", "null"]: a nullable string
        kinds = [t for t in out["type"] if t != "null"]
        if len(kinds) != 1:
            return {"x-kubernetes-int-or-string": True}
        out["type"] = kinds[0]
        if len(kinds) < len(node["type"]):
            out["nullable"] = True
    if "properties" in node:
        out["properties"] = {
            k: structural(definitions, v, seen) for k, v in node["properties"].items()
        }
    if "items" in node:
        out["items"] = structural(definitions, node["items"], seen)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(definitions, node["additionalProperties"], seen)
    if "type" not in out:
        out["type"] = "object" if "properties" in out or "additionalProperties" in out else None
    if out["type"] is None:
        del out["type"]
        out["x-kubernetes-preserve-unknown-fields"] = True
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def kubevirt_crd(path: Path = KUBEVIRT_OPENAPI) -> dict[str, Any]:
    """The ``kubevirts.kubevirt.io`` CRD with KubeVirt's own schema of ``v1.KubeVirt``."""
    definitions = json.loads(path.read_text())["definitions"]
    quantity = "k8s.io.apimachinery.pkg.api.resource.Quantity"
    if quantity in definitions:
        definitions[quantity] = {"format": "int-or-string"}
    schema = structural(definitions, {"$ref": "#/definitions/v1.KubeVirt"}, frozenset())
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "kubevirts.kubevirt.io"},
        "spec": {
            "group": "kubevirt.io",
            "names": {
                "kind": "KubeVirt",
                "listKind": "KubeVirtList",
                "plural": "kubevirts",
                "singular": "kubevirt",
                "shortNames": ["kv", "kvs"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


VM_KINDS: tuple[tuple[str, str, list[str]], ...] = (
    ("VirtualMachine", "virtualmachines", ["vm", "vms"]),
    ("VirtualMachineInstance", "virtualmachineinstances", ["vmi", "vmis"]),
    ("VirtualMachineInstanceMigration", "virtualmachineinstancemigrations", ["vmim"]),
)


def kubevirt_vm_crds(path: Path = KUBEVIRT_SWAGGER) -> list[dict[str, Any]]:
    """The CRDs of KubeVirt's ``VirtualMachine``, ``VirtualMachineInstance`` and
    ``VirtualMachineInstanceMigration`` with the schemas of KubeVirt's own OpenAPI
    (``hack/kubevirt/fetch.sh``); :class:`Unavailable` when it was not fetched."""
    if not path.exists():
        raise Unavailable(
            f"no KubeVirt OpenAPI ({path}): hack/kubevirt/fetch.sh downloads it from the Go "
            "module proxy (scripts/ensure-k8s runs it)"
        )
    definitions = json.loads(path.read_text())["definitions"]
    quantity = "k8s.io.apimachinery.pkg.api.resource.Quantity"
    if quantity in definitions:
        definitions[quantity] = {"format": "int-or-string"}
    crds = []
    for kind, plural, short in VM_KINDS:
        schema = structural(definitions, {"$ref": f"#/definitions/v1.{kind}"}, frozenset())
        crds.append({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kubevirt.io"},
            "spec": {
                "group": "kubevirt.io",
                "names": {
                    "kind": kind,
                    "listKind": f"{kind}List",
                    "plural": plural,
                    "singular": kind.lower(),
                    "shortNames": short,
                },
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }],
            },
        })  # fmt: skip
    return crds


# paths ------------------------------------------------------------------------------------
def api_path(kind: str, name: str | None = None, namespace: str | None = None) -> str:
    """``"v1/nodes"`` / ``"kubevirt.io/v1/kubevirts"`` (+ name, namespace) as a URL path."""
    parts = kind.split("/")
    prefix = f"/api/{parts[0]}" if len(parts) == 2 else f"/apis/{parts[0]}/{parts[1]}"
    path = prefix + (f"/namespaces/{namespace}" if namespace else "") + f"/{parts[-1]}"
    return path + (f"/{name}" if name else "")


# the control plane --------------------------------------------------------------------------
class ControlPlane:
    """etcd and kube-apiserver as child processes, in ``workdir`` (logs there too)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pki = workdir / "pki"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.url = ""
        self.startup_seconds = 0.0
        self.refusals_expected = False
        self.test_mark = 0  # where the running test's part of the audit log begins
        self._etcd_ports = (0, 0)
        self.etcd: subprocess.Popen[bytes] | None = None
        self.vm_crds = False  # KubeVirt's VM, VMI and migration CRDs installed

    # lifecycle -----------------------------------------------------------------------------
    def start(self, timeout: float = 120) -> ControlPlane:
        apiserver, etcd = binaries()
        started = time.monotonic()
        self.pki.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki)
        for attempt in range(3):
            try:
                self._start_etcd(etcd, timeout)
                self._start_apiserver(apiserver, timeout)
                break
            except _PortTaken:
                self.stop()
                if attempt == 2:
                    raise
        self.startup_seconds = time.monotonic() - started
        self.write_kubeconfig(self.workdir / "kubeconfig")
        return self

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.procs.append(proc)
        return proc

    def _start_etcd(self, etcd: Path, timeout: float, *, again: bool = False) -> None:
        """etcd on two free ports with an empty data directory; ``again``: on the same
        ports with the data it had (a restart)."""
        if not again:
            self._etcd_ports = (free_port(), free_port())
            shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        client, peer = self._etcd_ports
        self.etcd_url = f"http://127.0.0.1:{client}"
        data = self.workdir / "etcd"
        proc = self._spawn("etcd", [
            str(etcd), "--name", "test", "--data-dir", str(data),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"test=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn", "--quota-backend-bytes", "1073741824",
        ])  # fmt: skip
        self.etcd = proc
        self._wait("etcd", proc, lambda: _http_ok(f"{self.etcd_url}/health"), timeout)

    def kill_etcd(self) -> None:
        """SIGKILL etcd, as a crash or a lost machine would stop it (the API server stays)."""
        proc = self.etcd
        assert proc is not None, "etcd is not running"
        proc.kill()
        proc.wait(10)
        self.procs.remove(proc)

    def restart_etcd(self, timeout: float = 60) -> None:
        """etcd again, after :meth:`kill_etcd`: the same ports and the same data."""
        _, etcd = binaries(build=False)
        self._start_etcd(etcd, timeout, again=True)

    def start_controller_manager(
        self, timeout: float = 60, controller: str = "garbage-collector-controller"
    ) -> subprocess.Popen[bytes]:
        """Upstream's kube-controller-manager running only one controller, as the admin:
        by default its garbage collector (what a cluster does to objects whose owners are
        gone); ``daemonset-controller``: DaemonSets' pods made and deleted as nodes' labels
        come to match their nodeSelector or stop matching it. Opt-in (a test that needs
        it calls this); stopped with the control plane, or by the test (it is a child
        process of its own). :class:`Unavailable` when it is not built
        (``hack/k8s/build.sh`` builds it by default)."""
        binary = controller_manager()
        name = "kube-controller-manager"
        if controller != "garbage-collector-controller":
            name += "-" + controller
        proc = self._spawn(name, [
            str(binary), f"--kubeconfig={self.workdir / 'kubeconfig'}",
            f"--controllers={controller}", "--leader-elect=false",
            "--secure-port=0", "--use-service-account-credentials=false", "--v=2",
        ])  # fmt: skip
        log = self.workdir / f"{name}.log"
        ready = {
            "garbage-collector-controller": "Proceeding to collect garbage",
            "daemonset-controller": "Caches are synced",
        }.get(controller, "Started controller")

        def synced() -> bool:
            text = log.read_text(errors="replace") if log.exists() else ""
            return ready in text

        self._wait(name, proc, synced, timeout)
        return proc

    def _start_apiserver(self, apiserver: Path, timeout: float) -> None:
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        p = self.pki
        proc = self._spawn("kube-apiserver", [
            str(apiserver),
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}", f"--cert-dir={self.workdir / 'certs'}",
            f"--etcd-servers={self.etcd_url}",
            f"--tls-cert-file={p / 'server.crt'}", f"--tls-private-key-file={p / 'server.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--endpoint-reconciler-type=none",
            # Webhooks behind a Service are called at the Service's endpoints (there is no
            # Service network here): the controller's layouts webhook is reached as shipped.
            "--enable-aggregator-routing=true",
            "--allow-privileged=true",  # as kubeadm sets it: the agent runs privileged
            "--profiling=false",
            f"--audit-policy-file={self._audit_policy()}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--v=1",
        ])  # fmt: skip
        self._wait("kube-apiserver", proc, lambda: self._status("/readyz") == 200, timeout)

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.jsonl"

    def _audit_policy(self) -> Path:
        path = self.workdir / "audit-policy.json"
        path.write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "None", "users": ["system:apiserver"]},
                {"level": "None", "nonResourceURLs": ["/readyz*", "/healthz*", "/livez*"]},
                # What a write to a Node asked for (which labels a patch sets).
                {
                    "level": "Request",
                    "verbs": ["patch", "update"],
                    "resources": [{"group": "", "resources": ["nodes"]}],
                },
                {"level": "Metadata"},
            ],
        }))  # fmt: skip
        return path

    def audit_mark(self) -> int:
        """Where the audit log ends now (see :meth:`audit`)."""
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def audit(self, since: int = 0, user: str | None = None) -> list[dict[str, Any]]:
        """The requests the server answered since ``since`` (:meth:`audit_mark`), as its own
        audit log records them (user, verb, object, response code), of ``user`` if given;
        a ``user`` ending in ``:`` matches every name that starts with it."""
        if not self.audit_log.exists():
            return []
        with self.audit_log.open("rb") as f:
            f.seek(since)
            lines = f.read().decode(errors="replace").splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        if user is None:
            return events

        def matches(name: str) -> bool:
            return name.startswith(user) if user.endswith(":") else name == user

        return [e for e in events if matches(e.get("user", {}).get("username", ""))]

    def _wait(self, name: str, proc: subprocess.Popen[bytes], ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                log = (self.workdir / f"{name}.log").read_text(errors="replace")
                if "address already in use" in log:
                    raise _PortTaken(name)
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{log[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} not ready after {timeout:.0f} s (log in {self.workdir})"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.procs.clear()

    # clients -----------------------------------------------------------------------------
    def ssl_context(self, identity: str | None = "admin") -> ssl.SSLContext:
        """TLS to the server, with the client certificate of ``identity`` (if not ``None``)."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        if identity is not None:
            context.load_cert_chain(
                str(self.pki / f"{identity}.crt"), str(self.pki / f"{identity}.key")
            )
        return context

    def _status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(
                self.url + path, timeout=5, context=self.ssl_context()
            ) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0

    def apiserver_ready(self) -> bool:
        """Whether the API server answers its own ``/readyz`` with 200 now."""
        return self._status("/readyz") == 200

    def endpoint(self, token: str | None = None) -> Any:
        from vgpu_state.kube.transport import Endpoint

        if token is None:
            return Endpoint(
                server=self.url,
                ca_file=str(self.pki / "ca.crt"),
                cert_file=str(self.pki / "admin.crt"),
                key_file=str(self.pki / "admin.key"),
            )
        return Endpoint(server=self.url, ca_file=str(self.pki / "ca.crt"), token=token)

    def api_client(self, token: str | None = None) -> Any:
        """The product's transport: the admin (``system:masters``), or ``token``'s bearer."""
        from vgpu_state.kube.transport import Transport

        return Transport(self.endpoint(token))

    def write_kubeconfig(
        self,
        path: Path,
        token: str | None = None,
        server: str | None = None,
        *,
        identity: str = "admin",
    ) -> Path:
        """A kubeconfig: ``token`` (an agent's), else the client certificate of ``identity``
        (``"admin"``, the test's own, or ``"user"``, a person's: :data:`USER`)."""
        user: dict[str, str] = (
            {"token": token}
            if token is not None
            else {
                "client-certificate": str(self.pki / f"{identity}.crt"),
                "client-key": str(self.pki / f"{identity}.key"),
            }
        )
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "vgpu-state-test",
                    "cluster": {
                        "server": server or self.url,
                        "certificate-authority": str(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [
                {
                    "name": "vgpu-state-test",
                    "context": {"cluster": "vgpu-state-test", "user": "user"},
                }
            ],
            "current-context": "vgpu-state-test",
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    def controller_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig of the cluster controller as its Deployment runs it: its
        ServiceAccount's token, bound to its pod (on ``control-node``)."""
        token = self.agent_token("control-node", service_account=CONTROLLER_SA)
        return self.write_kubeconfig(path, token=token)

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise Unavailable("kubectl is not on PATH")
        proc = subprocess.run(
            [kubectl, "--kubeconfig", str(self.workdir / "kubeconfig"), *args],
            input=stdin, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc.stdout

    # raw REST as the admin ------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        *,
        token: str | None = None,
    ) -> Any:
        """One request as the admin (or as the bearer of ``token``); the decoded answer, or
        ``None`` for 404 on GET/DELETE; :class:`ApiError` for any other refusal."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", content_type)
        req.add_header("Accept", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        context = self.ssl_context(None if token is not None else "admin")
        try:
            with urllib.request.urlopen(req, timeout=30, context=context) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            if e.code == 404 and method in ("GET", "DELETE"):
                return None
            raise ApiError(e.code, f"{method} {path}: {e.code} {text}") from None

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.request("GET", api_path(kind, name, namespace))
        return found

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        found = self.request("GET", api_path(kind, None, namespace))
        return list(found["items"])

    def all(self, kind: str) -> builtins.list[dict[str, Any]]:
        """Every object of ``kind``, in every namespace."""
        return self.list(kind)

    def write(
        self, kind: str, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Create the object, or merge ``body`` into it; a ``status`` goes through ``/status``."""
        body = json.loads(json.dumps(body))
        status = body.pop("status", None)
        for field in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
            body.get("metadata", {}).pop(field, None)
        path = api_path(kind, name, namespace)
        current = self.get(kind, name, namespace)
        if current is None:
            group_version, _, _ = kind.rpartition("/")
            obj = {"apiVersion": group_version, "kind": _KINDS[kind.rsplit("/", 1)[-1]], **body}
            obj.setdefault("metadata", {})["name"] = name
            created: dict[str, Any] = self.request("POST", api_path(kind, None, namespace), obj)
            result = created
        elif body:
            result = self.request("PATCH", path, body, "application/merge-patch+json")
        else:
            result = current
        if status is not None:
            result = self.request(
                "PATCH", path + "/status", {"status": status}, "application/merge-patch+json"
            )
        return result

    def put(
        self, kind: str, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Store ``body`` as the whole object, as an admin would (create, or replace: what it
        does not name is gone); its ``status`` through ``/status``."""
        current = self.get(kind, name, namespace)
        if current is None:
            return self.write(kind, name, body, namespace)
        obj = json.loads(json.dumps(body))
        status = obj.pop("status", None)
        group_version, _, _ = kind.rpartition("/")
        obj.setdefault("apiVersion", group_version)
        obj.setdefault("kind", _KINDS[kind.rsplit("/", 1)[-1]])
        meta = obj.setdefault("metadata", {})
        for field in ("uid", "creationTimestamp", "managedFields", "generation"):
            meta.pop(field, None)
        meta.update(name=name, resourceVersion=current["metadata"]["resourceVersion"])
        if namespace:
            meta["namespace"] = namespace
        path = api_path(kind, name, namespace)
        result: dict[str, Any] = self.request("PUT", path, obj)
        if status is not None:
            result["status"] = status
            result = self.request("PUT", path + "/status", result)
        return result

    @property
    def counts(self) -> Counter[str]:
        """The product's requests since the test began (everyone's but the test's own admin),
        from the audit log: ``"GET"``, ``"PATCH"``, … for answered ones, the status code
        (``"409"``, ``"422"``) for refused ones."""
        counts: Counter[str] = Counter()
        for event in self.audit(self.test_mark):
            if event["user"]["username"] == ADMIN:
                continue
            code = int(event.get("responseStatus", {}).get("code", 0))
            if 200 <= code < 300:
                counts[_METHODS.get(event["verb"], event["verb"].upper())] += 1
            else:
                counts[str(code)] += 1
        return counts

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        self.request("DELETE", api_path(kind, name, namespace) + "?gracePeriodSeconds=0")

    # the product's manifests -------------------------------------------------------------------
    def install(self) -> None:
        """The rendered ``deploy/`` with its DRA component, and the KubeVirt CRD."""
        crd = self.workdir / "kubevirt-crd.json"
        crd.write_text(json.dumps(kubevirt_crd()))
        self.kubectl("apply", "--server-side", "-f", str(crd))
        # deploy/ with its DRA component, as docs/dra.md has users combine them.
        overlay = self.workdir / "deploy"
        overlay.mkdir(exist_ok=True)
        deploy = os.path.relpath(REPO / "deploy", overlay)
        (overlay / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources: [{deploy}]\ncomponents: [{deploy}/components/dra]\n"
        )
        rendered = self.kubectl("kustomize", str(overlay))
        self.kubectl("apply", "--server-side", "-f", "-", stdin=rendered)
        self.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            "crd/kubevirts.kubevirt.io", "crd/vgpunodestates.vgpu-state.io",
        )  # fmt: skip
        # The KubeVirt CR's namespace, and the VMs' (their pods and ResourceClaims).
        for namespace in ("kubevirt", "vms"):
            self.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        # Established is not served: until the custom resources' storage is up, a list of
        # them is answered 429 ("storage is (re)initializing"). Wait for it here, so that
        # the first test's first read does not meet it.
        for kind in ("vgpu-state.io/v1alpha1/vgpunodestates", "kubevirt.io/v1/kubevirts"):
            deadline = time.monotonic() + 60
            while self._status(api_path(kind) + "?limit=1") == 429:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind}: storage not ready after 60 s")
                time.sleep(0.2)

    def install_kubevirt_vms(self) -> None:
        """KubeVirt's VM, VMI and migration CRDs (:func:`kubevirt_vm_crds`), once; only the
        tests that need them install them (the base harness starts without)."""
        if self.vm_crds:
            return
        crds = kubevirt_vm_crds()
        path = self.workdir / "kubevirt-vm-crds.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}))
        self.kubectl("apply", "--server-side", "-f", str(path))
        self.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            *(f"crd/{c['metadata']['name']}" for c in crds),
        )  # fmt: skip
        for _, plural, _ in VM_KINDS:
            deadline = time.monotonic() + 60
            while self._status(api_path(f"kubevirt.io/v1/{plural}") + "?limit=1") == 429:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{plural}: storage not ready after 60 s")
                time.sleep(0.2)
        self.vm_crds = True

    # identities ---------------------------------------------------------------------------------
    def ensure_node(self, node: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        return self.write("v1/nodes", node, {"metadata": {"labels": labels or {}}})

    def agent_token(
        self,
        node: str,
        namespace: str = NAMESPACE,
        service_account: str = AGENT_SA,
        seconds: int = 3600,
    ) -> str:
        """A token of the agent's ServiceAccount bound to a Pod on ``node`` (created if needed),
        as a DaemonSet's pod gets it: the server puts the node's name in the token."""
        if self.get("v1/nodes", node) is None:
            self.ensure_node(node)
        pod_name = f"{service_account}-{node}"[:63].rstrip("-.")
        pod = self.get("v1/pods", pod_name, namespace)
        if pod is None:
            pod = self.request(
                "POST",
                api_path("v1/pods", None, namespace),
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod_name,
                        "labels": {"app.kubernetes.io/name": "vgpu-state"},
                    },
                    "spec": {
                        "nodeName": node,
                        "serviceAccountName": service_account,
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "agent", "image": "vgpu-state:test"}],
                    },
                },
            )
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod["metadata"]["uid"],
                },
            },
        }
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            request,
        )
        return str(answer["status"]["token"])

    def whoami(self, token: str) -> dict[str, Any]:
        """What the server makes of ``token`` (a SelfSubjectReview as its bearer)."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        answer = self.request(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review, token=token
        )
        return dict(answer["status"]["userInfo"])

    # between tests ------------------------------------------------------------------------------
    def reset(self) -> None:
        """Delete what tests create (nodes, node states, KubeVirt CRs, leases, pods, events)."""
        kinds: tuple[tuple[str, list[str | None]], ...] = (
            ("v1/nodes", [None]),
            ("vgpu-state.io/v1alpha1/vgpunodestates", [None]),
            ("kubevirt.io/v1/kubevirts", ["kubevirt", "other"]),
            ("coordination.k8s.io/v1/leases", [NAMESPACE]),
            ("v1/pods", [NAMESPACE]),
            ("v1/events", [NAMESPACE, "default"]),
            ("resource.k8s.io/v1/resourceslices", [None]),
            ("resource.k8s.io/v1/resourceclaims", ["default", "vms"]),
            ("policy/v1/poddisruptionbudgets", ["vms"]),
            ("v1/events", ["vms"]),
            *(
                (f"kubevirt.io/v1/{plural}", list[str | None](["vms"]))
                for _, plural, _ in (VM_KINDS if self.vm_crds else VM_KINDS[:0])
            ),
        )
        for kind, namespaces in kinds:
            for namespace in namespaces:
                with contextlib.suppress(ApiError):
                    self.request(
                        "DELETE", api_path(kind, None, namespace) + "?gracePeriodSeconds=0"
                    )


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _PortTaken(RuntimeError):
    pass


_METHODS = {
    "get": "GET", "list": "GET", "watch": "GET", "create": "POST",
    "update": "PUT", "patch": "PATCH", "delete": "DELETE", "deletecollection": "DELETE",
}  # fmt: skip
_KINDS = {
    "nodes": "Node",
    "pods": "Pod",
    "events": "Event",
    "leases": "Lease",
    "kubevirts": "KubeVirt",
    "vgpunodestates": "VGPUNodeState",
    "configmaps": "ConfigMap",
    "namespaces": "Namespace",
    "resourceslices": "ResourceSlice",
    "resourceclaims": "ResourceClaim",
    "deviceclasses": "DeviceClass",
    "poddisruptionbudgets": "PodDisruptionBudget",
    **{plural: kind for kind, plural, _ in VM_KINDS},
}


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _documents_of_kind(text: str, kind: str) -> str:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe")
    docs = [d for d in yaml.load_all(text) if d and d.get("kind") == kind]
    return "\n".join(json.dumps(d) for d in docs)


@contextlib.contextmanager
def running(workdir: Path | None = None) -> Iterator[ControlPlane]:
    """A started, installed control plane; stopped (and its temp dir removed) on exit."""
    owned = workdir is None
    directory = Path(tempfile.mkdtemp(prefix="vgpu-k8s-")) if workdir is None else workdir
    plane = ControlPlane(directory)
    try:
        plane.start()
        plane.install()
        yield plane
    finally:
        plane.stop()
        if owned:
            shutil.rmtree(directory, ignore_errors=True)


def attach(workdir: Path) -> ControlPlane:
    """The control plane running from ``workdir`` (``make cluster``'s ``.cluster``)."""
    plane = ControlPlane(workdir)
    config = json.loads((workdir / "kubeconfig").read_text())
    plane.url = config["clusters"][0]["cluster"]["server"]
    return plane


def agent_kubeconfig_main(directory: Path, node: str) -> None:
    """``python -m tests.realcluster agent-kubeconfig DIR NODE``: a kubeconfig with the
    agent's token for NODE (the Node and a Pod bound to it are created if missing)."""
    plane = attach(directory)
    path = directory / f"agent-{node}.kubeconfig"
    plane.write_kubeconfig(path, token=plane.agent_token(node))
    print(path)


def main() -> None:
    """``python -m tests.realcluster [DIR]``: run the control plane until Ctrl-C."""
    if len(sys.argv) == 4 and sys.argv[1] == "agent-kubeconfig":
        agent_kubeconfig_main(Path(sys.argv[2]).resolve(), sys.argv[3])
        return
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else ".cluster").resolve()
    directory.mkdir(parents=True, exist_ok=True)
    stop = False

    def interrupted(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)  # also when started in the background
    try:
        with running(directory) as plane:
            print(f"kube-apiserver {plane.url} ready in {plane.startup_seconds:.1f} s")
            print(f"admin kubeconfig: {directory / 'kubeconfig'}")
            print(f"  export KUBECONFIG={directory / 'kubeconfig'}")
            print("deploy/ and the KubeVirt CRD are installed. Ctrl-C stops it.", flush=True)
            while not stop and all(p.poll() is None for p in plane.procs):
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
