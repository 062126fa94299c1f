"""Who may read ``/metrics`` (``TALLY_METRICS_AUTH=kubernetes``): tally.machinery.delegating_auth
(the bearer token, the review bodies, what the answers mean, the caches, the verdict) and its
serving in tally.app.metrics (HTTPS, the middleware).

The API server is a fake *reviewer*, a Python object answering the two reviews as the API
server answers them (bodies in the shape of ``kubectl create -f tokenreview.yaml -o json``);
the HTTP side is the real aiohttp app on loopback over HTTPS. Expected words and status codes
are the API server's (``forbidden: User "…" cannot get path "/metrics"``, 401 ``Unauthorized``)
and RFC 6750's challenge; cache times are kube-apiserver's webhook defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Mapping
from http import HTTPStatus
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client
from prometheus_client import CONTENT_TYPE_LATEST

from tally.app.metrics import (
    Metrics,
    open_metrics_warning,
    self_signed_context,
    serving_hosts,
)
from tally.kube import rest
from tally.kube.access_reviews import KubeAccessReviewer
from tally.machinery.delegating_auth import (
    METRICS_READ,
    Decision,
    DelegatingAuth,
    LRUExpireCache,
    ReviewUnavailable,
    UserInfo,
    bearer_token,
    forbidden_message,
    read_subject_access_review,
    read_token_review,
    subject_access_review,
    token_review,
)

pytestmark = pytest.mark.unit

PROMETHEUS = "system:serviceaccount:monitoring:prometheus"
INTRUDER = "system:serviceaccount:team-a:default"
PROMETHEUS_TOKEN = "prometheus-token"
PROMETHEUS_SECOND_TOKEN = "prometheus-token-after-rotation"
INTRUDER_TOKEN = "team-a-token"
BAD_TOKEN = "expired-token"

PROMETHEUS_USER = {
    "username": PROMETHEUS,
    "uid": "8c6d4e2a-0c1f-4d7e-9a4b-1f2e3d4c5b6a",
    "groups": [
        "system:serviceaccounts",
        "system:serviceaccounts:monitoring",
        "system:authenticated",
    ],
    "extra": {
        "authentication.kubernetes.io/pod-uid": ["0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b"],
        "authentication.kubernetes.io/pod-name": ["prometheus-0"],
    },
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeReviewer:
    """Answers as the API server would: tokens it knows, users RBAC allows ``get /metrics``.
    ``failure``: what both reviews raise instead; ``hang``: they never answer."""

    def __init__(self) -> None:
        self.users: dict[str, Mapping[str, Any]] = {
            PROMETHEUS_TOKEN: PROMETHEUS_USER,
            PROMETHEUS_SECOND_TOKEN: PROMETHEUS_USER,
            INTRUDER_TOKEN: {
                "username": INTRUDER,
                "uid": "1a2b",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
        }
        self.readers = {PROMETHEUS}
        self.token_reviews: list[Mapping[str, Any]] = []
        self.access_reviews: list[Mapping[str, Any]] = []
        self.failure: Exception | None = None
        self.hang = False
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()
        self.release.set()

    async def _answer(self) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hang:
                await asyncio.Event().wait()
            await self.release.wait()
            if self.failure is not None:
                raise self.failure
        finally:
            self.in_flight -= 1

    async def create_token_review(self, review: Mapping[str, Any]) -> Mapping[str, Any]:
        self.token_reviews.append(review)
        await self._answer()
        user = self.users.get(review["spec"]["token"])
        status: dict[str, Any] = (
            {"authenticated": True, "user": user, "audiences": ["https://kubernetes.default.svc"]}
            if user is not None
            else {"user": {}, "error": "[invalid bearer token, token has expired]"}
        )
        return {**review, "metadata": {"creationTimestamp": None}, "status": status}

    async def create_subject_access_review(self, review: Mapping[str, Any]) -> Mapping[str, Any]:
        self.access_reviews.append(review)
        await self._answer()
        allowed = review["spec"]["user"] in self.readers
        status: dict[str, Any] = (
            {
                "allowed": True,
                "reason": 'RBAC: allowed by ClusterRoleBinding "prometheus-tally" of ClusterRole '
                '"tally-metrics-reader" to ServiceAccount "prometheus/monitoring"',
            }
            if allowed
            else {"allowed": False}
        )
        return {**review, "metadata": {"creationTimestamp": None}, "status": status}


FORBIDDEN_INTRUDER = f'forbidden: User "{INTRUDER}" cannot get path "/metrics"'


# -- the request's token (apiserver's bearertoken authenticator)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        pytest.param("Bearer abc", "abc", id="bearer"),
        pytest.param("bearer abc", "abc", id="scheme-case-insensitive"),
        pytest.param("BEARER abc", "abc", id="scheme-upper-case"),
        pytest.param("  Bearer abc  ", "abc", id="surrounding-space"),
        pytest.param("Bearer abc def", "abc", id="after-a-second-space-ignored"),
        pytest.param(None, None, id="no-header"),
        pytest.param("", None, id="empty"),
        pytest.param("Bearer", None, id="no-token"),
        pytest.param("Bearer ", None, id="no-token-trailing-space"),
        pytest.param("Bearer  abc", None, id="two-spaces-empty-token"),
        pytest.param("Basic YWxpY2U6c2VjcmV0", None, id="basic"),
        pytest.param("abc", None, id="token-without-scheme"),
        pytest.param("Bearer:abc", None, id="colon"),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert token == bearer_token(header)


# -- the reviews


def test_token_review_has_no_audiences() -> None:
    assert {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "abc"},
    } == token_review("abc")


def test_authenticated_token_review_is_its_user() -> None:
    answer = {"status": {"authenticated": True, "user": PROMETHEUS_USER}}
    assert UserInfo(
        name=PROMETHEUS,
        uid="8c6d4e2a-0c1f-4d7e-9a4b-1f2e3d4c5b6a",
        groups=(
            "system:serviceaccounts",
            "system:serviceaccounts:monitoring",
            "system:authenticated",
        ),
        extra=(
            ("authentication.kubernetes.io/pod-name", ("prometheus-0",)),
            ("authentication.kubernetes.io/pod-uid", ("0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b",)),
        ),
    ) == read_token_review(answer)


@pytest.mark.parametrize(
    "status",
    [
        pytest.param({"user": {}, "error": "invalid bearer token"}, id="error"),
        pytest.param({"authenticated": False, "user": {"username": "x"}}, id="false"),
        pytest.param({}, id="empty-status"),
        pytest.param({"authenticated": "true", "user": {"username": "x"}}, id="not-a-boolean"),
    ],
)
def test_token_review_not_authenticated(status: dict[str, Any]) -> None:
    assert read_token_review({"status": status}) is None


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param({"kind": "TokenReview"}, id="no-status"),
        pytest.param({"status": "authenticated"}, id="status-not-an-object"),
    ],
)
def test_unreadable_token_review(answer: dict[str, Any]) -> None:
    with pytest.raises(ReviewUnavailable, match="no status"):
        read_token_review(answer)


def test_subject_access_review_carries_the_whole_user() -> None:
    user = read_token_review({"status": {"authenticated": True, "user": PROMETHEUS_USER}})
    assert user is not None
    assert {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
            "user": PROMETHEUS,
            "uid": "8c6d4e2a-0c1f-4d7e-9a4b-1f2e3d4c5b6a",
            "groups": [
                "system:serviceaccounts",
                "system:serviceaccounts:monitoring",
                "system:authenticated",
            ],
            "extra": {
                "authentication.kubernetes.io/pod-name": ["prometheus-0"],
                "authentication.kubernetes.io/pod-uid": ["0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b"],
            },
        },
    } == subject_access_review(user, METRICS_READ)


def test_subject_access_review_leaves_empty_fields_out() -> None:
    # Go's omitempty: a user with no uid, groups or extra sends none of them.
    assert {
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
        "user": "alice",
    } == subject_access_review(UserInfo("alice"), METRICS_READ)["spec"]


@pytest.mark.parametrize(
    ("status", "decision"),
    [
        pytest.param({"allowed": True, "reason": "RBAC: allowed"}, Decision(True, "RBAC: allowed")),
        pytest.param({"allowed": False}, Decision(False, ""), id="not-allowed"),
        pytest.param({}, Decision(False, ""), id="no-opinion"),
        pytest.param(
            {"allowed": False, "denied": True, "reason": "denied by policy"},
            Decision(False, "denied by policy"),
            id="denied",
        ),
        # apiserver's webhook authorizer: both at once is a deny (with an error).
        pytest.param({"allowed": True, "denied": True}, Decision(False, ""), id="both"),
        pytest.param({"allowed": "true"}, Decision(False, ""), id="not-a-boolean"),
    ],
)
def test_subject_access_review_answer(status: dict[str, Any], decision: Decision) -> None:
    assert decision == read_subject_access_review({"status": status})


def test_unreadable_subject_access_review() -> None:
    with pytest.raises(ReviewUnavailable, match="no status"):
        read_subject_access_review({"kind": "Status", "code": 500})


def test_forbidden_message_is_the_api_servers() -> None:
    # What kubectl prints for `kubectl get --raw /metrics` without the rule:
    # Error from server (Forbidden): forbidden: User "…" cannot get path "/metrics"
    assert FORBIDDEN_INTRUDER == forbidden_message(UserInfo(INTRUDER), METRICS_READ, "")
    assert 'forbidden: User "bob" cannot get path "/metrics": denied by policy' == (
        forbidden_message(UserInfo("bob"), METRICS_READ, "denied by policy")
    )


# -- the verdict: the decision table


def _auth(reviewer: FakeReviewer, clock: Clock | None = None, **options: Any) -> DelegatingAuth:
    return DelegatingAuth(reviewer, clock=clock or Clock(), **options)


@pytest.mark.parametrize(
    ("header", "status", "message", "challenge"),
    [
        pytest.param(None, 401, "Unauthorized", "Bearer", id="no-header"),
        pytest.param("Basic YWxpY2U6c2VjcmV0", 401, "Unauthorized", "Bearer", id="bad-scheme"),
        pytest.param("Bearer", 401, "Unauthorized", "Bearer", id="no-token"),
        pytest.param(
            f"Bearer {BAD_TOKEN}",
            401,
            "Unauthorized",
            'Bearer error="invalid_token"',
            id="not-authenticated",
        ),
        pytest.param(f"Bearer {INTRUDER_TOKEN}", 403, FORBIDDEN_INTRUDER, "", id="denied"),
        pytest.param(f"Bearer {PROMETHEUS_TOKEN}", 200, "", "", id="allowed"),
    ],
)
async def test_decision_table(
    header: str | None, status: int, message: str, challenge: str
) -> None:
    verdict = await _auth(FakeReviewer()).check(header)
    assert (status, message, challenge) == (verdict.status, verdict.message, verdict.challenge)
    assert (status == 200) == verdict.allowed


async def test_no_token_asks_nothing() -> None:
    reviewer = FakeReviewer()
    await _auth(reviewer).check("Basic YWxpY2U6c2VjcmV0")
    assert ([], []) == (reviewer.token_reviews, reviewer.access_reviews)


async def test_an_unauthenticated_token_is_not_authorized() -> None:
    reviewer = FakeReviewer()
    await _auth(reviewer).check(f"Bearer {BAD_TOKEN}")
    assert (1, 0) == (len(reviewer.token_reviews), len(reviewer.access_reviews))


async def test_the_reviews_sent() -> None:
    reviewer = FakeReviewer()
    await _auth(reviewer).check(f"Bearer {PROMETHEUS_TOKEN}")
    assert [token_review(PROMETHEUS_TOKEN)] == reviewer.token_reviews
    (sent,) = reviewer.access_reviews
    assert {"path": "/metrics", "verb": "get"} == sent["spec"]["nonResourceAttributes"]
    assert (PROMETHEUS, PROMETHEUS_USER["uid"], PROMETHEUS_USER["groups"]) == (
        sent["spec"]["user"],
        sent["spec"]["uid"],
        sent["spec"]["groups"],
    )
    assert PROMETHEUS_USER["extra"] == sent["spec"]["extra"]


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(ReviewUnavailable("POST …/tokenreviews: 403 Forbidden"), id="api-error"),
        pytest.param(ConnectionResetError("reset by peer"), id="connection"),
        pytest.param(RuntimeError("a bug"), id="anything-else"),
    ],
)
async def test_api_failure_is_503_never_an_allow(failure: Exception) -> None:
    reviewer = FakeReviewer()
    reviewer.failure = failure
    verdict = await _auth(reviewer).check(f"Bearer {PROMETHEUS_TOKEN}")
    assert HTTPStatus.SERVICE_UNAVAILABLE == verdict.status
    assert not verdict.allowed


async def test_authorization_failure_is_503() -> None:
    reviewer = FakeReviewer()
    auth = _auth(reviewer)
    assert (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    reviewer.failure = ReviewUnavailable("POST …/subjectaccessreviews: 500")
    # The identity is cached; the decision for the other user is not.
    reviewer.readers.add(INTRUDER)
    verdict = await auth.check(f"Bearer {INTRUDER_TOKEN}")
    assert HTTPStatus.SERVICE_UNAVAILABLE == verdict.status


async def test_unreadable_answer_is_503() -> None:
    class Garbled(FakeReviewer):
        async def create_token_review(self, review: Mapping[str, Any]) -> Mapping[str, Any]:
            return {"kind": "Status", "status": "Failure"}

    verdict = await _auth(Garbled()).check(f"Bearer {PROMETHEUS_TOKEN}")
    assert HTTPStatus.SERVICE_UNAVAILABLE == verdict.status


async def test_no_answer_within_the_deadline_is_503() -> None:
    reviewer = FakeReviewer()
    reviewer.hang = True
    verdict = await _auth(reviewer, deadline=0.05).check(f"Bearer {PROMETHEUS_TOKEN}")
    assert HTTPStatus.SERVICE_UNAVAILABLE == verdict.status
    assert 0 == reviewer.in_flight  # the review was cancelled, not left behind


async def test_errors_are_never_cached() -> None:
    reviewer = FakeReviewer()
    auth = _auth(reviewer)
    reviewer.failure = ReviewUnavailable("connection refused")
    assert not (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    reviewer.failure = None
    assert (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    assert 2 == len(reviewer.token_reviews)


async def test_reviews_in_flight_are_bounded() -> None:
    reviewer = FakeReviewer()
    reviewer.release.clear()
    reviewer.users.update({f"token-{i}": PROMETHEUS_USER for i in range(6)})
    auth = _auth(reviewer, reviews_in_flight=2)
    checks = [asyncio.create_task(auth.check(f"Bearer token-{i}")) for i in range(6)]
    for _ in range(10):
        await asyncio.sleep(0)
    assert (2, 2) == (reviewer.in_flight, len(reviewer.token_reviews))
    reviewer.release.set()
    verdicts = await asyncio.gather(*checks)
    assert all(verdict.allowed for verdict in verdicts)
    assert 2 == reviewer.most_in_flight


# -- the caches, on a fake clock


async def test_an_identity_is_kept_two_minutes() -> None:
    reviewer, clock = FakeReviewer(), Clock()
    auth = _auth(reviewer, clock)
    assert (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    clock.now += 119.9
    assert (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    assert 1 == len(reviewer.token_reviews)
    clock.now += 0.1  # 120 s after the review
    assert (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    assert 2 == len(reviewer.token_reviews)


async def test_a_refused_token_is_kept_thirty_seconds() -> None:
    reviewer, clock = FakeReviewer(), Clock()
    auth = _auth(reviewer, clock)
    assert HTTPStatus.UNAUTHORIZED == (await auth.check(f"Bearer {BAD_TOKEN}")).status
    clock.now += 29.9
    assert HTTPStatus.UNAUTHORIZED == (await auth.check(f"Bearer {BAD_TOKEN}")).status
    assert 1 == len(reviewer.token_reviews)
    reviewer.users[BAD_TOKEN] = PROMETHEUS_USER  # (a token valid after all: clock skew)
    clock.now += 0.1
    assert (await auth.check(f"Bearer {BAD_TOKEN}")).allowed
    assert 2 == len(reviewer.token_reviews)


async def test_an_allowed_user_is_kept_five_minutes() -> None:
    reviewer, clock = FakeReviewer(), Clock()
    auth = _auth(reviewer, clock)
    assert (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    reviewer.readers.clear()  # the binding is deleted
    for _ in range(2):  # the identity expires at 120 and 240 s; the decision stays
        clock.now += 120
        assert (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    clock.now += 59.9
    assert (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    assert 1 == len(reviewer.access_reviews)
    clock.now += 0.1  # 300 s after the review
    assert HTTPStatus.FORBIDDEN == (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).status
    assert 2 == len(reviewer.access_reviews)


async def test_a_denied_user_is_kept_thirty_seconds() -> None:
    reviewer, clock = FakeReviewer(), Clock()
    auth = _auth(reviewer, clock)
    assert HTTPStatus.FORBIDDEN == (await auth.check(f"Bearer {INTRUDER_TOKEN}")).status
    reviewer.readers.add(INTRUDER)  # bound to the reader role
    clock.now += 29.9
    assert HTTPStatus.FORBIDDEN == (await auth.check(f"Bearer {INTRUDER_TOKEN}")).status
    clock.now += 0.1
    assert (await auth.check(f"Bearer {INTRUDER_TOKEN}")).allowed
    assert (1, 2) == (len(reviewer.token_reviews), len(reviewer.access_reviews))


async def test_two_tokens_of_one_user_share_the_decision() -> None:
    reviewer = FakeReviewer()
    auth = _auth(reviewer)
    assert (await auth.check(f"Bearer {PROMETHEUS_TOKEN}")).allowed
    assert (await auth.check(f"Bearer {PROMETHEUS_SECOND_TOKEN}")).allowed
    assert (2, 1) == (len(reviewer.token_reviews), len(reviewer.access_reviews))


async def test_the_cache_keeps_no_token() -> None:
    auth = _auth(FakeReviewer())
    await auth.check(f"Bearer {PROMETHEUS_TOKEN}")
    (key,) = list(auth.authenticator.cache._entries)
    assert isinstance(key, bytes)
    assert 32 == len(key)  # an HMAC-SHA256
    assert PROMETHEUS_TOKEN.encode() not in key
    # Under another authenticator's key, the same token hashes differently.
    other = _auth(FakeReviewer())
    await other.check(f"Bearer {PROMETHEUS_TOKEN}")
    assert [key] != list(other.authenticator.cache._entries)


def test_lru_expire_cache() -> None:
    clock = Clock()
    cache: LRUExpireCache[str, int] = LRUExpireCache(2, clock)
    cache.add("a", 1, ttl=10)
    cache.add("b", 2, ttl=20)
    assert 1 == cache.get("a")  # "a" is now the most recently used
    cache.add("c", 3, ttl=10)  # room for "c": "b" goes, the least recently used
    assert (1, None, 3) == (cache.get("a"), cache.get("b"), cache.get("c"))
    clock.now += 10
    assert (None, None, 0) == (cache.get("a"), cache.get("c"), len(cache))


async def test_the_caches_are_bounded() -> None:
    reviewer = FakeReviewer()
    auth = _auth(reviewer)
    auth.authenticator.cache.max_size = 3
    for i in range(10):
        await auth.check(f"Bearer made-up-{i}")
    assert 3 == len(auth.authenticator.cache)


# -- the adapter: the two POSTs (``rest.request_json`` replaced, as test_charge_verifier does)


class FakeRequest:
    """``rest.request_json``: records (method, path, body, timeout) and answers ``answer`` (the
    created review) or raises it."""

    def __init__(self, answer: dict[str, Any] | BaseException) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, Any, float]] = []

    async def __call__(
        self,
        api: object,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        query: list[tuple[str, str]] | None = None,
        request_timeout: float = rest.REQUEST_TIMEOUT_S,
    ) -> dict[str, Any]:
        self.calls.append((method, path, body, request_timeout))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.fixture
async def api() -> AsyncIterator[client.ApiClient]:
    built = client.ApiClient()  # never used: every request goes to a FakeRequest
    yield built
    await built.close()


async def test_the_reviews_are_posted_to_their_collections(
    api: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = FakeRequest({"status": {"allowed": True}})
    monkeypatch.setattr(rest, "request_json", request)
    reviewer = KubeAccessReviewer(api, request_timeout=2.5)
    user = UserInfo(PROMETHEUS)
    await reviewer.create_token_review(token_review(PROMETHEUS_TOKEN))
    await reviewer.create_subject_access_review(subject_access_review(user, METRICS_READ))
    assert [
        (
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            token_review(PROMETHEUS_TOKEN),
            2.5,
        ),
        (
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            subject_access_review(user, METRICS_READ),
            2.5,
        ),
    ] == request.calls


def _api_error(status: int, reason: str, body: str | None) -> client.ApiException:
    """What kubernetes-asyncio raises for an error status: the body as the bytes read."""
    error = client.ApiException(status=status, reason=reason)
    error.body = body.encode() if body is not None else None
    return error


@pytest.mark.parametrize(
    ("raised", "message"),
    [
        pytest.param(
            _api_error(
                403,
                "Forbidden",
                '{"kind":"Status","apiVersion":"v1","status":"Failure","message":'
                '"tokenreviews.authentication.k8s.io is forbidden: User '
                '\\"system:serviceaccount:tally-system:tally\\" cannot create resource '
                '\\"tokenreviews\\" in API group \\"authentication.k8s.io\\" at the cluster '
                'scope","reason":"Forbidden","code":403}',
            ),
            "POST /apis/authentication.k8s.io/v1/tokenreviews: 403 Forbidden: "
            "tokenreviews.authentication.k8s.io is forbidden: User "
            '"system:serviceaccount:tally-system:tally" cannot create resource "tokenreviews" '
            'in API group "authentication.k8s.io" at the cluster scope',
            id="tally-lacks-the-rule",
        ),
        pytest.param(
            _api_error(500, "Internal Server Error", "not json"),
            "POST /apis/authentication.k8s.io/v1/tokenreviews: 500 Internal Server Error",
            id="body-not-a-status",
        ),
        pytest.param(
            TimeoutError(),
            "POST /apis/authentication.k8s.io/v1/tokenreviews: no answer within 5 s",
            id="timeout",
        ),
        pytest.param(
            aiohttp.ClientConnectionError("connection refused"),
            "POST /apis/authentication.k8s.io/v1/tokenreviews: ClientConnectionError: "
            "connection refused",
            id="no-connection",
        ),
        pytest.param(
            TypeError("expected a JSON object, got list"),
            "POST /apis/authentication.k8s.io/v1/tokenreviews: TypeError: expected a JSON "
            "object, got list",
            id="not-a-review",
        ),
    ],
)
async def test_every_failure_is_review_unavailable(
    api: client.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    message: str,
) -> None:
    monkeypatch.setattr(rest, "request_json", FakeRequest(raised))
    with pytest.raises(ReviewUnavailable) as error:
        await KubeAccessReviewer(api).create_token_review(token_review(PROMETHEUS_TOKEN))
    assert message == str(error.value)


# -- serving: the real aiohttp app over HTTPS on loopback


@contextlib.asynccontextmanager
async def _served(
    reviewer: FakeReviewer | None,
) -> AsyncIterator[tuple[str, web.AppRunner]]:
    metrics = Metrics()
    metrics.leading("tally-0", True)
    runner = await metrics.serve(
        "127.0.0.1", 0, reviewer=reviewer, tls_hosts=("tally-0", "localhost", "127.0.0.1")
    )
    try:
        port = runner.addresses[0][1]
        yield f"{'https' if reviewer is not None else 'http'}://127.0.0.1:{port}", runner
    finally:
        await runner.cleanup()


async def _get(url: str, token: str | None = None) -> tuple[int, dict[str, str], str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    # What Prometheus' insecure_skip_verify does: the certificate's CA is in tally's memory only.
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers, ssl=False) as response,
    ):
        return response.status, dict(response.headers), await response.text()


async def test_served_over_https_through_the_middleware() -> None:
    reviewer = FakeReviewer()
    async with _served(reviewer) as (base, _):
        status, headers, _ = await _get(f"{base}/metrics")
        assert (401, "Bearer") == (status, headers.get("WWW-Authenticate"))

        status, headers, _ = await _get(f"{base}/metrics", BAD_TOKEN)
        assert (401, 'Bearer error="invalid_token"') == (status, headers["WWW-Authenticate"])

        status, _, body = await _get(f"{base}/metrics", INTRUDER_TOKEN)
        assert (403, FORBIDDEN_INTRUDER + "\n") == (status, body)

        status, headers, body = await _get(f"{base}/metrics", PROMETHEUS_TOKEN)
        assert 200 == status
        assert CONTENT_TYPE_LATEST == headers["Content-Type"]
        assert 'tally_leader{identity="tally-0"} 1.0' in body

        reviewer.failure = ReviewUnavailable("POST …/tokenreviews: 503 Service Unavailable")
        status, _, body = await _get(f"{base}/metrics", PROMETHEUS_SECOND_TOKEN)
        assert 503 == status
        assert "tokenreviews" not in body  # the cause is for tally's log


async def test_other_paths_are_judged_first() -> None:
    # Nothing about the server, not even which paths exist, before the token is checked.
    async with _served(FakeReviewer()) as (base, _):
        assert 401 == (await _get(f"{base}/nothing-here"))[0]
        assert 404 == (await _get(f"{base}/nothing-here", PROMETHEUS_TOKEN))[0]


async def test_plain_http_to_the_https_port_fails() -> None:
    async with _served(FakeReviewer()) as (base, _):
        with pytest.raises(aiohttp.ClientError):
            await _get(base.replace("https://", "http://") + "/metrics", PROMETHEUS_TOKEN)


async def test_the_certificate_names_the_pod_and_localhost() -> None:
    async with _served(FakeReviewer()) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()
    cert = x509.load_der_x509_certificate(der)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert (["tally-0", "localhost"], [ipaddress.ip_address("127.0.0.1")]) == (
        sans.get_values_for_type(x509.DNSName),
        sans.get_values_for_type(x509.IPAddress),
    )
    assert "tally-0" == cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert datetime.timedelta(days=365, minutes=5) == lifetime  # a year, backdated 5 minutes


async def test_without_auth_plain_http_to_anyone() -> None:
    # TALLY_METRICS_AUTH=none, or auto on a loopback address: what the test suites scrape.
    async with _served(None) as (base, _):
        status, _, body = await _get(f"{base}/metrics")
    assert 200 == status
    assert 'tally_leader{identity="tally-0"} 1.0' in body


def test_self_signed_context_requires_tls_1_2() -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    context = self_signed_context(("localhost", "127.0.0.1"), now)
    assert ssl.TLSVersion.TLSv1_2 == context.minimum_version


@pytest.mark.parametrize(
    ("hostname", "hosts"),
    [
        pytest.param(
            "tally-6f7c9d-x2k4q",
            ("tally-6f7c9d-x2k4q", "localhost", "127.0.0.1"),
            id="pod-name",
        ),
        pytest.param("Tally-0", ("tally-0", "localhost", "127.0.0.1"), id="lower-cased"),
        pytest.param("my_laptop", ("localhost", "127.0.0.1"), id="not-a-dns-name"),
        pytest.param("localhost", ("localhost", "127.0.0.1"), id="localhost-once"),
    ],
)
def test_serving_hosts(
    monkeypatch: pytest.MonkeyPatch, hostname: str, hosts: tuple[str, ...]
) -> None:
    monkeypatch.setenv("HOSTNAME", hostname)
    assert hosts == serving_hosts()


@pytest.mark.parametrize(
    ("addr", "warned"),
    [
        pytest.param("127.0.0.1", False, id="loopback"),
        pytest.param("127.0.0.53", False, id="loopback-net"),
        pytest.param("::1", False, id="loopback-v6"),
        pytest.param("localhost", False, id="localhost"),
        pytest.param("0.0.0.0", True, id="every-interface"),
        pytest.param("::", True, id="every-interface-v6"),
        pytest.param("10.1.2.3", True, id="pod-address"),
        pytest.param("", True, id="empty-is-every-interface"),
    ],
)
def test_open_metrics_warning(addr: str, warned: bool) -> None:
    warning = open_metrics_warning(addr, 8080)
    assert warned == bool(warning)
    if warned:
        assert "TALLY_METRICS_AUTH=none" in warning
        assert "every tenant's usage" in warning
