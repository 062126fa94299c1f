"""Bad input to quota admission: tally answers with a clear error, never crashes, and never
allows what a valid quota would deny.

Three kinds of bad input, each followed by a check that the operator process still runs, that
its liveness endpoint answers and that its webhook still judges a well-formed request:

* an AdmissionReview that cannot be parsed (garbage, truncated JSON, JSON that is not an
  AdmissionReview), POSTed straight to tally's webhook URL (read, with its CA, from the
  ValidatingWebhookConfiguration tally registered) with the API server's client certificate
  (tally requires it: mutual TLS);
* an AdmissionReview for a resource that does not exist;
* a quota whose status holds a value tally cannot use. The API server refuses a status that
  does not parse as a quantity at all (checked here), so the reachable cases are (1) a value the
  API server accepts but tally refuses to compute with (magnitudes of 10**64 and more, see
  ``tally.quota.quantity``), written through the status subresource, and (2) an AdmissionReview,
  sent straight to the webhook, whose object carries an unparseable quantity while the cache
  holds a valid quota.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import ssl
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from forged_reviews import review
from kubernetes_asyncio import client

from builders import pod, resource_quota
from tally_e2e import RunningOperator, eventually, wait_for_default_service_account

WEBHOOK_CONFIGURATION = "tally.dev"
QUOTA_WEBHOOK = "quota.tally.dev"
DENIED = f'admission webhook "{QUOTA_WEBHOOK}" denied the request: '
TOO_LARGE_FOR_TALLY = "1e64"
"""The smallest magnitude ``tally.quota.quantity`` refuses (``MAX_DECIMAL_EXPONENT``); upstream's
``resource.ParseQuantity`` accepts it, and so does the API server's validation."""


# --------------------------------------------------------------------------------------------
# Talking to the webhook directly


class Webhook:
    """tally's quota webhook as registered: its URL and the CA that signed its certificate."""

    def __init__(self, url: str, ca_pem: str, client_pair: tuple[Path, Path] | None) -> None:
        self.url = url
        self.context = ssl.create_default_context(cadata=ca_pem)
        if client_pair is not None:
            # The webhook requires the API server's client certificate (mutual TLS): this test
            # speaks as the API server would, with malformed content.
            self.context.load_cert_chain(*client_pair)

    async def post(
        self, payload: bytes, *, path: str | None = None
    ) -> tuple[int, str, dict[str, Any] | None]:
        """POST ``payload``; (HTTP status, reason + body text, the JSON body if it is JSON)."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                path or self.url,
                data=payload,
                headers={"Content-Type": "application/json"},
                ssl=self.context,
                timeout=aiohttp.ClientTimeout(total=15),
            ) as response,
        ):
            text = await response.text()
            try:
                body = json.loads(text)
            except ValueError:
                body = None
            return response.status, f"{response.reason}: {text}", body

    async def review(self, review: dict[str, Any]) -> dict[str, Any]:
        """Send a well-formed AdmissionReview; the ``response`` part of tally's answer."""
        status, text, body = await self.post(json.dumps(review).encode())
        assert status == 200, text
        assert body is not None
        assert body["response"]["uid"] == review["request"]["uid"]
        return dict(body["response"])


async def _webhook(api: client.ApiClient, operator: RunningOperator) -> Webhook:
    response = await client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
        WEBHOOK_CONFIGURATION, _preload_content=False
    )
    configuration = json.loads(await response.read())
    (quota,) = [w for w in configuration["webhooks"] if w["name"] == QUOTA_WEBHOOK]
    config = quota["clientConfig"]
    assert config["url"].startswith("https://127.0.0.1:")
    return Webhook(
        config["url"], base64.b64decode(config["caBundle"]).decode(), operator.webhook_client
    )


