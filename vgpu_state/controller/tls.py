"""The webhook's TLS: a private CA and a serving certificate, kept in one Secret.

Every controller replica serves the layouts webhook (the Service routes to any of
them), so all share one key pair: the first replica to start creates the Secret
``vgpu-state-controller-tls`` (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``); the
others read it (a lost create race is a read). The serving certificate is renewed,
by whichever replica sees it first, when less than :data:`RENEW_BEFORE` of it is
left; the CA (ten years) signs every renewal, so the ``caBundle`` the API server
trusts stays the same. :func:`sync_ca_bundle` keeps the ValidatingWebhookConfiguration's
``caBundle`` equal to the Secret's CA.

Pure parts (:func:`issue`, :func:`renewed`, :func:`needs_renewal`) take the time as an
argument; :func:`ensure_secret` and :func:`sync_ca_bundle` do the API calls.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import logging
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vgpu_state.kube.api import JsonObject, KubeApi, retry_on_conflict
from vgpu_state.kube.errors import ClusterError, NotFoundError
from vgpu_state.kube.guardedpatch import guarded_patch, pointer, send

log = logging.getLogger(__name__)

CA_LIFETIME = dt.timedelta(days=3650)
CERT_LIFETIME = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)
"""A serving certificate with less than this left is renewed."""
CLOCK_SKEW = dt.timedelta(minutes=5)
"""Certificates start this long before "now": a peer whose clock is behind accepts them."""


@dataclass(frozen=True)
class Material:
    """The CA and the serving certificate with its key, PEM-encoded."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    def secret_data(self) -> dict[str, str]:
        return {
            name: base64.b64encode(value).decode()
            for name, value in (
                ("ca.crt", self.ca_cert),
                ("ca.key", self.ca_key),
                ("tls.crt", self.cert),
                ("tls.key", self.key),
            )
        }

    @classmethod
    def from_secret(cls, secret: JsonObject) -> Material | None:
        """The material of a Secret, or ``None`` when a part is missing or unreadable."""
        data = secret.get("data") or {}
        try:
            keys = ("ca.crt", "ca.key", "tls.crt", "tls.key")
            parts = [base64.b64decode(str(data[k])) for k in keys]
            material = cls(*parts)
            x509.load_pem_x509_certificate(material.ca_cert)
            x509.load_pem_x509_certificate(material.cert)
            serialization.load_pem_private_key(material.key, password=None)
            serialization.load_pem_private_key(material.ca_key, password=None)
        except (KeyError, ValueError, TypeError):
            return None
        return material


def dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use for the Service (it verifies ``service.namespace.svc``)."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _serving(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    names: list[str],
    now: dt.datetime,
) -> tuple[bytes, bytes]:
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[-2])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CERT_LIFETIME)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue(service: str, namespace: str, now: dt.datetime) -> Material:
    """A new CA and a serving certificate for the Service's DNS names."""
    ca_key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service} webhook CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert, key = _serving(ca_cert, ca_key, dns_names(service, namespace), now)
    return Material(ca_cert.public_bytes(serialization.Encoding.PEM), _pem_key(ca_key), cert, key)


