"""The webhook certificate kept in a Secret and renewed while tally runs.

tally runs as a process of this module's own (``TallyProcess``) with
``TALLY_WEBHOOK_CERT_SECRET`` naming a Secret in a namespace of its own, which is
``TALLY_NAMESPACE`` (exempt from tally's webhook, as the Deployment's ``tally-system``):

* The certificate is read from the Secret at start-up, so a restarted tally serves the same one
  and the configuration's caBundle stays the same; the Secret is not rewritten.
* With short validities (seconds), the serving certificate and the CA are renewed while tally
  runs: every handshake presents the newest certificate, the caBundle follows the CA, and the
  API server's calls to the webhook never fail meanwhile — a create every quarter second, all
  judged (a quota counts them), none refused by the failure policy.
* Someone replacing the Secret's content is noticed at once (its watch event): a nearly expired
  pair is renewed, and content that cannot be read is replaced by what tally serves.

What is observed: the Secret and the configuration through the API, and the certificate the
webhook port presents in a TLS handshake (as the API server sees it).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes_asyncio import client
from operator_process import TallyProcess

import cluster
from builders import pod
from tally.webhook import certs
from tally_e2e import ControlPlane, eventually

SECRET = "tally-webhook-tls"
CONFIGURATION = "tally.dev"
PAUSE = "registry.k8s.io/pause:3.10"


# -- observing


async def secret_data(api: client.ApiClient, namespace: str) -> tuple[str, dict[str, bytes]]:
    """The Secret's resourceVersion and its decoded data."""
    secret = await client.CoreV1Api(api).read_namespaced_secret(SECRET, namespace)
    data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
    return secret.metadata.resource_version, data


async def ca_bundle(api: client.ApiClient) -> bytes:
    """The caBundle of tally's quota webhook, as registered (every webhook has the same)."""
    response = await client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
        CONFIGURATION, _preload_content=False
    )
    configuration = json.loads(await response.read())
    bundles = {w["clientConfig"]["caBundle"] for w in configuration["webhooks"]}
    (bundle,) = bundles
    return base64.b64decode(bundle)


async def presented(port: int, client_pair: tuple[Path, Path] | None) -> x509.Certificate:
    """The certificate tally's webhook port presents (the handshake checks nothing: the tests
    compare it with the Secret and the caBundle themselves)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if client_pair is not None:
        context.load_cert_chain(*client_pair)
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der)


def chains_to(cert: x509.Certificate, bundle: bytes) -> bool:
    for ca in x509.load_pem_x509_certificates(bundle):
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


# -- fixtures


@pytest_asyncio.fixture
async def tally_namespace(api: client.ApiClient) -> AsyncIterator[str]:
    """tally's own namespace (TALLY_NAMESPACE), where its Secret lives."""
    core = client.CoreV1Api(api)
    name = f"tally-tls-{uuid.uuid4().hex[:6]}"
    await core.create_namespace({"metadata": {"name": name}})
    yield name
    await core.delete_namespace(name)


@pytest.fixture
def tally_log(tmp_path: Path) -> Path:
    return tmp_path / "tally.log"


@pytest.fixture
def client_pair(control_plane: ControlPlane) -> tuple[Path, Path] | None:
    """A client certificate the webhook accepts: the API server's (``TallyProcess`` runs tally
    with mutual TLS)."""
    pki = cluster.webhook_client_pki(control_plane.kubeconfig.parent)
    assert pki is not None, "an operator-mode control plane"
    return pki.cert, pki.key


def _tally(plane: ControlPlane, namespace: str, log: Path, **env: str) -> TallyProcess:
    return TallyProcess(
        plane.kubeconfig,
        log,
        bin_dir=plane.bin_dir,
        env={
            "TALLY_NAMESPACE": namespace,
            "TALLY_WEBHOOK_CERT_SECRET": f"{namespace}/{SECRET}",
            **env,
        },
    )


