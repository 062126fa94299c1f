"""tally.webhook.certs: what it makes serves TLS; stored material is read back or refused with a
reason; the renewal decision (serving certificate, CA, the CA overlap) on plain data with a fixed
clock."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ipaddress
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import NameOID

from tally.webhook import certs
from tally.webhook.certs import Material, MaterialError, Policy

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
HOSTS = ("tally-webhook.tally-system.svc", "tally-webhook.tally-system.svc.cluster.local")
POLICY = Policy(validity=90 * DAY, ca_validity=900 * DAY, renew_fraction=1 / 3, ca_overlap=DAY / 24)


def _fresh(at: datetime.datetime = NOW, hosts: tuple[str, ...] = HOSTS) -> Material:
    return certs.new_material(hosts, at, POLICY)


# -- what it makes serves TLS (a client that trusts only the bundle accepts every SAN)


async def _handshake(tmp_path: Path, material: Material, server_name: str) -> bytes:
    (tmp_path / "tls.crt").write_bytes(material.cert_pem)
    (tmp_path / "tls.key").write_bytes(material.key_pem)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    client_context = ssl.create_default_context(cadata=material.ca_bundle.decode())
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context, server_hostname=server_name
        )
        data = await reader.read()
        writer.close()
        return data
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "server_name",
    [pytest.param("127.0.0.1", id="ip-san"), pytest.param("tally.tally-system.svc", id="dns-san")],
)
async def test_a_client_trusting_the_ca_accepts_every_san(tmp_path: Path, server_name: str) -> None:
    material = certs.new_material(
        ["127.0.0.1", "tally.tally-system.svc"], datetime.datetime.now(datetime.UTC)
    )
    assert await _handshake(tmp_path, material, server_name) == b"ok"


async def test_a_name_outside_the_sans_is_refused(tmp_path: Path) -> None:
    material = certs.new_material(["127.0.0.1"], datetime.datetime.now(datetime.UTC))
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(tmp_path, material, "elsewhere.example")


def test_no_hosts_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one host"):
        certs.new_material([], NOW)


def test_made_certificates_backdate_and_cap_at_the_ca() -> None:
    ca, ca_key = certs.new_ca(NOW, 10 * DAY)
    cert, _ = certs.new_serving_certificate(ca, ca_key, HOSTS, NOW, 365 * DAY)
    assert NOW - certs.CLOCK_SKEW == cert.not_valid_before_utc
    assert ca.not_valid_after_utc == cert.not_valid_after_utc
    assert certs.issued_by(cert, ca)
    (common_name,) = ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert f"tally-webhook-ca@{int(NOW.timestamp())}" == common_name.value


# -- reading Secret data back


def test_secret_data_round_trips() -> None:
    material = _fresh()
    data = material.secret_data()
    assert {"ca.crt", "ca.key", "tls.crt", "tls.key"} == set(data)
    assert data == certs.from_secret_data(data).secret_data()


def test_without_ca_key_the_material_cannot_sign() -> None:
    data = _fresh().secret_data()
    del data["ca.key"]
    assert certs.from_secret_data(data).ca_key is None


def test_a_chain_in_tls_crt_is_read_as_its_first_certificate() -> None:
    material = _fresh()
    data = {**material.secret_data(), "tls.crt": material.cert_pem + material.ca_bundle}
    assert material.cert == certs.from_secret_data(data).cert


def _other() -> Material:
    return _fresh()


BROKEN: list[tuple[str, Callable[[dict[str, bytes]], None], str]] = [
    ("no-tls-crt", lambda d: d.pop("tls.crt"), "tls.crt is missing"),
    ("no-tls-key", lambda d: d.pop("tls.key"), "tls.key is missing"),
    ("no-ca-crt", lambda d: d.pop("ca.crt"), "ca.crt is missing"),
    ("empty-ca-crt", lambda d: d.update({"ca.crt": b""}), "ca.crt is missing or empty"),
    ("garbage-cert", lambda d: d.update({"tls.crt": b"not pem"}), "tls.crt: not PEM certificates"),
    ("garbage-key", lambda d: d.update({"tls.key": b"junk"}), "tls.key: not an unencrypted PEM"),
    (
        "foreign-tls-key",
        lambda d: d.update({"tls.key": _other().key_pem}),
        "tls.key does not belong to the certificate in tls.crt",
    ),
    (
        "foreign-ca-key",
        lambda d: d.update({"ca.key": _other().secret_data()["ca.key"]}),
        "ca.key does not belong to the first certificate in ca.crt",
    ),
    (
        "leaf-as-ca",
        lambda d: d.update({"ca.crt": d["tls.crt"]}),
        "is not a CA certificate",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "message"), [pytest.param(m, msg, id=name) for name, m, msg in BROKEN]
)
def test_broken_secret_data_is_refused_with_a_reason(
    mutate: Callable[[dict[str, bytes]], None], message: str
) -> None:
    data = _fresh().secret_data()
    mutate(data)
    with pytest.raises(MaterialError, match=message):
        certs.from_secret_data(data)


# -- SAN checks


def _with_sans(*names: x509.GeneralName) -> x509.Certificate:
    ca, ca_key = certs.new_ca(NOW, DAY)
    cert, _ = certs.new_serving_certificate(ca, ca_key, ["placeholder.example"], NOW, DAY)
    builder = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(ca.subject)
        .public_key(cert.public_key())
        .serial_number(1)
        .not_valid_before(NOW)
        .not_valid_after(NOW + DAY)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


SVC = "tally-webhook.tally-system.svc"


@pytest.mark.parametrize(
    ("sans", "hosts", "missing"),
    [
        pytest.param([x509.DNSName(SVC)], [SVC], [], id="dns-exact"),
        pytest.param([x509.DNSName(SVC.upper())], [SVC], [], id="dns-case-insensitive"),
        pytest.param([x509.DNSName("*.tally-system.svc")], [SVC], [], id="wildcard-one-label"),
        pytest.param([x509.DNSName("*.svc")], [SVC], [SVC], id="wildcard-not-two-labels"),
        pytest.param(
            [x509.DNSName("*.tally-system.svc")],
            ["tally-system.svc"],
            ["tally-system.svc"],
            id="wildcard-not-the-bare-domain",
        ),
        pytest.param(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))], ["127.0.0.1"], [], id="ip"
        ),
        pytest.param([x509.DNSName("127.0.0.1")], ["127.0.0.1"], ["127.0.0.1"], id="ip-as-dns"),
        pytest.param(
            [x509.DNSName(SVC)],
            [SVC, f"{SVC}.cluster.local"],
            [f"{SVC}.cluster.local"],
            id="one-of-two-missing",
        ),
        pytest.param([], [SVC], [SVC], id="no-san-extension"),
    ],
)
def test_missing_names(sans: list[x509.GeneralName], hosts: list[str], missing: list[str]) -> None:
    assert missing == certs.missing_names(_with_sans(*sans), hosts)


# -- the renewal decision


def test_nothing_stored_makes_a_ca_and_a_serving_certificate() -> None:
    decided = certs.plan(None, HOSTS, NOW, POLICY)
    assert [c.split(" (")[0] for c in decided.changes] == ["new CA", "new serving certificate"]
    material = decided.material
    assert 1 == len(material.cas)
    assert certs.issued_by(material.cert, material.cas[0])
    assert [] == certs.missing_names(material.cert, HOSTS)
    assert NOW + POLICY.validity == material.cert.not_valid_after_utc


def test_fresh_material_is_kept_as_it_is() -> None:
    stored = _fresh()
    decided = certs.plan(stored, HOSTS, NOW + 59 * DAY, POLICY)
    assert () == decided.changes
    assert "" == decided.waiting
    assert stored.secret_data() == decided.material.secret_data()


@pytest.mark.parametrize(
    ("at", "hosts", "reason"),
    [
        pytest.param(NOW + 61 * DAY, HOSTS, "due for renewal", id="due"),
        pytest.param(NOW + 91 * DAY, HOSTS, "not valid now", id="expired"),
        pytest.param(
            NOW + DAY, (*HOSTS, "127.0.0.1"), "does not name 127.0.0.1", id="new-san-needed"
        ),
    ],
)
def test_serving_certificate_renewed_by_the_same_ca(
    at: datetime.datetime, hosts: tuple[str, ...], reason: str
) -> None:
    stored = _fresh()
    decided = certs.plan(stored, hosts, at, POLICY)
    (change,) = decided.changes
    assert change.startswith("new serving certificate"), change
    assert reason in change
    # The caBundle stays as it was: only the serving pair changes.
    assert stored.ca_bundle == decided.material.ca_bundle
    assert stored.cert != decided.material.cert
    assert [] == certs.missing_names(decided.material.cert, hosts)
    assert at + POLICY.validity == decided.material.cert.not_valid_after_utc


def _key(material: Material) -> CertificateIssuerPrivateKeyTypes:
    assert material.ca_key is not None
    return material.ca_key


def _leaf_made_at(material: Material, made: datetime.datetime) -> Material:
    """``material`` with its serving certificate re-made by its CA at ``made``."""
    cert, key = certs.new_serving_certificate(
        material.cas[0], _key(material), HOSTS, made, POLICY.validity
    )
    return dataclasses.replace(material, cert=cert, key=key)


def test_a_due_ca_joins_the_bundle_before_it_signs() -> None:
    # The CA (900 days) is due at day 600; the serving certificate made at day 590 is due at
    # day 650.
    stored = _leaf_made_at(_fresh(), NOW + 590 * DAY)
    old_ca = stored.cas[0]
    at = NOW + 601 * DAY
    step1 = certs.plan(stored, HOSTS, at, POLICY)
    (change,) = step1.changes
    assert change.startswith("new CA ("), change
    assert "due for renewal" in change
    new_ca = step1.material.cas[0]
    assert (new_ca, old_ca) == step1.material.cas
    assert stored.cert == step1.material.cert  # still served, signed by the old CA
    assert certs.issued_by(step1.material.cert, old_ca)
    assert at + POLICY.ca_overlap == certs.next_check(step1.material, at, POLICY)

    # Within the overlap nothing changes.
    assert () == certs.plan(step1.material, HOSTS, at + POLICY.ca_overlap / 2, POLICY).changes

    # After it, the serving certificate moves to the new CA and the old CA leaves the bundle.
    step2 = certs.plan(step1.material, HOSTS, at + POLICY.ca_overlap, POLICY)
    assert step2.changes == (
        "new serving certificate (serving certificate signed by the previous CA)",
        "1 old CA(s) left the bundle",
    )
    assert (new_ca,) == step2.material.cas
    assert certs.issued_by(step2.material.cert, new_ca)
    assert "" == step2.waiting


def test_a_due_serving_certificate_waits_for_a_new_ca_to_be_trusted() -> None:
    # Made at day 540: due at day 600, valid until day 630. At day 601 the CA is due too.
    stored = _leaf_made_at(_fresh(), NOW + 540 * DAY)
    decided = certs.plan(stored, HOSTS, NOW + 601 * DAY, POLICY)
    assert stored.cert == decided.material.cert
    assert decided.waiting.startswith("serving certificate due for renewal since")
    assert decided.waiting.endswith("when the API servers have had time to trust the new CA")


def test_a_due_serving_certificate_of_a_young_ca_is_renewed_at_once() -> None:
    # The CA is minutes old, but it signed the due certificate itself: the API servers trust
    # it already, nothing to wait for (a Secret replaced by a nearly expired pair).
    stored = _fresh()
    cert, key = certs.new_serving_certificate(
        stored.cas[0], _key(stored), HOSTS, NOW - 89 * DAY, POLICY.validity
    )
    stored = dataclasses.replace(stored, cert=cert, key=key)
    decided = certs.plan(stored, HOSTS, NOW + POLICY.ca_overlap / 2, POLICY)
    (change,) = decided.changes
    assert change.startswith("new serving certificate (serving certificate due"), change
    assert "" == decided.waiting
    assert stored.cas == decided.material.cas


def test_an_unusable_serving_certificate_is_replaced_at_once_even_by_a_new_ca() -> None:
    stored = _fresh()
    at = NOW + 601 * DAY  # the CA is due, and the serving certificate made at NOW expired
    decided = certs.plan(stored, HOSTS, at, POLICY)
    assert [c.split(" (")[0] for c in decided.changes] == [
        "new CA",
        "new serving certificate",
        "1 old CA(s) left the bundle",
    ]
    assert certs.issued_by(decided.material.cert, decided.material.cas[0])
    assert 1 == len(decided.material.cas)


def test_an_expired_ca_is_replaced_with_everything_it_signed() -> None:
    stored = _fresh()
    at = NOW + 901 * DAY
    decided = certs.plan(stored, HOSTS, at, POLICY)
    material = decided.material
    assert 1 == len(material.cas)
    assert stored.cas[0] != material.cas[0]
    assert certs.issued_by(material.cert, material.cas[0])
    assert "is not valid now" in decided.changes[0]


def test_a_certificate_made_elsewhere_is_taken_over_without_a_gap() -> None:
    # A Secret with no ca.key (cert-manager's shape): tally cannot sign with that CA, so it
    # makes its own, keeps serving the certificate it found until its CA is trusted, then moves.
    foreign = dataclasses.replace(_fresh(), ca_key=None)
    step1 = certs.plan(foreign, HOSTS, NOW + DAY, POLICY)
    assert step1.changes[0].startswith("new CA (no ca.key for CA tally-webhook-ca@")
    assert foreign.cert == step1.material.cert
    assert (step1.material.cas[0], foreign.cas[0]) == step1.material.cas
    step2 = certs.plan(step1.material, HOSTS, NOW + DAY + POLICY.ca_overlap, POLICY)
    assert (step2.material.cas[0],) == step2.material.cas
    assert certs.issued_by(step2.material.cert, step2.material.cas[0])


def test_a_serving_certificate_no_bundled_ca_signed_is_replaced() -> None:
    stored, other = _fresh(), _fresh()
    mixed = dataclasses.replace(stored, cert=other.cert, key=other.key)
    decided = certs.plan(mixed, HOSTS, NOW + DAY, POLICY)
    (change,) = decided.changes
    assert "not signed by a valid CA in ca.crt" in change
    assert certs.issued_by(decided.material.cert, stored.cas[0])


def test_next_check_is_the_serving_certificates_renewal() -> None:
    material = _fresh()
    assert NOW + 60 * DAY == certs.next_check(material, NOW + DAY, POLICY)
    # Past the leaf's renewal (a renewal that failed), the next thing ahead is its end.
    assert NOW + 90 * DAY == certs.next_check(material, NOW + 61 * DAY, POLICY)


# -- material tally only serves (mounted files)


def test_problems_of_mounted_material() -> None:
    # 90 days, made at NOW: overdue with less than a sixth (15 days) left, i.e. from day 75.
    material = _fresh()
    assert ("", []) == certs.problems(material, HOSTS, NOW + DAY, POLICY)
    assert ("", []) == certs.problems(material, HOSTS, NOW + 74 * DAY, POLICY)
    unusable, warnings = certs.problems(material, HOSTS, NOW + 76 * DAY, POLICY)
    assert "" == unusable
    (warning,) = warnings
    assert "was not renewed" in warning
    assert "is its issuer renewing it?" in warning
    unusable, _ = certs.problems(material, ("elsewhere.example",), NOW + DAY, POLICY)
    assert "does not name elsewhere.example" in unusable
    unusable, _ = certs.problems(material, HOSTS, NOW + 91 * DAY, POLICY)
    assert "not valid now" in unusable
