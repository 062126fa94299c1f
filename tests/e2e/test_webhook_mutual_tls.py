"""Mutual TLS on tally's webhook: only the API server gets answers.

tally's quota admission writes quota status (reservations), so an AdmissionReview forged and
POSTed straight to the webhook port could use up a namespace's quota. The ``operator`` fixture
runs tally with ``TALLY_WEBHOOK_CLIENT_CA``: the CA of the client certificate this control
plane's API server presents to webhooks (``hack/cluster.py``, operator mode).

* A forged review (a well-formed CREATE of a pod in a namespace with a quota) sent without a
  client certificate is refused in the TLS handshake, as is one with a client certificate from
  another CA (named like the API server's); the quota's ``status.used`` does not move.
* Requests through the API server are judged as usual: allowed, then denied over quota.
* The control: a forged review with the API server's own certificate is answered and charged,
  so the refusals above are what kept the quota unchanged.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from forged_reviews import QUOTA_WEBHOOK, Refused, post, review, webhook_url_and_ca
from kubernetes_asyncio import client

from builders import pod
from tally_e2e import RunningOperator, eventually, wait_for_root_ca_configmap


def _other_ca_client(directory: Path) -> tuple[Path, Path]:
    """A client certificate like the API server's (same name, clientAuth), from another CA."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tally-local-webhook-client-ca")])
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-webhook-client")])
        )
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
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


async def _used(api: client.ApiClient, namespace: str) -> dict[str, str]:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota("q", namespace)
    return dict((quota.status and quota.status.used) or {})


async def test_only_the_api_servers_certificate_gets_an_answer(
    operator: RunningOperator, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    assert operator.webhook_client is not None, "the operator fixture runs with mutual TLS"
    # The quota counts configmaps: kube-controller-manager's own must be there before the
    # baseline is read, or it lands during the test (seen once in CI).
    await wait_for_root_ca_configmap(api, namespace)
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(
        namespace,
        {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "1", "configmaps": "100"}}},
    )
    before = await eventually(
        lambda: _used(api, namespace),
        until=lambda used: used.get("pods") == "0" and "configmaps" in used,
        what="the quota's status.used",
    )
    url, ca_pem = await webhook_url_and_ca(api)

    # 1. Forged: no client certificate, or one from another CA. Refused in the handshake.
    for client_pair in (None, _other_ca_client(tmp_path / "other")):
        with pytest.raises(Refused):
            await post(
                url,
                ca_pem,
                client_pair,
                review(namespace, pod("forged", with_kind=True), "pods", "Pod"),
            )
    await asyncio.sleep(1.0)  # time for a reservation to show, had one been made
    assert before == await _used(api, namespace)

    # 2. Through the API server: judged as usual.
    await core.create_namespaced_pod(namespace, pod("real", with_kind=True))
    with pytest.raises(client.ApiException) as denied:
        await core.create_namespaced_pod(namespace, pod("over", with_kind=True))
    assert 403 == denied.value.status
    assert json.loads(denied.value.body)["message"] == (
        f'admission webhook "{QUOTA_WEBHOOK}" denied the request: exceeded quota: q, '
        "requested: pods=1, used: pods=1, limited: pods=1"
    )

    # 3. The control: the API server's certificate gets the same kind of forged review
    # answered, and a configmap (within quota) charged — what the refusals prevented.
    charged = await _used(api, namespace)
    answer = await post(
        url,
        ca_pem,
        operator.webhook_client,
        review(namespace, {"metadata": {"name": "forged"}}, "configmaps", "ConfigMap"),
    )
    assert answer["allowed"] is True, answer
    after = await _used(api, namespace)
    assert int(charged["configmaps"]) + 1 == int(after["configmaps"])