@pytest.fixture
def stopped() -> Iterator[list[TallyProcess]]:
    """Tally processes to stop after the test, whatever happened."""
    processes: list[TallyProcess] = []
    yield processes
    for process in processes:
        process.kill()


# -- the tests


async def test_the_certificate_is_kept_in_the_secret_across_restarts(
    control_plane: ControlPlane,
    api: client.ApiClient,
    tally_namespace: str,
    namespace: str,
    tally_log: Path,
    client_pair: tuple[Path, Path] | None,
    stopped: list[TallyProcess],
) -> None:
    tally = _tally(control_plane, tally_namespace, tally_log)
    stopped.append(tally)
    await asyncio.to_thread(tally.start)

    version, data = await secret_data(api, tally_namespace)
    assert {"ca.crt", "ca.key", "tls.crt", "tls.key"} == set(data)
    served = await presented(tally.webhook_port, client_pair)
    assert data["tls.crt"] == pem(served)
    assert data["ca.crt"] == await ca_bundle(api)
    assert chains_to(served, data["ca.crt"])

    # Admission works with it: the API server trusts the certificate.
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "1"}}}
    )
    await eventually(
        lambda: core.read_namespaced_resource_quota("q", namespace),
        until=lambda q: bool(q.status and q.status.used),
        what="status.used",
    )
    await core.create_namespaced_pod(namespace, pod("one", container_name="c", image=PAUSE))
    with pytest.raises(client.ApiException) as denied:
        await core.create_namespaced_pod(namespace, pod("two", container_name="c", image=PAUSE))
    assert 403 == denied.value.status
    assert "exceeded quota: q" in json.loads(denied.value.body)["message"]

    # A restart serves the same certificate from the Secret, which it does not rewrite.
    assert 0 == await asyncio.to_thread(tally.stop)
    await asyncio.to_thread(tally.start)
    assert (version, data) == await secret_data(api, tally_namespace)
    assert served == await presented(tally.webhook_port, client_pair)
    assert data["ca.crt"] == await ca_bundle(api)


async def test_renewals_keep_admission_working_without_a_restart(
    control_plane: ControlPlane,
    api: client.ApiClient,
    tally_namespace: str,
    namespace: str,
    tally_log: Path,
    client_pair: tuple[Path, Path] | None,
    stopped: list[TallyProcess],
) -> None:
    # Serving certificates last 15 s (renewed every 10 s), the CA 45 s (renewed every 30 s,
    # serving certificates moving to the new CA 3 s later).
    tally = _tally(
        control_plane,
        tally_namespace,
        tally_log,
        TALLY_WEBHOOK_CERT_VALIDITY="15",
        TALLY_WEBHOOK_CA_VALIDITY="45",
        TALLY_WEBHOOK_CA_OVERLAP="3",
    )
    stopped.append(tally)
    await asyncio.to_thread(tally.start)
    assert tally.process is not None
    pid = tally.process.pid
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "q"}, "spec": {"hard": {"configmaps": "100000"}}}
    )
    await eventually(
        lambda: core.read_namespaced_resource_quota("q", namespace),
        until=lambda q: bool(q.status and q.status.used),
        what="status.used",
    )

    failures: list[str] = []
    created = 0

    async def create_continuously(until: float) -> None:
        nonlocal created
        while time.monotonic() < until:
            try:
                await core.create_namespaced_config_map(
                    namespace, {"metadata": {"name": f"c{created}"}}
                )
            except client.ApiException as error:
                failures.append(f"c{created}: {error.status} {error.body}")
            created += 1
            await asyncio.sleep(0.25)

    serials: set[int] = set()
    bundles: set[bytes] = set()

    async def watch_certificates(until: float) -> None:
        while time.monotonic() < until:
            served = await presented(tally.webhook_port, client_pair)
            serials.add(served.serial_number)
            bundles.add(await ca_bundle(api))
            await asyncio.sleep(0.5)

    until = time.monotonic() + 40
    await asyncio.gather(create_continuously(until), watch_certificates(until))

    assert [] == failures, tally.log_text()
    assert created > 50
    # Several serving certificates and at least two CAs were served by one process.
    assert len(serials) >= 3, tally.log_text()
    assert len(bundles) >= 2, tally.log_text()
    assert tally.running
    assert pid == tally.process.pid
    assert 1 == tally.starts

    # Everything agrees at the end: Secret, caBundle, what the port presents.
    _, data = await secret_data(api, tally_namespace)
    served = await presented(tally.webhook_port, client_pair)
    assert data["tls.crt"] == pem(served)
    assert data["ca.crt"] == await ca_bundle(api)
    # And every create was judged and charged (a quota, not just an open door).
    quota = await core.read_namespaced_resource_quota("q", namespace)
    assert int(quota.status.used["configmaps"]) >= created


