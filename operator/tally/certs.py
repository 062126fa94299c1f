"""Serving certificates for tally's admission webhook, made with ``cryptography``.

The API server only calls webhooks over TLS and checks the certificate against the
``caBundle`` of the webhook configuration, so tally needs a CA and a serving certificate whose
SANs name the address the API server dials (``127.0.0.1`` locally, ``<svc>.<ns>.svc`` in a
cluster). Kopf can generate one itself, but through ``oscrypto``, which fails with OpenSSL
≥ 3.0.10; so tally makes its own and hands Kopf the files.

Left out: rotation (the in-cluster deployment, issue 7, keeps the pair in a Secret and renews it)
and client-certificate verification (mutual TLS, also issue 7).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY: Final = datetime.timedelta(days=365)
CLOCK_SKEW: Final = datetime.timedelta(minutes=5)
"""Backdating, so that an API server whose clock is a little behind accepts a fresh cert."""


@dataclass(frozen=True)
class ServingCertificate:
    """Where the files are, and the CA bundle for the webhook configuration."""

    certfile: Path
    pkeyfile: Path
    cafile: Path
    ca_pem: bytes


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def generate_serving_certificate(
    directory: Path, hosts: Iterable[str], *, common_name: str = "tally-webhook"
) -> ServingCertificate:
    """A new CA and a serving certificate for ``hosts`` (IPs or DNS names), written to
    ``directory`` (keys readable by the owner only)."""
    names = [_general_name(host) for host in dict.fromkeys(hosts)]
    if not names:
        raise ValueError("a serving certificate needs at least one host name or address")
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name}-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + VALIDITY)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    result = ServingCertificate(
        certfile=directory / "tls.crt",
        pkeyfile=directory / "tls.key",
        cafile=directory / "ca.crt",
        ca_pem=ca_pem,
    )
    result.pkeyfile.touch(mode=0o600)
    result.pkeyfile.write_bytes(_pem_key(key))
    # The chain, so that clients that only know the CA can verify the leaf.
    result.certfile.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    result.cafile.write_bytes(ca_pem)
    return result
