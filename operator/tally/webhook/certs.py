"""Certificates for tally's admission webhook: made, read back, and judged for renewal.

The API server calls webhooks only over TLS and checks the serving certificate against the
``caBundle`` of the webhook configuration, so tally needs a CA and a serving certificate whose
SANs name the address the API server dials (``127.0.0.1`` locally, ``<svc>.<ns>.svc`` in a
cluster). Kopf can generate one itself, but through ``oscrypto``, which fails with OpenSSL
≥ 3.0.10; so tally makes its own with ``cryptography``.

This module is pure: no I/O, no clock of its own (``now`` is passed in), no Kubernetes. It owns

* :class:`Material`, what tally keeps (in a Secret, or in memory): the CAs the API server is to
  trust, newest first (the first one signs), that CA's key, and the serving pair; and its wire
  form, the data keys of a ``kubernetes.io/tls`` Secret (``ca.crt``, ``ca.key``, ``tls.crt``,
  ``tls.key``: cert-manager's names, plus ``ca.key``, which cert-manager never writes);
* :func:`plan`, the renewal decision: from what is stored and the time, what should be stored;
* :func:`problems`, the same judgement for material tally may not change (mounted files).

**Renewal.** A certificate is renewed once less than ``renew_fraction`` of its configured
validity is left (a third, like cert-manager's default ``renewBefore``), so a renewal that
fails has two thirds of a validity's time to be retried before anything breaks.

**CA rotation without a gap.** The API server trusts what the caBundle names, and learns of a
new bundle a moment after tally writes it (through its informer; longer with several API
servers). So a CA due for renewal is replaced in two steps: the new CA joins the bundle beside
the old one while the serving certificate stays signed by the old one, and only once the new
CA is ``ca_overlap`` old is the serving certificate re-issued by it; the old CA leaves the
bundle when nothing served chains to it any more. The CA outlives many serving certificates
(5 years against 1 by default), so this happens rarely. A serving certificate that is not
usable (expired, missing a name tally is reached by, signed by no CA in the bundle) is
replaced at once, whatever the overlap: there is nothing left to protect.

Left out: revocation (the API server checks no CRL for webhooks), client identities (mutual TLS
is the server's SSL context, :mod:`tally.webhook.tls`), and RSA for what tally makes: P-256
keys are accepted everywhere and take about a millisecond to make, so renewing inside the event
loop blocks nothing (a stored RSA or Ed25519 CA key is used as found).
"""

from __future__ import annotations

import datetime
import ipaddress
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    PrivateKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LEAF_VALIDITY: Final = datetime.timedelta(days=365)
"""Default validity of a serving certificate (``TALLY_WEBHOOK_CERT_VALIDITY``)."""
CA_VALIDITY: Final = datetime.timedelta(days=5 * 365)
"""Default validity of tally's CA (``TALLY_WEBHOOK_CA_VALIDITY``): several serving
certificates' worth, so that the caBundle rarely changes."""
RENEW_FRACTION: Final = 1 / 3
"""Renew once less than this share of the configured validity is left."""
CA_OVERLAP: Final = datetime.timedelta(hours=1)
"""How long a new CA is in the caBundle before the serving certificate moves to it. API servers
pick a changed configuration up within a second; an hour is room for a slow one, and costs
nothing, since the old serving certificate has months left when this happens."""
CLOCK_SKEW: Final = datetime.timedelta(minutes=5)
"""Backdating, so that an API server whose clock is a little behind accepts a fresh cert."""

CA_CRT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
TLS_CRT: Final = "tls.crt"
TLS_KEY: Final = "tls.key"

_ISSUER_KEY_TYPES: Final = typing.get_args(CertificateIssuerPrivateKeyTypes)


class MaterialError(ValueError):
    """Stored certificate material that cannot be used as it is; the message says why."""


@dataclass(frozen=True)
class Policy:
    """How long what tally makes is valid, and when it is renewed."""

    validity: datetime.timedelta = LEAF_VALIDITY
    """Of a serving certificate (capped at its CA's end)."""
    ca_validity: datetime.timedelta = CA_VALIDITY
    """Of a CA; at least ``validity``."""
    renew_fraction: float = RENEW_FRACTION
    """Renew when less than this share of the validity is left, 0 < f < 1."""
    ca_overlap: datetime.timedelta = CA_OVERLAP
    """How long a new CA is trusted before it signs the served certificate (less than the
    ``renew_fraction`` of ``ca_validity``: the old CA must outlive the overlap)."""

    def renew_at(self, cert: x509.Certificate) -> datetime.datetime:
        """When a serving certificate is due for renewal."""
        return cert.not_valid_after_utc - self.validity * self.renew_fraction

    def ca_renew_at(self, ca: x509.Certificate) -> datetime.datetime:
        """When a CA is due for renewal."""
        return ca.not_valid_after_utc - self.ca_validity * self.renew_fraction