def _nearly_expired(data: dict[str, bytes]) -> dict[str, bytes]:
    """``data`` with a serving certificate its own CA signed 364 days ago, valid one more day:
    due for renewal (a third of a year left is long past)."""
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    ca_key = serialization.load_pem_private_key(data["ca.key"], password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    old = x509.load_pem_x509_certificate(data["tls.crt"])
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nearly-expired")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=364))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value, False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return {
        **data,
        "tls.crt": pem(cert),
        "tls.key": key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    }


async def _replace_secret(api: client.ApiClient, namespace: str, data: dict[str, bytes]) -> None:
    core = client.CoreV1Api(api)
    secret = await core.read_namespaced_secret(SECRET, namespace)
    secret.data = {k: base64.b64encode(v).decode() for k, v in data.items()}
    await core.replace_namespaced_secret(SECRET, namespace, secret)


async def test_a_replaced_secret_is_noticed_and_renewed(
    control_plane: ControlPlane,
    api: client.ApiClient,
    tally_namespace: str,
    namespace: str,
    tally_log: Path,
    client_pair: tuple[Path, Path] | None,
    stopped: list[TallyProcess],
) -> None:
    # The periodic re-read is an hour away: only the Secret's watch event can make tally look.
    tally = _tally(
        control_plane, tally_namespace, tally_log, TALLY_WEBHOOK_CERT_CHECK_PERIOD="3600"
    )
    stopped.append(tally)
    await asyncio.to_thread(tally.start)
    _, original = await secret_data(api, tally_namespace)
    bundle = await ca_bundle(api)

    # 1. A nearly expired pair from the same CA: renewed, served, caBundle unchanged.
    planted = _nearly_expired(original)
    await _replace_secret(api, tally_namespace, planted)

    async def current() -> tuple[dict[str, bytes], x509.Certificate]:
        return (await secret_data(api, tally_namespace))[1], await presented(
            tally.webhook_port, client_pair
        )

    data, served = await eventually(
        current,
        until=lambda found: (
            found[0]["tls.crt"] not in (planted["tls.crt"], original["tls.crt"])
            and found[0]["tls.crt"] == pem(found[1])
        ),
        within=20,
        what="tally renewing the nearly expired certificate and serving the new one",
    )
    left = served.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert left > datetime.timedelta(days=360)
    assert original["ca.crt"] == data["ca.crt"]
    assert bundle == await ca_bundle(api)

    # 2. Content that cannot be used: replaced by what tally serves (no new CA, no switch).
    await _replace_secret(api, tally_namespace, {"tls.crt": b"garbage", "tls.key": b"junk"})
    data, _ = await eventually(
        current,
        until=lambda found: found[0].get("tls.crt") == pem(found[1]),
        within=20,
        what="tally writing the certificate it serves back into the Secret",
    )
    assert pem(served) == data["tls.crt"]
    assert bundle == data["ca.crt"] == await ca_bundle(api)

    # Admission works throughout.
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": "after"}})
    assert tally.running
    assert 1 == tally.starts


# -- files someone else renews (TALLY_WEBHOOK_CERT_MOUNT, the cert-manager overlay)


