"""Who may read tally's ``/metrics``, asked of the API server: the delegating authenticator and
authorizer (apiserver's ``authenticatorfactory.DelegatingAuthenticatorConfig`` and
``authorizerfactory.DelegatingAuthorizerConfig``), put together as controller-runtime's
``filters.WithAuthenticationAndAuthorization`` puts them in front of its metrics server.

A request is judged in three steps (:meth:`DelegatingAuth.check`):

1. its bearer token, read as apiserver's ``bearertoken`` authenticator reads it
   (:func:`bearer_token`): no ``Authorization: Bearer <token>`` is a 401 that asks for one;
2. whose token it is (:class:`DelegatingAuthenticator`): a TokenReview without audiences (the
   API server's own, controller-runtime's default), whose ``status.user`` is the user; a token
   the API server does not authenticate is a 401;
3. whether that user may ``get`` the non-resource URL ``/metrics``
   (:class:`DelegatingAuthorizer`): a SubjectAccessReview carrying the user's name, uid, groups
   and extra; a user not allowed is a 403 in the API server's words
   (``forbidden: User "…" cannot get path "/metrics"``).

Every request is judged as ``get /metrics``, whatever its method and path: that is all the
server serves, and anything else is its 404 or 405, after the check, so that nobody learns
anything about the server before proving who they are. An API server that does not answer
(unreachable, an error status, an answer that is no review, nothing within
:data:`REVIEW_DEADLINE_S`) is a 503: never an allow, and never cached, so the next scrape asks
again and a recovered API server is used at once.

**Caches.** Answers are kept a short while, as the API server's own webhook authenticator and
authorizer keep theirs, so that a scrape every 15 s costs a review every few minutes and the
metrics stay readable through a short API server outage:

* a token's identity by an HMAC-SHA256 of the token under a key made at random for each
  authenticator (apiserver's token cache keys the same way): the cache holds no token, and no
  hash a guessed token could be checked against without that key; nothing logs either.
  Authenticated :data:`AUTHENTICATED_TTL_S` (kube-apiserver's
  ``--authentication-token-webhook-cache-ttl``), not authenticated :data:`UNAUTHENTICATED_TTL_S`;
* a decision by the SubjectAccessReview's spec (the user and the attributes, as apiserver's
  webhook authorizer keys its cache), so that two tokens of one ServiceAccount share it:
  allowed :data:`ALLOWED_TTL_S`, denied :data:`DENIED_TTL_S`
  (``--authorization-webhook-cache-authorized-ttl`` and ``-unauthorized-ttl``).

A negative answer is kept shorter than a positive one so that a fix (a binding to the reader
role, a new token) works within half a minute; the price of the positive ones is that a
revoked token or role still reads metrics for up to 2 or 5 minutes, what the API server itself
allows its webhooks. controller-runtime keeps identities 1 minute (decisions as here); tally
takes the API server's 2: a scraper's token is rotated hourly, not revoked, and what it reads
here is metrics, not writes. Each cache holds at most :data:`CACHE_SIZE` entries, the least
recently used going first, so that a flood of made-up tokens costs bounded memory.

**What a flood costs the API server.** Every token tally has not seen is a TokenReview; at most
:data:`REVIEWS_IN_FLIGHT` are in flight at once (the others wait for a slot within their
deadline, then get a 503), so whoever reaches the port can make tally open no more than that
many connections to the API server. There is no retry: the scraper asks again at its next
scrape, which is the retry.

Owns the review bodies, what their answers mean, the caches and the verdict; leaves the two
POSTs to :mod:`tally.kube.access_reviews` and the serving (HTTPS, the middleware) to
:mod:`tally.app.metrics`. Pure: no HTTP library, no API client; the clock is injected.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final, Generic, NamedTuple, Protocol, TypeVar

logger = logging.getLogger(__name__)

AUTHENTICATED_TTL_S: Final = 120.0
"""How long a token the API server authenticated is taken as that user without asking again
(kube-apiserver's ``--authentication-token-webhook-cache-ttl``, 2 minutes)."""
UNAUTHENTICATED_TTL_S: Final = 30.0
"""How long a token the API server did not authenticate is refused without asking again: a
scraper with a stale token costs one TokenReview per 30 s, and a clock skew between API servers
that refused a brand-new token heals within that."""
ALLOWED_TTL_S: Final = 300.0
"""How long an allowed user stays allowed without asking again
(``--authorization-webhook-cache-authorized-ttl``, 5 minutes; controller-runtime's too)."""
DENIED_TTL_S: Final = 30.0
"""How long a denied user stays denied without asking again
(``--authorization-webhook-cache-unauthorized-ttl``, 30 s; controller-runtime's too): a new
binding to the reader role works within half a minute."""
CACHE_SIZE: Final = 1024
"""Entries each cache keeps at most (apiserver's webhook authorizer keeps 8192 across every
user of a cluster; tally's readers are a few scrapers and people with curl)."""
REVIEW_DEADLINE_S: Final = 5.0
"""How long one request's reviews may take in all, a wait for a slot included: half of
Prometheus' default ``scrape_timeout`` (10 s), so that a scraper sees tally's 503 naming the
cause rather than its own timeout."""
REVIEWS_IN_FLIGHT: Final = 4
"""Reviews tally asks the API server at once, all requests together (see the module doc)."""

TOKEN_REVIEW_VERSION: Final = "authentication.k8s.io/v1"
SUBJECT_ACCESS_REVIEW_VERSION: Final = "authorization.k8s.io/v1"


class ReviewUnavailable(Exception):
    """The API server gave no usable answer to a review (unreachable, an error status, an
    answer that is no review); the message says what happened, for the log."""


class Reviewer(Protocol):
    """Creates reviews on the API server (client-go's ``TokenReviewInterface.Create`` and
    ``SubjectAccessReviewInterface.Create``): the review as JSON in, the API server's answer as
    JSON out; a failure raises, :class:`ReviewUnavailable` preferably."""

    async def create_token_review(self, review: Mapping[str, Any]) -> Mapping[str, Any]: ...

    async def create_subject_access_review(
        self, review: Mapping[str, Any]
    ) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class UserInfo:
    """Who a token is (apiserver's ``user.Info``), as a TokenReview's ``status.user`` says."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``extra`` as (key, values) pairs sorted by key: hashable, one form per user."""


@dataclass(frozen=True, slots=True)
class NonResourceAttributes:
    """What a request does to a URL that is no API resource (apiserver's
    ``authorizer.AttributesRecord`` of a non-resource request, without the user)."""

    verb: str
    path: str


METRICS_READ: Final = NonResourceAttributes(verb="get", path="/metrics")
"""What every request to the metrics server is judged as (see the module doc); what the
``tally-metrics-reader`` ClusterRole grants."""


class Decision(NamedTuple):
    """A SubjectAccessReview's answer."""

    allowed: bool
    reason: str
    """The authorizer's words, possibly empty (RBAC gives none when no rule matches)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the server answers a request: :attr:`allowed`, or the error to send instead."""

    status: HTTPStatus
    message: str = ""
    """The body of an error; the API server's words where it has some."""
    challenge: str = ""
    """``WWW-Authenticate`` of a 401 (RFC 6750): what credentials the server wants."""
    user: str = ""
    """Whom the request was judged as, when a token said so (for the log)."""

    @property
    def allowed(self) -> bool:
        return self.status == HTTPStatus.OK


# -- reading the request


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when there is none.

    apiserver's ``bearertoken.Authenticator``: surrounding white space ignored, the scheme
    case-insensitive, separated by one space, anything after a second space ignored; an empty
    token is no token.
    """
    text = (authorization or "").strip()
    parts = text.split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer":
        return None
    return parts[1] or None


# -- reviews: the bodies and what their answers mean


def token_review(token: str) -> dict[str, Any]:
    """The TokenReview asking who ``token`` is. No audiences: the API server then checks the
    token against its own (a ServiceAccount token a pod has mounted, or one from ``kubectl
    create token``), as controller-runtime's filter does."""
    return {"apiVersion": TOKEN_REVIEW_VERSION, "kind": "TokenReview", "spec": {"token": token}}


def read_token_review(answer: Mapping[str, Any]) -> UserInfo | None:
    """The user a TokenReview's answer authenticated; None when the token was not authenticated
    (``status.error`` then says why, which the caller does not need: a 401 either way).
    :class:`ReviewUnavailable` when the answer has no status to read."""
    status = answer.get("status") if isinstance(answer, Mapping) else None
    if not isinstance(status, Mapping):
        raise ReviewUnavailable("the TokenReview's answer has no status")
    if status.get("authenticated") is not True:
        return None
    user = status.get("user")
    user = user if isinstance(user, Mapping) else {}
    extra = user.get("extra")
    return UserInfo(
        name=_text(user.get("username")),
        uid=_text(user.get("uid")),
        groups=_texts(user.get("groups")),
        extra=tuple(
            sorted((str(key), _texts(values)) for key, values in extra.items())
            if isinstance(extra, Mapping)
            else ()
        ),
    )


def subject_access_review(user: UserInfo, attributes: NonResourceAttributes) -> dict[str, Any]:
    """The SubjectAccessReview asking whether ``user`` may do ``attributes``; empty fields left
    out, as Go's ``omitempty`` leaves them out of apiserver's own."""
    spec: dict[str, Any] = {
        "nonResourceAttributes": {"path": attributes.path, "verb": attributes.verb},
        "user": user.name,
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.groups:
        spec["groups"] = list(user.groups)
    if user.extra:
        spec["extra"] = {key: list(values) for key, values in user.extra}
    return {
        "apiVersion": SUBJECT_ACCESS_REVIEW_VERSION,
        "kind": "SubjectAccessReview",
        "spec": spec,
    }


def read_subject_access_review(answer: Mapping[str, Any]) -> Decision:
    """Allowed only when ``status.allowed`` is true and ``status.denied`` is not: tally is the
    only authorizer in its chain, so the API server's "no opinion" (neither) is a denial, and
    both at once is one too (apiserver's webhook authorizer calls that a deny with an error).
    :class:`ReviewUnavailable` when the answer has no status to read."""
    status = answer.get("status") if isinstance(answer, Mapping) else None
    if not isinstance(status, Mapping):
        raise ReviewUnavailable("the SubjectAccessReview's answer has no status")
    allowed = status.get("allowed") is True and status.get("denied") is not True
    return Decision(allowed, _text(status.get("reason")))


def forbidden_message(user: UserInfo, attributes: NonResourceAttributes, reason: str) -> str:
    """The API server's words for a refused non-resource request (apiserver's
    ``responsewriters.Forbidden``), so that a scraper's error reads like ``kubectl``'s."""
    message = f'forbidden: User "{user.name}" cannot {attributes.verb} path "{attributes.path}"'
    return f"{message}: {reason}" if reason else message


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _texts(values: object) -> tuple[str, ...]:
    if not isinstance(values, list | tuple):
        return ()
    return tuple(value for value in values if isinstance(value, str))


# -- caches

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Entry(NamedTuple, Generic[V]):
    expires: float
    value: V


class LRUExpireCache(Generic[K, V]):
    """apimachinery's ``LRUExpireCache``: each entry kept for its own time to live, at most
    ``max_size`` of them, the least recently used dropped first when a new one needs room."""

    def __init__(self, max_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        if max_size < 1:
            raise ValueError(f"the size must be at least 1, not {max_size}")
        self.max_size = max_size
        self._clock = clock
        # Least recently used first.
        self._entries: collections.OrderedDict[K, _Entry[V]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The value under ``key`` (now the most recently used); None when there is none or it
        expired (then it is dropped)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() >= entry.expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry.value

    def add(self, key: K, value: V, ttl: float) -> None:
        """Keep ``value`` under ``key`` for ``ttl`` seconds from now."""
        self._entries[key] = _Entry(self._clock() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)


class _Identity(NamedTuple):
    user: UserInfo | None
    """None: the token was not authenticated."""


class DelegatingAuthenticator:
    """Who a bearer token is, asked of the API server with a TokenReview, remembered for a
    while by a keyed hash of the token (module doc, "Caches")."""

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        clock: Callable[[], float] = time.monotonic,
        authenticated_ttl: float = AUTHENTICATED_TTL_S,
        unauthenticated_ttl: float = UNAUTHENTICATED_TTL_S,
        max_size: int = CACHE_SIZE,
    ) -> None:
        self._reviewer = reviewer
        self.authenticated_ttl = authenticated_ttl
        self.unauthenticated_ttl = unauthenticated_ttl
        self.cache: LRUExpireCache[bytes, _Identity] = LRUExpireCache(max_size, clock)
        self._key = secrets.token_bytes(32)
        self.reviews = 0
        """TokenReviews created (what the cache saved shows against the requests)."""

    async def authenticate(self, token: str) -> UserInfo | None:
        """The user ``token`` is; None when the API server does not authenticate it. Raises
        when the API server gave no answer (nothing is remembered then)."""
        key = hmac.digest(self._key, token.encode("utf-8", "surrogateescape"), hashlib.sha256)
        cached = self.cache.get(key)
        if cached is not None:
            return cached.user
        self.reviews += 1
        user = read_token_review(await self._reviewer.create_token_review(token_review(token)))
        ttl = self.authenticated_ttl if user is not None else self.unauthenticated_ttl
        self.cache.add(key, _Identity(user), ttl)
        return user


class DelegatingAuthorizer:
    """Whether a user may do something, asked of the API server with a SubjectAccessReview,
    remembered for a while by the review's spec (module doc, "Caches")."""

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        clock: Callable[[], float] = time.monotonic,
        allowed_ttl: float = ALLOWED_TTL_S,
        denied_ttl: float = DENIED_TTL_S,
        max_size: int = CACHE_SIZE,
    ) -> None:
        self._reviewer = reviewer
        self.allowed_ttl = allowed_ttl
        self.denied_ttl = denied_ttl
        self.cache: LRUExpireCache[str, Decision] = LRUExpireCache(max_size, clock)
        self.reviews = 0
        """SubjectAccessReviews created."""

    async def authorize(self, user: UserInfo, attributes: NonResourceAttributes) -> Decision:
        """The API server's decision on ``user`` doing ``attributes``. Raises when it gave no
        answer (nothing is remembered then)."""
        review = subject_access_review(user, attributes)
        key = json.dumps(review["spec"], sort_keys=True, separators=(",", ":"))
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        self.reviews += 1
        decision = read_subject_access_review(
            await self._reviewer.create_subject_access_review(review)
        )
        self.cache.add(key, decision, self.allowed_ttl if decision.allowed else self.denied_ttl)
        return decision


class _Bounded:
    """A :class:`Reviewer` that has at most ``slots`` reviews in flight; the others wait."""

    def __init__(self, reviewer: Reviewer, slots: int) -> None:
        self._reviewer = reviewer
        self._slots = asyncio.Semaphore(slots)

    async def create_token_review(self, review: Mapping[str, Any]) -> Mapping[str, Any]:
        async with self._slots:
            return await self._reviewer.create_token_review(review)

    async def create_subject_access_review(self, review: Mapping[str, Any]) -> Mapping[str, Any]:
        async with self._slots:
            return await self._reviewer.create_subject_access_review(review)


UNAUTHORIZED: Final = Verdict(HTTPStatus.UNAUTHORIZED, "Unauthorized", challenge="Bearer")
"""No bearer token: the API server's message, and a challenge naming the scheme it wants."""
INVALID_TOKEN: Final = Verdict(
    HTTPStatus.UNAUTHORIZED, "Unauthorized", challenge='Bearer error="invalid_token"'
)
"""A bearer token the API server did not authenticate (RFC 6750's ``invalid_token``)."""
UNAVAILABLE: Final = Verdict(
    HTTPStatus.SERVICE_UNAVAILABLE,
    "Service Unavailable: the API server could not be asked who may read metrics",
)
"""No answer from the API server. The cause goes to tally's log, not to a client that has not
proved who it is."""


class DelegatingAuth:
    """The authenticator and the authorizer together, sharing :data:`REVIEWS_IN_FLIGHT` slots,
    each request's reviews bounded by ``deadline`` seconds: :meth:`check` judges one request."""

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        clock: Callable[[], float] = time.monotonic,
        attributes: NonResourceAttributes = METRICS_READ,
        deadline: float = REVIEW_DEADLINE_S,
        reviews_in_flight: int = REVIEWS_IN_FLIGHT,
    ) -> None:
        bounded = _Bounded(reviewer, reviews_in_flight)
        self.authenticator = DelegatingAuthenticator(bounded, clock=clock)
        self.authorizer = DelegatingAuthorizer(bounded, clock=clock)
        self.attributes = attributes
        self.deadline = deadline

    async def check(self, authorization: str | None) -> Verdict:
        """The verdict on a request whose ``Authorization`` header is ``authorization`` (None:
        it has none). Never raises but for cancellation: whatever goes wrong is a 503."""
        token = bearer_token(authorization)
        if token is None:
            return UNAUTHORIZED
        try:
            async with asyncio.timeout(self.deadline):
                user = await self.authenticator.authenticate(token)
                if user is None:
                    logger.debug("metrics: a bearer token the API server did not authenticate")
                    return INVALID_TOKEN
                decision = await self.authorizer.authorize(user, self.attributes)
        except ReviewUnavailable as error:
            logger.warning("metrics: request refused (503): %s", error)
            return UNAVAILABLE
        except TimeoutError:
            logger.warning(
                "metrics: request refused (503): the API server did not review it within %g s",
                self.deadline,
            )
            return UNAVAILABLE
        except Exception:
            logger.exception("metrics: request refused (503): reviewing it failed")
            return UNAVAILABLE
        if not decision.allowed:
            message = forbidden_message(user, self.attributes, decision.reason)
            logger.debug("metrics: %s", message)
            return Verdict(HTTPStatus.FORBIDDEN, message, user=user.name)
        return Verdict(HTTPStatus.OK, user=user.name)