def renewed(material: Material, service: str, namespace: str, now: dt.datetime) -> Material:
    """A new serving certificate signed by the same CA (the ``caBundle`` stays valid)."""
    ca_cert = x509.load_pem_x509_certificate(material.ca_cert)
    ca_key = serialization.load_pem_private_key(material.ca_key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        return issue(service, namespace, now)
    cert, key = _serving(ca_cert, ca_key, dns_names(service, namespace), now)
    return Material(material.ca_cert, material.ca_key, cert, key)


def needs_renewal(material: Material, service: str, namespace: str, now: dt.datetime) -> str | None:
    """Why the material must be replaced (``None``: it serves as it is)."""
    ca = x509.load_pem_x509_certificate(material.ca_cert)
    cert = x509.load_pem_x509_certificate(material.cert)
    if ca.not_valid_after_utc - now < RENEW_BEFORE:
        return f"the CA expires {ca.not_valid_after_utc:%Y-%m-%d}"
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return f"the serving certificate expires {cert.not_valid_after_utc:%Y-%m-%d}"
    if cert.issuer != ca.subject:
        return "the serving certificate is not signed by the Secret's CA"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "the serving certificate names no DNS names"
    wanted = set(dns_names(service, namespace))
    if not wanted <= set(sans.get_values_for_type(x509.DNSName)):
        return f"the serving certificate does not name {service}.{namespace}.svc"
    return None


def _ca_expiring(material: Material, now: dt.datetime) -> bool:
    ca = x509.load_pem_x509_certificate(material.ca_cert)
    return ca.not_valid_after_utc - now < RENEW_BEFORE


def secret_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/secrets"
    return f"{base}/{name}" if name else base


def ensure_secret(
    api: KubeApi, namespace: str, name: str, service: str, now: dt.datetime
) -> Material:
    """The Secret's material, created or renewed when needed (safe from every replica)."""

    def attempt() -> Material:
        try:
            secret = api.get(secret_path(namespace, name))
        except NotFoundError:
            material = issue(service, namespace, now)
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": name,
                    "labels": {"app.kubernetes.io/name": "vgpu-state"},
                },
                "type": "Opaque",
                "data": material.secret_data(),
            }
            # A conflict: another replica created it first; the next attempt reads theirs.
            api.create(secret_path(namespace), body)
            log.info("Secret %s/%s: created a CA and a serving certificate", namespace, name)
            return material
        found = Material.from_secret(secret)
        why = (
            "it holds no readable CA and certificate"
            if found is None
            else needs_renewal(found, service, namespace, now)
        )
        if why is None and found is not None:
            return found
        if found is None or _ca_expiring(found, now):
            fresh = issue(service, namespace, now)
        else:
            fresh = renewed(found, service, namespace, now)
        secret = dict(secret)
        secret["data"] = fresh.secret_data()
        # A conflict: another replica renewed it first; the next attempt reads theirs.
        api.replace(secret_path(namespace, name), secret)
        log.info("Secret %s/%s: renewed (%s)", namespace, name, why)
        return fresh

    return retry_on_conflict(
        attempt, 5, ClusterError(f"Secret {namespace}/{name}: changed by others on every attempt")
    )


def webhook_path(name: str) -> str:
    return f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}"


def sync_ca_bundle(api: KubeApi, config: str, service: str, namespace: str, ca: bytes) -> int:
    """Set ``caBundle`` of every webhook in ``config`` that calls the Service; returns how many
    changed. One JSON Patch guarded by ``test`` ops on the names (and on a ``caBundle`` it
    replaces), so a reordered object is never half written; checked before it is sent.
    Adding a ``caBundle`` needs no ``resourceVersion`` guard: every replica writes the CA
    of the one Secret there, and the names' tests keep it on the right webhooks."""
    current = api.get(webhook_path(config))
    wanted = copy.deepcopy(current)
    bundle = base64.b64encode(ca).decode()
    changed: list[int] = []
    for i, hook in enumerate(wanted.get("webhooks") or []):
        client = hook.get("clientConfig") or {}
        svc = client.get("service") or {}
        if svc.get("name") != service or svc.get("namespace") != namespace:
            continue
        if client.get("caBundle") == bundle:
            continue
        hook["clientConfig"] = {**client, "caBundle": bundle}
        changed.append(i)
    if changed:
        guards = [pointer("webhooks", i, "name") for i in changed]
        ops = guarded_patch(current, wanted, guards=guards, guard_adds=False)
        what = f"ValidatingWebhookConfiguration {config}"
        send(api, webhook_path(config), current, ops, wanted, what)
        log.info("ValidatingWebhookConfiguration %s: caBundle set", config)
    return len(changed)