class Mount:
    """A directory laid out as the kubelet mounts a Secret: each key a symlink into ``..data``,
    itself a symlink to a timestamped directory that an update replaces in one rename."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.generation = 0
        directory.mkdir(parents=True)

    def write(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        version = self.directory / f"..v{self.generation}"
        version.mkdir()
        for name, data in files.items():
            (version / name).write_bytes(data)
        link = self.directory / "..data_tmp"
        link.symlink_to(version.name)
        link.rename(self.directory / "..data")
        for name in files:
            if not (self.directory / name).is_symlink():
                (self.directory / name).symlink_to(f"..data/{name}")


def _issued(hosts: list[str], ca: tuple[x509.Certificate, Any] | None = None) -> dict[str, Any]:
    """What cert-manager's CA Issuer writes: ca.crt (the CA), tls.crt, tls.key; and the CA."""
    now = datetime.datetime.now(datetime.UTC)
    if ca is None:
        ca = certs.new_ca(now, datetime.timedelta(days=5 * 365))
    cert, key = certs.new_serving_certificate(ca[0], ca[1], hosts, now, datetime.timedelta(days=90))
    material = certs.Material(cas=(ca[0],), ca_key=None, cert=cert, key=key)
    return {"files": material.secret_data(), "ca": ca, "cert": cert}


async def test_mounted_files_are_served_and_followed(
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    tally_log: Path,
    tmp_path: Path,
    client_pair: tuple[Path, Path] | None,
    stopped: list[TallyProcess],
) -> None:
    mount = Mount(tmp_path / "mounted")
    first = _issued(["127.0.0.1"])
    mount.write(first["files"])
    tally = TallyProcess(
        control_plane.kubeconfig,
        tally_log,
        bin_dir=control_plane.bin_dir,
        env={
            "TALLY_WEBHOOK_CERT_MOUNT": str(mount.directory),
            "TALLY_WEBHOOK_CERT_CHECK_PERIOD": "1",
        },
    )
    stopped.append(tally)
    await asyncio.to_thread(tally.start)
    assert pem(first["cert"]) == pem(await presented(tally.webhook_port, client_pair))
    assert first["files"]["ca.crt"] == await ca_bundle(api)

    core = client.CoreV1Api(api)
    failures: list[str] = []
    created = 0

    async def create_for(seconds: float) -> None:
        nonlocal created
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            try:
                await core.create_namespaced_config_map(
                    namespace, {"metadata": {"name": f"c{created}"}}
                )
            except client.ApiException as error:
                failures.append(f"c{created}: {error.status} {error.body}")
            created += 1
            await asyncio.sleep(0.25)

    async def serving(cert: x509.Certificate) -> bool:
        return pem(cert) == pem(await presented(tally.webhook_port, client_pair))

    # The issuer renews the serving certificate (same CA): served within a check period, the
    # caBundle unchanged.
    renewed = _issued(["127.0.0.1"], first["ca"])
    mount.write(renewed["files"])
    await asyncio.gather(
        create_for(4),
        eventually(lambda: serving(renewed["cert"]), until=bool, within=10, what="renewal"),
    )
    assert first["files"]["ca.crt"] == await ca_bundle(api)

    # The CA renews (ca.crt and tls.crt change together, as cert-manager's do): tally publishes
    # both CAs before presenting the new certificate, then only the new CA.
    rotated = _issued(["127.0.0.1"])
    mount.write(rotated["files"])
    await asyncio.gather(
        create_for(8),
        eventually(lambda: serving(rotated["cert"]), until=bool, within=15, what="new CA"),
    )
    await eventually(
        lambda: ca_bundle(api),
        until=lambda bundle: bundle == rotated["files"]["ca.crt"],
        what="the caBundle naming the new CA only",
    )
    assert [] == failures, tally.log_text()
    assert created > 20
    assert 1 == tally.starts
    assert tally.running
    assert "ca.key" not in {p.name for p in mount.directory.iterdir()}  # never written to
