"""AdmissionReviews sent straight to tally's webhook, as anything that reaches its port could
send them: forged ones (the tests of mutual TLS), the same bytes twice (a retried call), and
where to send them (the address and CA tally's webhook configuration names).
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

QUOTA_WEBHOOK = "quota.tally.dev"


def review(
    namespace: str,
    obj: dict[str, Any],
    resource: str = "pods",
    kind: str = "Pod",
    *,
    group: str = "",
    version: str = "v1",
    dry_run: bool = False,
    user: str = "mallory",
) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for a CREATE: the object's namespace
    filled in from the request path and its uid set, as the API server does before validating
    admission."""
    obj = {
        **obj,
        "metadata": {"uid": str(uuid.uuid4()), **obj["metadata"], "namespace": namespace},
    }
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": resource}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": obj["metadata"]["name"],
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


class Refused(Exception):
    """The connection failed below HTTP (no response at all)."""


async def post(
    url: str, ca_pem: str, client_pair: tuple[Path, Path] | None, body: dict[str, Any] | bytes
) -> dict[str, Any]:
    """POST a review (``body``: the review, or its exact bytes) to the webhook; the answer's
    ``response``, or :class:`Refused`."""
    context = ssl.create_default_context(cadata=ca_pem)
    if client_pair is not None:
        context.load_cert_chain(*client_pair)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url,
                data=data,
                headers={"Content-Type": "application/json"},
                ssl=context,
                timeout=aiohttp.ClientTimeout(total=15),
            ) as response,
        ):
            assert 200 == response.status, await response.text()
            answer = await response.json()
    except (aiohttp.ClientConnectionError, ssl.SSLError) as error:
        raise Refused(repr(error)) from error
    return dict(answer["response"])


async def webhook_url_and_ca(
    api: client.ApiClient, configuration: str = "tally.dev"
) -> tuple[str, str]:
    """The quota webhook's URL and the CA its caBundle holds."""
    response = await client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
        configuration, _preload_content=False
    )
    found = json.loads(await response.read())
    (quota,) = [w for w in found["webhooks"] if w["name"] == QUOTA_WEBHOOK]
    config = quota["clientConfig"]
    return config["url"], base64.b64decode(config["caBundle"]).decode()
