"""tally.webhook.tls without a cluster: a real TLS server on loopback serving tally's context.

* A renewal reaches new handshakes of the *running* server (no restart), and the caBundle
  handed to the webhook configuration follows, in the safe order during a CA rotation.
* Mutual TLS: no client certificate, or one from another CA, is refused in the handshake.
* Mounted files: served as found, an unusable set refused, a replaced set picked up.

The sources here are :class:`MemorySource` and :class:`MountedSource` (files): the Secret
source is exercised against the real API server in ``tests/e2e/test_webhook_tls.py``.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl
import stat
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tally.webhook import certs
from tally.webhook.certs import Material, MaterialError, Policy
from tally.webhook.tls import (
    MemorySource,
    MountedSource,
    SecretSource,
    ServingTLS,
    server_context,
)

pytestmark = pytest.mark.unit

HOSTS = ("127.0.0.1",)
MINUTE = datetime.timedelta(minutes=1)
POLICY = Policy(
    validity=30 * MINUTE, ca_validity=90 * MINUTE, renew_fraction=1 / 3, ca_overlap=MINUTE
)


class Clock:
    """Real time plus an offset the test moves forward (certificates must be valid now for
    the TLS client, so the base is the wall clock)."""

    def __init__(self) -> None:
        self.offset = datetime.timedelta()

    def __call__(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC) + self.offset


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"ok")
    await writer.drain()
    writer.close()


async def _serve(context: ssl.SSLContext) -> asyncio.Server:
    return await asyncio.start_server(_answer, "127.0.0.1", 0, ssl=context)


def _port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


async def _presented(
    port: int, ca_bundle: bytes | None, *, client: tuple[Path, Path] | None = None
) -> x509.Certificate:
    """The certificate the server presents to a client that trusts ``ca_bundle``; None: to a
    client that checks nothing (the tests that move the clock ahead make certificates that
    are not valid yet by the wall clock; they check the chain themselves)."""
    if ca_bundle is None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cadata=ca_bundle.decode())
    if client is not None:
        context.load_cert_chain(*client)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
    )
    ssl_object = writer.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True)
    assert b"ok" == await reader.read()
    writer.close()
    return x509.load_der_x509_certificate(der)


async def _reply(port: int, ca_bundle: bytes, client: tuple[Path, Path] | None) -> bytes:
    """What a client gets from the server: its answer, or b"" when the TLS layer refused."""
    context = ssl.create_default_context(cadata=ca_bundle.decode())
    if client is not None:
        context.load_cert_chain(*client)
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
        )
        data = await reader.read()
    except (ssl.SSLError, ConnectionResetError):
        return b""
    writer.close()
    return data


def _chains_to(cert: x509.Certificate, bundle: bytes) -> bool:
    return any(certs.issued_by(cert, ca) for ca in x509.load_pem_x509_certificates(bundle))


async def test_a_renewal_reaches_new_handshakes_without_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    tls = ServingTLS(
        MemorySource(), hosts=HOSTS, policy=POLICY, directory=tmp_path / "tls", clock=clock
    )
    await tls.load()
    first = tls.material
    assert first is not None
    server = await _serve(tls.context)
    try:
        assert first.cert == await _presented(_port(server), tls.ca_bundle)  # verified
        published: list[bytes] = []

        async def publish(bundle: bytes) -> None:
            published.append(bundle)

        tls._publish = publish  # what start() sets, without its background loop
        tls._published = tls.ca_bundle

        # Not due yet: nothing changes.
        await tls.check()
        assert first.cert == tls.material.cert

        # 21 minutes on, less than a third of 30 is left: renewed by the same CA.
        clock.offset = 21 * MINUTE
        await tls.check()
        second = tls.material
        assert first.cert != second.cert
        assert first.cas == second.cas
        assert [] == published  # the caBundle did not change
        assert second.cert == await _presented(_port(server), None)
        assert _chains_to(second.cert, tls.ca_bundle)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_ca_rotation_publishes_before_it_presents(tmp_path: Path) -> None:
    clock = Clock()
    tls = ServingTLS(
        MemorySource(), hosts=HOSTS, policy=POLICY, directory=tmp_path / "tls", clock=clock
    )
    await tls.load()
    assert tls.material is not None
    old_ca = tls.material.cas[0]
    server = await _serve(tls.context)
    presented_when_published: list[tuple[bytes, x509.Certificate]] = []

    async def publish(bundle: bytes) -> None:
        # What the server presents at the moment each bundle is handed over.
        presented = await _presented(_port(server), None)
        assert _chains_to(presented, bundle)
        presented_when_published.append((bundle, presented))

    tls._publish = publish
    tls._published = tls.ca_bundle
    try:
        # Keep the serving certificate fresh until the CA is due (60 of 90 minutes).
        for minutes in (20, 40, 61):
            clock.offset = minutes * MINUTE
            await tls.check()
        # The new CA joined the bundle; the server still presents the old CA's certificate.
        assert 1 == len(presented_when_published)
        bundle, presented = presented_when_published[0]
        new_ca, kept = x509.load_pem_x509_certificates(bundle)
        assert old_ca == kept
        assert certs.issued_by(presented, old_ca)

        # After the overlap: union (old CA still trusted) → switch → new bundle.
        clock.offset = 61 * MINUTE + POLICY.ca_overlap
        await tls.check()
        assert certs.issued_by(tls.material.cert, new_ca)
        bundles = [b for b, _ in presented_when_published[1:]]
        assert [new_ca.public_bytes(serialization.Encoding.PEM)] == bundles
        assert tls.material.cert == await _presented(_port(server), None)
    finally:
        server.close()
        await server.wait_closed()


async def test_the_key_is_private_to_the_owner(tmp_path: Path) -> None:
    tls = ServingTLS(MemorySource(), hosts=HOSTS, policy=POLICY, directory=tmp_path / "tls")
    await tls.load()
    key = tmp_path / "tls" / "tls.key"
    assert 0o600 == stat.S_IMODE(key.stat().st_mode)
    assert tls.ca_bundle == (tmp_path / "tls" / "ca.crt").read_bytes()


# -- mutual TLS


def _client_pair(directory: Path, material: Material) -> tuple[Path, Path]:
    """A client certificate (extended key usage clientAuth, as the API server's) signed by
    ``material``'s CA, written to files."""
    assert material.ca_key is not None
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(material.cas[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - MINUTE)
        .not_valid_after(now + MINUTE)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(material.ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "client.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "client.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return directory / "client.crt", directory / "client.key"


@pytest.mark.parametrize("client", ["none", "other-ca"])
async def test_mutual_tls_refuses_clients_without_the_right_certificate(
    tmp_path: Path, client: str
) -> None:
    now = datetime.datetime.now(datetime.UTC)
    client_ca, other_ca = certs.new_material(HOSTS, now), certs.new_material(HOSTS, now)
    (tmp_path / "client-ca.crt").write_bytes(client_ca.ca_bundle)
    tls = ServingTLS(
        MemorySource(),
        hosts=HOSTS,
        policy=POLICY,
        directory=tmp_path / "tls",
        client_ca=str(tmp_path / "client-ca.crt"),
    )
    await tls.load()
    assert tls.material is not None
    server = await _serve(tls.context)
    try:
        port = _port(server)
        # The API server's certificate (signed by the client CA) gets an answer …
        good = _client_pair(tmp_path / "good", client_ca)
        assert tls.material.cert == await _presented(port, tls.ca_bundle, client=good)
        # … no certificate, or one another CA signed, does not: in TLS 1.3 the client finishes
        # its side of the handshake, then the server refuses and closes, and the client reads
        # nothing (or the alert, as an error).
        bad = None if client == "none" else _client_pair(tmp_path / "bad", other_ca)
        assert b"" == await _reply(port, tls.ca_bundle, bad)
    finally:
        server.close()
        await server.wait_closed()


def test_system_cas_are_not_trusted_for_clients(tmp_path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    (tmp_path / "ca.crt").write_bytes(certs.new_material(HOSTS, now).ca_bundle)
    context = server_context(str(tmp_path / "ca.crt"))
    assert ssl.CERT_REQUIRED == context.verify_mode
    assert 1 == context.cert_store_stats()["x509_ca"]


def test_an_unreadable_client_ca_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TALLY_WEBHOOK_CLIENT_CA="):
        server_context(str(tmp_path / "missing.crt"))


# -- mounted files


def _mount(directory: Path, material: Material) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in material.secret_data().items():
        if name != certs.CA_KEY:  # cert-manager writes no CA key
            (directory / name).write_bytes(data)


async def test_mounted_files_are_served_and_followed(tmp_path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    mount = tmp_path / "mount"
    first = certs.new_material(HOSTS, now)
    _mount(mount, first)
    tls = ServingTLS(MountedSource(mount), hosts=HOSTS, policy=POLICY, directory=tmp_path / "t")
    await tls.load()
    server = await _serve(tls.context)
    try:
        assert first.cert == await _presented(_port(server), first.ca_bundle)
        assert first.ca_bundle == tls.ca_bundle
        # The issuer renewed it (same CA, as cert-manager does): picked up at the next pass.
        assert first.ca_key is not None
        cert, key = certs.new_serving_certificate(
            first.cas[0], first.ca_key, HOSTS, now, POLICY.validity
        )
        second = Material(cas=first.cas, ca_key=None, cert=cert, key=key)
        _mount(mount, second)
        await tls.check()
        assert second.cert == await _presented(_port(server), first.ca_bundle)
        # Tally never writes there.
        assert not (mount / certs.CA_KEY).exists()
    finally:
        server.close()
        await server.wait_closed()


async def test_on_load_is_told_each_served_certificates_end(tmp_path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    ca, ca_key = certs.new_ca(now, 90 * MINUTE)
    mount = tmp_path / "mount"

    def mount_valid_for(minutes: int) -> None:
        cert, key = certs.new_serving_certificate(ca, ca_key, HOSTS, now, minutes * MINUTE)
        _mount(mount, Material(cas=(ca,), ca_key=None, cert=cert, key=key))

    loaded: list[datetime.datetime] = []
    mount_valid_for(30)
    tls = ServingTLS(
        MountedSource(mount), hosts=HOSTS, policy=POLICY, directory=tmp_path / "t",
        on_load=loaded.append,
    )  # fmt: skip
    await tls.load()
    assert [now + 30 * MINUTE] == loaded
    # The same files again: nothing new is loaded, nothing reported.
    await tls.check()
    assert [now + 30 * MINUTE] == loaded
    # Replaced by a certificate valid for 45 minutes: loaded, and reported.
    mount_valid_for(45)
    await tls.check()
    assert [now + 30 * MINUTE, now + 45 * MINUTE] == loaded


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        pytest.param(("elsewhere.example",), "does not name elsewhere.example", id="wrong-name"),
        pytest.param(HOSTS, "", id="no-files"),
    ],
)
async def test_unusable_mounted_files_are_refused(
    tmp_path: Path, hosts: tuple[str, ...], message: str
) -> None:
    mount = tmp_path / "mount"
    mount.mkdir()
    if message:
        _mount(mount, certs.new_material(HOSTS, datetime.datetime.now(datetime.UTC)))
    tls = ServingTLS(MountedSource(mount), hosts=hosts, policy=POLICY, directory=tmp_path / "t")
    with pytest.raises(MaterialError, match=message or "no usable certificate"):
        await tls.load()


# -- the certificate Secret's watch events


@pytest.mark.parametrize(
    ("namespace", "name", "version", "wakes"),
    [
        pytest.param("tally-system", "tally-webhook-tls", "9", True, id="someone-changed-it"),
        pytest.param("tally-system", "tally-webhook-tls", "", False, id="the-version-it-read"),
        pytest.param("tally-system", "another-secret", "9", False, id="another-secret"),
        pytest.param("elsewhere", "tally-webhook-tls", "9", False, id="another-namespace"),
    ],
)
def test_only_the_certificate_secrets_events_wake_the_keeper(
    tmp_path: Path, namespace: str, name: str, version: str, wakes: bool
) -> None:
    source = SecretSource(cast(Any, None), "tally-system", "tally-webhook-tls")
    tls = ServingTLS(source, hosts=HOSTS, policy=POLICY, directory=tmp_path / "tls")
    tls.secret_event(
        {"metadata": {"namespace": namespace, "name": name, "resourceVersion": version}}
    )
    assert wakes is tls._wake.is_set()