@dataclass(frozen=True)
class Material:
    """A CA bundle, the signing CA's key, and the serving pair.

    Invariants (checked by :func:`from_secret_data`, kept by :func:`plan`): ``cas`` is not
    empty and holds CA certificates; ``ca_key``, when present, belongs to ``cas[0]``; ``key``
    belongs to ``cert``.
    """

    cas: tuple[x509.Certificate, ...]
    """What the webhook configuration's caBundle names, newest first. ``cas[0]`` signs new
    serving certificates; the others stay while the serving certificate chains to them."""
    ca_key: CertificateIssuerPrivateKeyTypes | None
    """``cas[0]``'s key; None when tally has not got it (a certificate made by someone else)."""
    cert: x509.Certificate
    """The serving certificate."""
    key: PrivateKeyTypes
    """Its key."""

    @property
    def ca_bundle(self) -> bytes:
        """The caBundle: every CA, PEM, newest first."""
        return b"".join(ca.public_bytes(serialization.Encoding.PEM) for ca in self.cas)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _pem_key(self.key)

    def secret_data(self) -> dict[str, bytes]:
        """The data of a ``kubernetes.io/tls`` Secret holding this material (not base64'd)."""
        data = {CA_CRT: self.ca_bundle, TLS_CRT: self.cert_pem, TLS_KEY: self.key_pem}
        if self.ca_key is not None:
            data[CA_KEY] = _pem_key(self.ca_key)
        return data

    def issuer(self) -> x509.Certificate | None:
        """The CA in the bundle that signed the serving certificate."""
        return next((ca for ca in self.cas if issued_by(self.cert, ca)), None)


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` decided."""

    material: Material
    changes: tuple[str, ...]
    """Why ``material`` differs from what was stored, for the log; empty: store nothing."""
    waiting: str = ""
    """A renewal that is due but deliberately postponed (the new CA's overlap), for the log."""


# -- making


def new_ca(
    now: datetime.datetime, validity: datetime.timedelta, *, common_name: str = "tally-webhook-ca"
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA, named ``<common_name>@<unix time>`` (as k3s and kubeadm name theirs)
    so that two generations in one bundle can be told apart."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name}@{int(now.timestamp())}")]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def new_serving_certificate(
    ca: x509.Certificate,
    ca_key: CertificateIssuerPrivateKeyTypes,
    hosts: Iterable[str],
    now: datetime.datetime,
    validity: datetime.timedelta,
    *,
    common_name: str = "tally-webhook",
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A serving certificate for ``hosts`` (IPs or DNS names) signed by ``ca``; it ends no later
    than the CA (a chain is only as valid as its shortest-lived link)."""
    names = [_general_name(host) for host in dict.fromkeys(hosts)]
    if not names:
        raise ValueError("a serving certificate needs at least one host name or address")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + validity, ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, _signing_hash(ca_key))
    )
    return cert, key


def new_material(
    hosts: Sequence[str], now: datetime.datetime, policy: Policy = Policy()
) -> Material:
    """A fresh CA and a serving certificate it signed."""
    ca, ca_key = new_ca(now, policy.ca_validity)
    cert, key = new_serving_certificate(ca, ca_key, hosts, now, policy.validity)
    return Material(cas=(ca,), ca_key=ca_key, cert=cert, key=key)


# -- reading


def from_secret_data(data: Mapping[str, bytes]) -> Material:
    """Material from a Secret's (base64-decoded) data; :class:`MaterialError` says what is
    missing or inconsistent. ``ca.key`` may be missing (then tally cannot sign with that CA);
    ``tls.crt`` may carry a chain after the serving certificate (only the first is read)."""
    for required in (CA_CRT, TLS_CRT, TLS_KEY):
        if not data.get(required):
            raise MaterialError(f"{required} is missing or empty")
    cas = tuple(_certificates(data[CA_CRT], CA_CRT))
    for ca in cas:
        if not _is_ca(ca):
            raise MaterialError(f"{CA_CRT}: {_describe(ca)} is not a CA certificate")
    cert = _certificates(data[TLS_CRT], TLS_CRT)[0]
    key = _private_key(data[TLS_KEY], TLS_KEY)
    if not _key_matches(cert, key):
        raise MaterialError(f"{TLS_KEY} does not belong to the certificate in {TLS_CRT}")
    ca_key: CertificateIssuerPrivateKeyTypes | None = None
    if data.get(CA_KEY):
        raw = _private_key(data[CA_KEY], CA_KEY)
        if not isinstance(raw, _ISSUER_KEY_TYPES):
            raise MaterialError(f"{CA_KEY}: a {type(raw).__name__} cannot sign certificates")
        ca_key = typing.cast(CertificateIssuerPrivateKeyTypes, raw)
        if not _key_matches(cas[0], ca_key):
            raise MaterialError(f"{CA_KEY} does not belong to the first certificate in {CA_CRT}")
    return Material(cas=cas, ca_key=ca_key, cert=cert, key=key)


def missing_names(cert: x509.Certificate, hosts: Iterable[str]) -> list[str]:
    """The hosts (IPs or DNS names) that ``cert``'s SANs do not cover. A DNS wildcard covers
    one leftmost label, as in RFC 6125 and Go's verifier; the common name is not a name (Go
    ignores it since 1.15)."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return list(dict.fromkeys(hosts))
    ips = set(sans.get_values_for_type(x509.IPAddress))
    dns = [name.lower().rstrip(".") for name in sans.get_values_for_type(x509.DNSName)]
    missing: list[str] = []
    for host in dict.fromkeys(hosts):
        try:
            covered = ipaddress.ip_address(host) in ips
        except ValueError:
            covered = _dns_covered(host.lower().rstrip("."), dns)
        if not covered:
            missing.append(host)
    return missing


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether ``ca`` signed ``cert`` (names and signature; not validity)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# -- deciding


def plan(
    stored: Material | None, hosts: Sequence[str], now: datetime.datetime, policy: Policy
) -> Plan:
    """What should be stored, given what is (None: nothing, or nothing readable).

    1. The signing CA (``cas[0]``): kept while tally has its key and it is not due; a due one
       is succeeded by a new CA, the old staying in the bundle; an unusable one (no key,
       expired) is succeeded the same way, so a serving certificate it signed keeps working.
    2. The serving certificate: re-issued by the signing CA at once when unusable, or when
       due and already signed by it; when signed by an older CA (due or not), only once the
       signing CA is ``ca_overlap`` old (the API servers trust it by then); otherwise kept.
    3. The bundle: the signing CA, and older CAs only while the serving certificate chains to
       them and they are valid.
    """
    changes: list[str] = []
    cas = list(stored.cas) if stored is not None else []
    ca_key = stored.ca_key if stored is not None else None

    # 1. The signing CA.
    signer_problem = _signer_problem(cas[0] if cas else None, ca_key, now, policy)
    if signer_problem:
        ca, new_key = new_ca(now, policy.ca_validity)
        cas.insert(0, ca)
        ca_key = new_key
        changes.append(f"new CA ({signer_problem})")
    signer = cas[0]
    assert ca_key is not None  # a usable signer has its key (step 1)

    # 2. The serving certificate.
    waiting = ""
    cert, key = (stored.cert, stored.key) if stored is not None else (None, None)
    reissue = ""
    if cert is None:
        reissue = "no serving certificate"
    else:
        unusable = _leaf_problem(cert, cas, hosts, now)
        if unusable:
            reissue = unusable
        else:
            due = now >= policy.renew_at(cert)
            moving = not issued_by(cert, signer)
            if due or moving:
                why = (
                    f"serving certificate due for renewal since {_iso(policy.renew_at(cert))}"
                    if due
                    else "serving certificate signed by the previous CA"
                )
                # Only a move to another CA waits for the API servers to trust that CA.
                trusted_from = _created(signer) + policy.ca_overlap
                if not moving or now >= trusted_from:
                    reissue = why
                else:
                    waiting = (
                        f"{why}; kept until {_iso(trusted_from)}, when the API servers "
                        "have had time to trust the new CA"
                    )
    if reissue or cert is None or key is None:
        cert, key = new_serving_certificate(signer, ca_key, hosts, now, policy.validity)
        changes.append(f"new serving certificate ({reissue})")

    # 3. The bundle.
    kept = [signer] + [
        ca for ca in cas[1:] if _valid_at(ca, now) and issued_by(cert, ca) and ca != signer
    ]
    dropped = len(cas) - len(kept)
    if dropped:
        changes.append(f"{dropped} old CA(s) left the bundle")
    material = Material(cas=tuple(kept), ca_key=ca_key, cert=cert, key=key)
    if stored is not None and not changes and material.secret_data() != stored.secret_data():
        changes.append("rewritten")  # e.g. a duplicate CA in the stored bundle
    return Plan(material=material, changes=tuple(changes), waiting=waiting)


def problems(
    material: Material, hosts: Sequence[str], now: datetime.datetime, policy: Policy
) -> tuple[str, list[str]]:
    """For material tally only serves (mounted files): why it cannot be served at all ("" if
    it can), and the warnings worth a log line.

    Its issuer chose its validity, so "overdue" is measured on the certificate's own lifetime:
    a warning once less than half of ``renew_fraction`` of it is left, well past the point
    where an issuer renewing like tally (or like cert-manager's default, a third) has renewed
    it and the kubelet has updated the mounted files.
    """
    cert = material.cert
    unusable = _leaf_problem(cert, material.cas, hosts, now)
    warnings: list[str] = []
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    overdue_at = cert.not_valid_after_utc - lifetime * policy.renew_fraction / 2
    if not unusable and now >= overdue_at:
        warnings.append(
            f"serving certificate expires {_iso(cert.not_valid_after_utc)} and was not renewed: "
            "is its issuer renewing it?"
        )
    return unusable, warnings


def next_check(material: Material, now: datetime.datetime, policy: Policy) -> datetime.datetime:
    """When :func:`plan` will next decide something new for ``material``: the serving
    certificate or CA due, the end of a new CA's overlap, or the certificate's end. ``now`` +
    the validity when nothing is ahead (the caller caps waits anyway)."""
    cert, signer = material.cert, material.cas[0]
    times = [policy.renew_at(cert), cert.not_valid_after_utc, policy.ca_renew_at(signer)]
    if not issued_by(cert, signer):
        times.append(_created(signer) + policy.ca_overlap)
    return min((t for t in times if t > now), default=now + policy.validity)


# -- helpers


def _signer_problem(
    ca: x509.Certificate | None,
    key: CertificateIssuerPrivateKeyTypes | None,
    now: datetime.datetime,
    policy: Policy,
) -> str:
    if ca is None:
        return "none stored"
    if key is None:
        return f"no {CA_KEY} for {_describe(ca)}"
    if not _valid_at(ca, now):
        return f"{_describe(ca)} is not valid now ({_validity(ca)})"
    if now >= policy.ca_renew_at(ca):
        return f"{_describe(ca)} due for renewal since {_iso(policy.ca_renew_at(ca))}"
    return ""


def _leaf_problem(
    cert: x509.Certificate,
    cas: Sequence[x509.Certificate],
    hosts: Sequence[str],
    now: datetime.datetime,
) -> str:
    if not _valid_at(cert, now):
        return f"serving certificate not valid now ({_validity(cert)})"
    missing = missing_names(cert, hosts)
    if missing:
        return f"serving certificate does not name {', '.join(missing)}"
    if not any(_valid_at(ca, now) and issued_by(cert, ca) for ca in cas):
        return f"serving certificate not signed by a valid CA in {CA_CRT}"
    return ""


def _created(ca: x509.Certificate) -> datetime.datetime:
    """When tally made ``ca`` (it backdates by CLOCK_SKEW); for someone else's CA a little
    later than the truth, which only makes the overlap longer."""
    return ca.not_valid_before_utc + CLOCK_SKEW


def _valid_at(cert: x509.Certificate, now: datetime.datetime) -> bool:
    return cert.not_valid_before_utc <= now < cert.not_valid_after_utc


def _validity(cert: x509.Certificate) -> str:
    return f"{_iso(cert.not_valid_before_utc)} to {_iso(cert.not_valid_after_utc)}"


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return f"CA {names[0].value!s}" if names else f"certificate {cert.serial_number:x}"


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _dns_covered(host: str, names: Sequence[str]) -> bool:
    for name in names:
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as error:
        raise MaterialError(f"{what}: not PEM certificates ({error})") from None
    if not certs:
        raise MaterialError(f"{what}: no certificate")
    return certs


def _private_key(pem: bytes, what: str) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as error:
        raise MaterialError(f"{what}: not an unencrypted PEM private key ({error})") from None
    except Exception as error:  # cryptography raises UnsupportedAlgorithm for odd key types
        raise MaterialError(f"{what}: unsupported private key ({error})") from None


def _public_der(key: object) -> bytes:
    public_bytes = getattr(key, "public_bytes", None)
    if public_bytes is None:
        return b""
    der: bytes = public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def _key_matches(cert: x509.Certificate, key: PrivateKeyTypes) -> bool:
    return _public_der(cert.public_key()) == _public_der(key.public_key())


def _signing_hash(key: CertificateIssuerPrivateKeyTypes) -> hashes.SHA256 | None:
    # Ed25519/Ed448 sign the message itself; everything else signs a SHA-256 digest.
    if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return None
    return hashes.SHA256()


def _pem_key(key: PrivateKeyTypes) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
