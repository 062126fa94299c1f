"""tally.webhook.server: tally's own admission endpoint over TLS on loopback.

What the API server sees for each kind of answer: a verdict in an AdmissionReview (allowed, or
refused with a code and message), a 400 naming what is wrong with a body that is no
AdmissionReview, a 404 for a path no webhook serves, and a refusal (never an allow) when a
handler fails.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from policy_webhook import loopback_tls

from tally.admission.attributes import Attributes
from tally.admission.errors import AdmissionDenied
from tally.webhook.server import WebhookServer, podset_review, quota_review

pytestmark = pytest.mark.unit


def _review(obj: dict[str, Any], *, resource: str = "pods", group: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "resource": {"group": group, "version": "v1", "resource": resource},
            "namespace": "ns",
            "name": obj["metadata"]["name"],
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": obj,
            "dryRun": False,
        },
    }


class Client:
    def __init__(self, base: str, context: ssl.SSLContext) -> None:
        self.base = base
        self.context = context

    async def post(self, path: str, body: bytes) -> tuple[int, str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.base + path, data=body, ssl=self.context) as response,
        ):
            text = await response.text()
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                parsed = None
            return response.status, str(response.reason), parsed


@pytest.fixture
async def served() -> AsyncIterator[tuple[Client, list[Attributes]]]:
    context, material = loopback_tls()
    seen: list[Attributes] = []

    async def admit(attributes: Attributes) -> None:
        seen.append(attributes)
        if attributes.name == "denied":
            raise AdmissionDenied(403, "exceeded quota: q, requested: pods=1")
        if attributes.name == "broken":
            raise RuntimeError("boom")

    server = WebhookServer(
        {"quota": quota_review(admit), "validate-podsets": podset_review},
        addr="127.0.0.1",
        port=0,
        context=context,
    )
    await server.start()
    assert server._runner is not None
    port = server._runner.addresses[0][1]
    client_context = ssl.create_default_context(cadata=material.ca_bundle.decode())
    try:
        yield Client(f"https://127.0.0.1:{port}", client_context), seen
    finally:
        await server.stop()


async def test_an_allowed_request(served: tuple[Client, list[Attributes]]) -> None:
    client, seen = served
    status, _, body = await client.post(
        "/quota", json.dumps(_review({"metadata": {"name": "p"}})).encode()
    )
    assert 200 == status
    assert {"uid": "u-1", "allowed": True} == body["response"]
    assert ("ns", "p", "CREATE") == (seen[0].namespace, seen[0].name, seen[0].operation)


async def test_a_refusal_carries_code_and_message(served: tuple[Client, list[Attributes]]) -> None:
    client, _ = served
    status, _, body = await client.post(
        "/quota", json.dumps(_review({"metadata": {"name": "denied"}})).encode()
    )
    assert 200 == status
    assert {
        "uid": "u-1",
        "allowed": False,
        "status": {"code": 403, "message": "exceeded quota: q, requested: pods=1"},
    } == body["response"]


async def test_a_failing_handler_refuses(served: tuple[Client, list[Attributes]]) -> None:
    client, _ = served
    status, _, body = await client.post(
        "/quota", json.dumps(_review({"metadata": {"name": "broken"}})).encode()
    )
    assert 200 == status
    assert (False, 500, "tally failed: boom") == (
        body["response"]["allowed"],
        body["response"]["status"]["code"],
        body["response"]["status"]["message"],
    )


async def test_no_review_is_a_400_naming_the_problem(
    served: tuple[Client, list[Attributes]],
) -> None:
    client, seen = served
    status, reason, body = await client.post("/quota", b"{")
    assert (400, None) == (status, body)
    assert "the body is not JSON" in reason
    assert [] == seen


async def test_an_unknown_path_is_a_404(served: tuple[Client, list[Attributes]]) -> None:
    client, _ = served
    status, _, _ = await client.post(
        "/mutate", json.dumps(_review({"metadata": {"name": "p"}})).encode()
    )
    assert 404 == status


async def test_an_invalid_podset_is_a_422(served: tuple[Client, list[Attributes]]) -> None:
    client, _ = served
    podset = {"metadata": {"name": "web"}, "spec": {"replicas": -1}}
    status, _, body = await client.post(
        "/validate-podsets",
        json.dumps(_review(podset, resource="podsets", group="tally.dev")).encode(),
    )
    assert 200 == status
    assert (False, 422) == (body["response"]["allowed"], body["response"]["status"]["code"])
    assert body["response"]["status"]["message"].startswith('PodSet.tally.dev "web" is invalid: ')
    assert "spec.replicas" in body["response"]["status"]["message"]