def _review(
    namespace: str,
    obj: dict[str, Any],
    *,
    group: str = "",
    version: str = "v1",
    resource: str = "pods",
    kind: str = "Pod",
    dry_run: bool = False,
) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for a CREATE."""
    return review(
        namespace, obj, resource, kind, group=group, version=version, dry_run=dry_run,
        user="e2e-bad-input",
    )  # fmt: skip


_pod = functools.partial(pod, requests={"cpu": "100m"}, with_kind=True)


# --------------------------------------------------------------------------------------------
# Shared checks


async def _still_serving(operator: RunningOperator, webhook: Webhook, namespace: str) -> None:
    """The process runs, its liveness answers, and its webhook judges a well-formed request."""
    assert operator.process.poll() is None, operator.log_text()[-3000:]

    def live() -> int:
        with urllib.request.urlopen(operator.liveness_url, timeout=5) as response:
            return int(response.status)

    assert await asyncio.to_thread(live) == 200
    # Dry-run: judged like any request, never charged (no side effect on the quotas).
    probe = _pod(f"probe-{uuid.uuid4().hex[:6]}")
    answer = await webhook.review(_review(namespace, probe, dry_run=True))
    assert answer["allowed"] is True, answer


async def _quota(
    api: client.ApiClient, namespace: str, hard: dict[str, str], *, name: str = "q"
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(namespace, resource_quota(name, hard))

    async def status() -> dict[str, Any]:
        quota = await core.read_namespaced_resource_quota(name, namespace)
        return dict(api.sanitize_for_serialization(quota).get("status") or {})

    await eventually(
        status,
        until=lambda s: set(s.get("hard") or {}) == set(hard) and set(s.get("used") or {}),
        within=10,
        what="the quota's status",
    )


# --------------------------------------------------------------------------------------------
# (a) an AdmissionReview that cannot be parsed

NOT_JSON = [
    pytest.param(b"not json at all{", id="garbage"),
    pytest.param(b"", id="empty"),
    pytest.param(b'{"apiVersion": "admission.k8s.io/v1", "kind": "Admiss', id="truncated"),
]
NOT_A_REVIEW = [
    pytest.param(b"\x00\xff\xfe garbage", id="not-utf8"),
    pytest.param(b"[]", id="array"),
    pytest.param(b'"AdmissionReview"', id="string"),
    pytest.param(b"{}", id="empty-object"),
    pytest.param(
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', id="no-request"
    ),
    pytest.param(b'{"request": {"uid": "x", "operation": "CREATE"}}', id="no-resource"),
]


@pytest.mark.parametrize("payload", NOT_JSON)
async def test_unparseable_review_is_a_clear_400_and_tally_keeps_serving(
    operator: RunningOperator, api: client.ApiClient, namespace: str, payload: bytes
) -> None:
    webhook = await _webhook(api, operator)
    status, text, body = await webhook.post(payload)
    assert status == 400, text
    # Not an AdmissionReview at all, so certainly not one that allows something.
    assert body is None, text
    # The JSON decoder's own words (Kopf puts them in the reason).
    assert "Expecting value" in text or "Unterminated string" in text, text
    await _still_serving(operator, webhook, namespace)


@pytest.mark.parametrize("payload", NOT_A_REVIEW)
async def test_input_that_is_no_admission_review_is_refused_and_tally_keeps_serving(
    operator: RunningOperator, api: client.ApiClient, namespace: str, payload: bytes
) -> None:
    webhook = await _webhook(api, operator)
    status, text, body = await webhook.post(payload)
    # An error status: the API server then applies failurePolicy Fail, so nothing is admitted.
    assert status >= 400, text
    assert not (body and (body.get("response") or {}).get("allowed")), text
    await _still_serving(operator, webhook, namespace)


@pytest.mark.parametrize("payload", NOT_A_REVIEW)
async def test_input_that_is_no_admission_review_gets_a_clear_4xx(
    operator: RunningOperator, api: client.ApiClient, payload: bytes
) -> None:
    webhook = await _webhook(api, operator)
    status, text, _ = await webhook.post(payload)
    assert status == 400, text
    assert "Server got itself in trouble" not in text, text
    # The reason names what is wrong with the body.
    assert "not UTF-8" in text or "not an admission.k8s.io/v1 AdmissionReview" in text, text


async def test_review_without_user_info_or_object_is_refused(
    operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    webhook = await _webhook(api, operator)
    review = _review(namespace, _pod("p"))
    del review["request"]["userInfo"]
    status, text, _ = await webhook.post(json.dumps(review).encode())
    assert status == 400, text
    assert "request.userInfo: Field required" in text, text
    review = _review(namespace, _pod("p"))
    review["request"]["object"] = None
    status, text, _ = await webhook.post(json.dumps(review).encode())
    assert status == 400, text
    assert "request.object and request.oldObject are both missing" in text, text
    await _still_serving(operator, webhook, namespace)


# --------------------------------------------------------------------------------------------
# (b) an object of an unknown kind


async def test_review_for_a_resource_kopf_does_not_know_is_judged_like_any_object_count(
    operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    # Kopf answers 404 for a resource it has not discovered (right after a CRD appears, its
    # CRD watch may lag tally's webhook rules). tally then judges the request itself, as
    # upstream's plugin judges any resource: an object count, allowed when no quota names it,
    # refused past a quota that does.
    webhook = await _webhook(api, operator)
    obj = {
        "apiVersion": "nowhere.tally.dev/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": namespace},
        "spec": {},
    }
    review = _review(
        namespace, obj, group="nowhere.tally.dev", version="v1", resource="widgets", kind="Widget"
    )
    answer = await webhook.review(review)
    assert answer["allowed"] is True, answer

    # A quota naming it: the resource does not exist, so no usage is ever computed and
    # admission refuses with upstream's "status unknown" (never a silent allow).
    core = client.CoreV1Api(api)
    name = "count/widgets.nowhere.tally.dev"
    await core.create_namespaced_resource_quota(namespace, resource_quota("q", {name: "5"}))

    async def hard() -> dict[str, Any]:
        quota = await core.read_namespaced_resource_quota("q", namespace)
        return dict((api.sanitize_for_serialization(quota).get("status") or {}).get("hard") or {})

    await eventually(hard, until=lambda h: name in h, within=10, what="status.hard")
    # Another request (a new uid): the same bytes again would be a retry, answered as before.
    review = _review(
        namespace, obj, group="nowhere.tally.dev", version="v1", resource="widgets", kind="Widget"
    )
    answer = await webhook.review(review)
    assert answer["allowed"] is False, answer
    assert answer["status"]["code"] == 403, answer
    assert answer["status"]["message"] == f"status unknown for quota: q, resources: {name}", answer
    await _still_serving(operator, webhook, namespace)


async def test_pod_review_whose_object_is_not_a_pod_is_refused_with_a_message(
    operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    # The resource is pods and a quota charges pods, but the object is something else: tally
    # cannot compute its usage, so it must refuse (500, upstream's code for evaluation errors),
    # not allow it uncharged.
    await _quota(api, namespace, {"pods": "10", "requests.cpu": "10"})
    webhook = await _webhook(api, operator)
    obj = {"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": "nonsense"}
    answer = await webhook.review(_review(namespace, obj))
    assert answer["allowed"] is False, answer
    assert answer["status"]["code"] == 500, answer
    assert answer["status"]["message"] == "spec: expected an object, got str", answer
    await _still_serving(operator, webhook, namespace)


# --------------------------------------------------------------------------------------------
# (c) a quota with an unparseable value


async def test_api_server_refuses_a_quota_status_that_is_no_quantity(
    operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    """Why the other tests of (c) use a value the API server does accept."""
    await _quota(api, namespace, {"pods": "1"})
    core = client.CoreV1Api(api)
    with pytest.raises(client.ApiException) as refused:
        await core.patch_namespaced_resource_quota_status(
            "q",
            namespace,
            {"status": {"used": {"pods": "abc"}}},
            _content_type="application/merge-patch+json",
        )
    assert refused.value.status == 422, refused.value.body
    assert "quantities must match the regular expression" in str(refused.value.body)


async def test_quota_status_tally_cannot_compute_never_allows_what_a_valid_quota_denies(
    operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    await _quota(api, namespace, {"pods": "1"})
    await core.create_namespaced_pod(namespace, _pod("first"))  # the quota is now full
    # A used value that the API server stores (canonically, as 10e63) but tally refuses to
    # compute with. Status-only changes do not trigger a recalculation (upstream does the
    # same), so tally's cache keeps it until the next full resync.
    response = await core.patch_namespaced_resource_quota_status(
        "q",
        namespace,
        {"status": {"used": {"pods": TOO_LARGE_FOR_TALLY}}},
        _content_type="application/merge-patch+json",
        _preload_content=False,
    )
    stored = json.loads(await response.read())["status"]["used"]["pods"]
    assert stored == "10e63"
    await asyncio.sleep(1.0)  # the MODIFIED event reaches tally's cache

    # Through the API server: a valid quota (1 of 1 used) denies; so must tally, and say why.
    with pytest.raises(client.ApiException) as refused:
        await core.create_namespaced_pod(namespace, _pod("second"))
    message = json.loads(refused.value.body)["message"]
    assert message == DENIED + (
        f"quota q: status.used[pods]: cannot parse quantity '{stored}': magnitude of 10**64 or more"
    )
    assert refused.value.status == 500

    # Straight to the webhook: the same refusal.
    webhook = await _webhook(api, operator)
    answer = await webhook.review(_review(namespace, _pod("third")))
    assert answer["allowed"] is False, answer
    assert answer["status"]["code"] == 500, answer
    assert f"'{stored}'" in answer["status"]["message"], answer

    pods = await core.list_namespaced_pod(namespace)
    assert [pod.metadata.name for pod in pods.items] == ["first"]
    assert operator.process.poll() is None
    # A namespace without the broken quota is still served.
    other = await _other_namespace(api)
    try:
        await _still_serving(operator, webhook, other)
    finally:
        await core.delete_namespace(other)


async def test_review_with_an_unparseable_quantity_is_refused_not_allowed(
    operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    # The API server never sends this (it cannot decode the pod), but a webhook must not trust
    # that: with a valid quota on requests.cpu in the cache, a pod whose request does not parse
    # must be refused with a message naming the value.
    await _quota(api, namespace, {"requests.cpu": "1"})
    webhook = await _webhook(api, operator)
    answer = await webhook.review(_review(namespace, _pod("p", requests={"cpu": "abc"})))
    assert answer["allowed"] is False, answer
    assert answer["status"]["code"] == 500, answer  # upstream's code for evaluation errors
    assert "cannot parse quantity 'abc'" in answer["status"]["message"], answer
    # A request the same quota allows is still allowed: the cache holds a valid quota.
    answer = await webhook.review(_review(namespace, _pod("q", requests={"cpu": "500m"})))
    assert answer["allowed"] is True, answer
    # ... and one it denies is denied with upstream's words.
    answer = await webhook.review(_review(namespace, _pod("r", requests={"cpu": "2"})))
    assert answer["allowed"] is False, answer
    assert answer["status"]["code"] == 403, answer
    assert answer["status"]["message"].startswith("exceeded quota: q, requested: requests.cpu=2")
    await _still_serving(operator, webhook, namespace)


async def _other_namespace(api: client.ApiClient) -> str:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    await wait_for_default_service_account(api, name)
    return name
