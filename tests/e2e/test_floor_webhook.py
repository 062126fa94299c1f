"""The floor webhook (``hack/floor``), which ``bench/admission.py`` measures tally against: it
builds, and it answers AdmissionReviews allowed over mutual TLS, as tally's webhook runs.

* Built into the cache by ``hack/floor.py`` (a few seconds; nothing when it is there).
* A review posted with this control plane's own webhook client certificate is answered allowed
  under the request's uid; without a client certificate the TLS handshake refuses it.
* Registered for pod creates in one namespace (tally's failurePolicy ``Fail``), the API server
  calls it over mutual TLS: pod creates there succeed, which they would not if the answer's uid
  differed from the request's or the handshake failed, and the floor counted them.
"""

from __future__ import annotations

import base64
import datetime
import json
import queue
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

import cluster
import floor
from tally.webhook.certs import new_material
from tally_e2e import ControlPlane

CONFIGURATION = "floor-e2e.tally.dev"
IMAGE = "registry.example/app:1"


@dataclass
class Floor:
    process: subprocess.Popen[str]
    url: str
    ca_pem: bytes
    api_server_client: tuple[Path, Path]
    first_review: threading.Event

    def stop(self) -> str:
        """Stop it; its report on stderr (reviews answered)."""
        self.process.terminate()
        _, stderr = self.process.communicate(timeout=10)
        return stderr


@pytest.fixture
def floor_webhook(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Floor]:
    binary = floor.ensure_floor()
    pki = cluster.webhook_client_pki(control_plane.kubeconfig.parent)
    assert pki is not None, "an operator-mode control plane presents a webhook client certificate"
    material = new_material(["127.0.0.1"], datetime.datetime.now(datetime.UTC))
    (tmp_path / "tls.crt").write_bytes(material.cert_pem)
    (tmp_path / "tls.key").write_bytes(material.key_pem)
    process = subprocess.Popen(
        [str(binary), "-listen", "127.0.0.1:0", "-cert", str(tmp_path / "tls.crt"),
         "-key", str(tmp_path / "tls.key"), "-client-ca", str(pki.ca)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    first_review = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("first review"):
                first_review.set()
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    line = lines.get(timeout=30)
    assert line.startswith("serving on https://127.0.0.1:"), line
    webhook = Floor(
        process,
        line.removeprefix("serving on ").strip() + "/validate",
        material.ca_bundle,
        (pki.cert, pki.key),
        first_review,
    )
    try:
        yield webhook
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _review(uid: str) -> dict[str, Any]:
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"}}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": "p", "namespace": "n", "operation": "CREATE",
            "userInfo": {"username": "someone"}, "object": pod, "oldObject": None,
            "dryRun": False,
        },
    }  # fmt: skip


def _post(webhook: Floor, review: dict[str, Any], client_pair: tuple[Path, Path] | None) -> Any:
    context = ssl.create_default_context(cadata=webhook.ca_pem.decode())
    if client_pair is not None:
        context.load_cert_chain(*client_pair)
    request = urllib.request.Request(
        webhook.url,
        data=json.dumps(review).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, context=context, timeout=15) as response:
        return json.loads(response.read())


def test_answers_the_api_servers_certificate_and_refuses_no_certificate(
    floor_webhook: Floor,
) -> None:
    uid = str(uuid.uuid4())

    answer = _post(floor_webhook, _review(uid), floor_webhook.api_server_client)

    assert {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": True},
    } == answer
    # With TLS 1.3 the server's refusal of a missing certificate may come after the client's
    # side of the handshake, as an alert on the first read.
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _post(floor_webhook, _review(str(uuid.uuid4())), None)
    report = floor_webhook.stop()
    assert "floor: 1 reviews allowed" in report, report


async def test_the_api_server_calls_it_over_mutual_tls(
    floor_webhook: Floor, api: client.ApiClient, namespace: str
) -> None:
    registrations = client.AdmissionregistrationV1Api(api)
    core = client.CoreV1Api(api)
    await registrations.create_validating_webhook_configuration(
        {
            "metadata": {"name": CONFIGURATION},
            "webhooks": [
                {
                    "name": CONFIGURATION,
                    "clientConfig": {
                        "url": floor_webhook.url,
                        "caBundle": base64.b64encode(floor_webhook.ca_pem).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                            "operations": ["CREATE"],
                            "scope": "Namespaced",
                        }
                    ],
                    "failurePolicy": "Fail",
                    "sideEffects": "NoneOnDryRun",
                    "timeoutSeconds": 10,
                    "admissionReviewVersions": ["v1"],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                }
            ],
        }
    )
    try:
        # The API server picks up a new registration within moments; dry-run creates (which a
        # NoneOnDryRun webhook is called for) until the floor has seen one.
        for attempt in range(100):
            pod = {"metadata": {"name": f"probe-{attempt}"},
                   "spec": {"containers": [{"name": "a", "image": IMAGE}]}}  # fmt: skip
            await core.create_namespaced_pod(namespace, pod, dry_run="All")
            if floor_webhook.first_review.wait(0.2):
                break
        assert floor_webhook.first_review.is_set(), "the API server never called the floor"
        for index in range(3):
            pod = {"metadata": {"name": f"p{index}"},
                   "spec": {"containers": [{"name": "a", "image": IMAGE}]}}  # fmt: skip
            await core.create_namespaced_pod(namespace, pod)
    finally:
        await registrations.delete_validating_webhook_configuration(CONFIGURATION)
    report = floor_webhook.stop()
    allowed = int(report.split("floor: ")[1].split()[0])
    assert allowed >= 4, report  # the probe that was seen and the three creates
    assert ", 0 bad requests" in report, report
