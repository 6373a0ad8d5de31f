"""The validating admission webhook for the layouts ConfigMap.

The API server sends an ``AdmissionReview`` for every change of the layouts ConfigMap
(the ValidatingWebhookConfiguration ``vgpu-state-layouts`` of deploy/ selects only that
object); :func:`review` answers it with the result of the same check ``vgpu-state
validate`` runs, so ``kubectl apply``, Argo CD and Flux show the same
``config.yaml:LINE:COLUMN: message`` lines at sync time. Warnings (types the catalog
cannot vouch for) come back as admission warnings, which kubectl prints and allows.

:class:`WebhookServer` serves it over HTTPS on every controller replica; the serving
certificate comes from :mod:`vgpu_state.controller.tls` and is swapped in place when
it is renewed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from vgpu_state.background import BackgroundLoop
from vgpu_state.catalog import Catalog
from vgpu_state.config import load_text
from vgpu_state.controller import tls
from vgpu_state.controller.isolated import IsolatedCheck
from vgpu_state.controller.metrics import Readiness, always_ready
from vgpu_state.controller.tls import Material
from vgpu_state.kube.api import KubeApi
from vgpu_state.kube.errors import ClusterError, NotFoundError
from vgpu_state.model import bounded
from vgpu_state.model.errors import ConfigError, TransientError

log = logging.getLogger(__name__)

LAYOUTS_KEY = "config.yaml"
"""The ConfigMap key the agents read (deploy/daemonset.yaml mounts it as a file)."""
REVIEW_PATH = "/validate-layouts"
MAX_BODY = 4 * 1024 * 1024
"""The largest request read: an AdmissionReview of an UPDATE carries the new and the old
ConfigMap, each at most the 1.5 MiB etcd stores, in JSON with its escapes. A larger body
is answered 413 before it is read (the API server sends none: only another client can)."""
MAX_LAYOUTS_BYTES = 1024 * 1024
"""The largest layouts text judged: the API server refuses a ConfigMap whose data is
larger before it asks the webhook, so a larger one is refused unread."""
MAX_VALUES = 100_000
"""JSON values a review may hold: a ConfigMap's review is mostly one string (its data) and
a few hundred values of metadata; 4 MiB of ``[],`` would be 1.4 million lists (100 MB)."""
READERS = 4
"""Request bodies read and parsed at once; a request that finds none free within
:data:`READ_WAIT` seconds is answered 503 (busy)."""
READ_WAIT = 1.0
MAX_MESSAGES = 20
"""Refusal lines shown; the rest are counted (``vgpu-state validate`` lists them all)."""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()


Check = Callable[[str, Catalog, str], tuple[bool, str, tuple[str, ...]]]
"""How a layouts text is judged: :func:`check_text` itself, or it in a child process."""


def check_text(text: str, catalog: Catalog, key: str) -> tuple[bool, str, tuple[str, ...]]:
    """What ``vgpu-state validate -f KEY`` says of ``text``: (allowed, message, warnings)."""
    try:
        document = load_text(text, key, catalog=catalog)
    except ConfigError as exc:
        lines = [str(issue) for issue in exc.issues]
        shown = lines[:MAX_MESSAGES]
        if len(lines) > len(shown):
            shown.append(f"... and {len(lines) - len(shown)} more (vgpu-state validate lists all)")
        return False, "invalid vGPU layouts:\n" + "\n".join(shown), ()
    warnings = tuple(
        f"{w.file}:{w.line}:{w.column}: warning: {w.message}" for w in document.warnings
    )
    return True, "", warnings


def check_configmap(
    obj: Mapping[str, Any], catalog: Catalog, key: str = LAYOUTS_KEY, check: Check = check_text
) -> Verdict:
    """What ``vgpu-state validate -f KEY`` says of the ConfigMap's ``key`` (judged by
    ``check``)."""
    data = obj.get("data")
    if not isinstance(data, Mapping) or key not in data:
        binary = obj.get("binaryData")
        where = (
            " (it is in binaryData; the agents read data)"
            if isinstance(binary, Mapping) and key in binary
            else ""
        )
        return Verdict(
            False, f"the layouts ConfigMap has no data key {key!r}{where}: the agents read it"
        )
    text = data[key]
    if not isinstance(text, str):
        return Verdict(False, f"data key {key!r} is not text")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_LAYOUTS_BYTES:
        return Verdict(
            False,
            f"{key}: {size} bytes, more than the limit of {MAX_LAYOUTS_BYTES} bytes "
            "(the most a ConfigMap holds)",
        )
    allowed, message, warnings = check(text, catalog, key)
    return Verdict(allowed, message, warnings)


def review(
    body: Any, catalog: Catalog, key: str = LAYOUTS_KEY, check: Check = check_text
) -> dict[str, Any]:
    """The ``AdmissionReview`` answer to ``body`` (an ``AdmissionReview`` request); the
    layouts are judged by ``check``."""
    request = body.get("request") if isinstance(body, Mapping) else None
    if not isinstance(request, Mapping):
        raise ValueError("not an AdmissionReview request (no .request)")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ValueError("AdmissionReview request without a uid")
    obj = request.get("object")
    if request.get("operation") == "DELETE" or not isinstance(obj, Mapping):
        verdict = Verdict(True)
    else:
        verdict = check_configmap(obj, catalog, key, check)
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 422, "reason": "Invalid", "message": verdict.message}
    if verdict.warnings:
        # kubectl prints each as "Warning: ..." and applies the change.
        response["warnings"] = list(verdict.warnings)
    return {
        "apiVersion": str(body.get("apiVersion") or "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds a connection may stay silent (handshake included)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook %s: " + format, self.client_address[0], *args)

    def _send(self, code: int, payload: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif self.path == "/readyz":
            # The Deployment's readiness probe: the controller's, as on its metrics port.
            ready = self.server.readiness()
            self._send(200 if ready.ok else 503, (ready.reason + "\n").encode(), "text/plain")
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        try:
            self._review()
        except Exception:  # one bad request never ends the server: a 500 for it alone
            log.exception("layouts webhook: a review failed")
            self.close_connection = True
            with contextlib.suppress(Exception):
                self._send(500, b"the review failed; see the controller's log\n", "text/plain")

    def _review(self) -> None:
        if self.path.split("?", 1)[0] != REVIEW_PATH:
            self._send(404, b"not found\n", "text/plain")
            return
        try:
            length = int(self.headers.get("Content-Length") or "-1")
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            self._send(413 if length > MAX_BODY else 411, b"bad length\n", "text/plain")
            return
        if not self.server.readers.acquire(timeout=READ_WAIT):
            self.close_connection = True
            self._send(503, b"busy: too many reviews at once\n", "text/plain")
            return
        try:
            raw = self.rfile.read(length)
            body = bounded.loads(raw, "the AdmissionReview", max_values=MAX_VALUES)
            del raw
        except (ValueError, UnicodeDecodeError) as e:
            self._send(400, f"bad AdmissionReview: {e}\n".encode(), "text/plain")
            return
        finally:
            self.server.readers.release()
        try:
            answer = review(body, self.server.catalog, self.server.key, self.server.check)
        except ValueError as e:
            self._send(400, f"bad AdmissionReview: {e}\n".encode(), "text/plain")
            return
        allowed = answer["response"]["allowed"]
        if not allowed:
            message = answer["response"]["status"]["message"]
            log.info("layouts ConfigMap change refused: %s", message)
        self._send(200, json.dumps(answer).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    key: str
    catalog: Catalog
    check: Check
    readers: threading.BoundedSemaphore
    context: ssl.SSLContext
    readiness: Readiness

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A failed handshake or a dropped connection: the peer's problem, not a crash.
        log.info("webhook connection from %s failed", client_address[0], exc_info=True)

    def get_request(self) -> tuple[Any, Any]:
        # The TLS handshake runs on the connection's own thread (first read), never in
        # the accept loop: one slow client cannot stall the others.
        sock, address = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), (
            address
        )


class WebhookServer:
    """HTTPS on ``host:port``; :meth:`load` swaps the certificate without a restart.

    Each review's layouts are checked in a child process with a deadline
    (:class:`~vgpu_state.controller.isolated.IsolatedCheck`); ``check`` replaces that.
    """

    def __init__(
        self,
        host: str,
        port: int,
        catalog: Catalog,
        key: str = LAYOUTS_KEY,
        readiness: Readiness = always_ready,
        check: Check | None = None,
    ) -> None:
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._server = _Server((host, port), _Handler, bind_and_activate=True)
        self._server.key = key
        self._server.catalog = catalog
        self._server.readers = threading.BoundedSemaphore(READERS)
        self._isolated: IsolatedCheck | None = None
        if check is None:
            self._isolated = check = IsolatedCheck(check_text, preload=(__name__,))
        self._server.check = check
        self._server.context = self._context
        self._server.readiness = readiness
        self._thread: threading.Thread | None = None
        self._loaded: Material | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def load(self, material: Material) -> bool:
        """Serve ``material``'s certificate from the next connection on; ``True`` if new."""
        if material == self._loaded:
            return False
        # The ssl module reads key pairs from files only: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="vgpu-state-tls-") as tmp:
            cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert.write_bytes(material.cert)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(material.key)
            self._context.load_cert_chain(cert, key)
        self._loaded = material
        return True

    def load_files(self, cert: Path, key: Path) -> None:
        """Serve a key pair another issuer keeps in files (cert-manager's mounted Secret)."""
        self._context.load_cert_chain(cert, key)

    def start(self) -> None:
        if self._isolated is not None:
            self._isolated.start()
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="vgpu-state-webhook", daemon=True
        )
        self._thread.start()
        log.info("layouts webhook serving on port %d (%s)", self.port, REVIEW_PATH)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


