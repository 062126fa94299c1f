"""Another validating webhook beside tally's, as every real cluster has (a policy engine).

:class:`PolicyWebhook` serves HTTPS on loopback from the test's own event loop and refuses
every request the API server sends it; its configuration's ``objectSelector`` decides which
requests those are (objects labelled ``deny: "true"`` by default) and its ``rules`` which
kinds and operations. The API server calls it in parallel with tally's webhook, so tally has
already charged a request when this one refuses it: the case upstream's quota plugin, which
runs last in the admission chain, never meets.

With ``allow=True`` and a ``delay`` it is a slow policy that admits (an image scanner, a
signature check): the API server stores the object only once it answered, ``delay`` seconds
after tally judged it.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ssl
import tempfile
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from aiohttp import web
from kubernetes_asyncio import client

from tally.webhook import certs

REFUSAL: Final = "refused by the e2e policy"


def loopback_tls() -> tuple[ssl.SSLContext, certs.Material]:
    """A server context for 127.0.0.1, with a CA of its own (``material.ca_bundle``)."""
    material = certs.new_material(["127.0.0.1"], datetime.datetime.now(datetime.UTC))
    directory = Path(tempfile.mkdtemp(prefix="tally-test-tls-"))
    (directory / "tls.crt").write_bytes(material.cert_pem)
    (directory / "tls.key").write_bytes(material.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    return context, material


class PolicyWebhook:
    """``async with PolicyWebhook(api, namespace, rules) as policy:`` registers it for one
    namespace; leaving the block deletes the configuration and stops the server."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        rules: list[dict[str, Any]],
        *,
        labels: dict[str, str] | None = None,
        allow: bool = False,
        delay: float = 0.0,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.rules = rules
        self.labels = labels if labels is not None else {"deny": "true"}
        self.allow = allow
        self.delay = delay
        self.name = f"e2e-policy-{uuid.uuid4().hex[:8]}"
        self.refused: list[dict[str, Any]] = []
        """The AdmissionReview requests refused so far."""
        self.allowed: list[dict[str, Any]] = []
        """The AdmissionReview requests allowed so far (``allow=True``)."""
        self._runner: web.AppRunner | None = None

    async def _review(self, request: web.Request) -> web.Response:
        review = await request.json()
        if self.delay:
            await asyncio.sleep(self.delay)
        (self.allowed if self.allow else self.refused).append(review["request"])
        answer: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": self.allow}
        if not self.allow:
            answer["status"] = {"code": 403, "message": REFUSAL}
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
        )

    async def __aenter__(self) -> PolicyWebhook:
        context, material = loopback_tls()
        app = web.Application()
        app.add_routes([web.post("/validate", self._review)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = self._runner.addresses[0][1]
        await client.AdmissionregistrationV1Api(self.api).create_validating_webhook_configuration(
            {
                "metadata": {"name": self.name},
                "webhooks": [
                    {
                        "name": "policy.e2e.tally.dev",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Fail",
                        "timeoutSeconds": 5,
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{port}/validate",
                            "caBundle": _b64(material.ca_bundle),
                        },
                        "rules": self.rules,
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                        },
                        "objectSelector": {"matchLabels": self.labels},
                    }
                ],
            }
        )
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await client.AdmissionregistrationV1Api(
                self.api
            ).delete_validating_webhook_configuration(self.name)
        finally:
            if self._runner is not None:
                await self._runner.cleanup()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