@dataclass(frozen=True)
class WebhookSettings:
    port: int
    namespace: str
    service: str = "vgpu-state-controller"
    secret: str = "vgpu-state-controller-tls"
    configuration: str = "vgpu-state-layouts"
    """The ValidatingWebhookConfiguration whose ``caBundle`` is kept in step."""
    cert_dir: Path | None = None
    """A key pair another issuer keeps (cert-manager): served as it is, nothing written."""
    key: str = LAYOUTS_KEY
    check_every: float = 3600.0
    """Seconds between checks of the Secret (renewal) and of the ``caBundle``."""
    host: str = "0.0.0.0"


RETRY_CHECK = 10.0
"""Seconds before a check that failed (the API server, the Secret) is made again."""


class WebhookKeeper(BackgroundLoop):
    """Serves the webhook and keeps its certificate and ``caBundle`` current: :meth:`check`
    now and every ``check_every`` seconds (every 10 s until it works), on a daemon thread
    from :meth:`start` to :meth:`stop`."""

    def __init__(
        self,
        api: KubeApi,
        settings: WebhookSettings,
        catalog: Catalog,
        readiness: Readiness = always_ready,
    ) -> None:
        super().__init__("vgpu-state-webhook-tls", first=0, after_error=RETRY_CHECK)
        self.api = api
        self.settings = settings
        self.server = WebhookServer(
            settings.host, settings.port, catalog, settings.key, readiness
        )
        self._files: tuple[float, float] | None = None
        self.started = False

    def check(self, now: dt.datetime | None = None) -> None:
        """One round: load the current key pair; keep ``caBundle`` equal to the CA."""
        s = self.settings
        if s.cert_dir is not None:
            cert, key = s.cert_dir / "tls.crt", s.cert_dir / "tls.key"
            stamp = (cert.stat().st_mtime, key.stat().st_mtime)
            if stamp != self._files:
                self.server.load_files(cert, key)
                self._files = stamp
                log.info("webhook certificate loaded from %s", s.cert_dir)
        else:
            when = now or dt.datetime.now(dt.UTC)
            material = tls.ensure_secret(self.api, s.namespace, s.secret, s.service, when)
            if self.server.load(material):
                log.info("webhook certificate loaded from Secret %s/%s", s.namespace, s.secret)
            try:
                tls.sync_ca_bundle(
                    self.api, s.configuration, s.service, s.namespace, material.ca_cert
                )
            except NotFoundError:
                log.warning(
                    "ValidatingWebhookConfiguration %s not found: layouts are not checked at "
                    "admission (the agents still refuse an invalid one)",
                    s.configuration,
                )
        if not self.started:
            self.server.start()
            self.started = True

    def step(self) -> float:
        try:
            self.check()
        except (ClusterError, TransientError, OSError, ssl.SSLError) as e:
            log.warning("layouts webhook: %s (retried in %g s)", e, RETRY_CHECK)
            return RETRY_CHECK
        return self.settings.check_every

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop checking, then stop serving."""
        super().stop(timeout)
        if self.started:
            self.server.stop()
            self.started = False
