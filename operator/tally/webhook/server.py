"""tally's admission webhook server: AdmissionReview in, verdict out, on its own aiohttp app.

Why not Kopf's webhook server: Kopf's public API cannot reload a certificate without
restarting the server (closing the port: the API server then refuses requests under
failurePolicy Fail), has no place for the API server's client CA (mutual TLS), deep-copies
every reviewed object to build an empty patch, and answers 404 for a resource its own CRD
watch has not seen yet (a ``count/`` resource a quota names right after its CRD appeared). Kopf
stays what tally is built on: the watches, start-up and clean-up, and probes.

Routes: ``POST /<webhook id>`` for each handler (``/quota``, ``/validate-podsets``,
``/validate-clusterquotas``: the paths :mod:`tally.webhook.configuration` registers); any other
path is a 404.

A request, in order (:meth:`WebhookServer._serve`):

1. A body declared larger than ``max_body_bytes`` (7 MiB: what the API server can send, see
   :mod:`tally.webhook.limits`), or found larger while read: 413 naming the limit.
2. More than ``max_reviews_in_flight`` reviews, or more than ``body_budget_bytes`` of their
   bodies, held at once: 429 with ``Retry-After: 1``, at once. The API server's client sends
   the same review again after that second, within the call's timeout (client-go's
   ``rest.Request`` retries a 429 that names a delay); past the timeout the failure policy
   applies. A burst never waits in tally's memory.
3. The body read within ``body_timeout`` of the head's end, or 408.
4. The same review (webhook, ``request.uid`` and body, by a digest of the raw bytes) in
   progress or answered within the last 30 s: its answer, without judging it again
   (:mod:`tally.webhook.answers`).
5. The envelope checked (:func:`parse_review`), with a pydantic model of exactly the fields
   tally reads: a body that is not UTF-8, not JSON the API server could have sent, or not an
   AdmissionReview gets a 400 naming what is wrong, never an allow and never a 500 (the API
   server applies the failure policy), and nothing is judged. The object itself
   (``object``/``oldObject``) stays free-form: the evaluators report what they cannot read.
   One translation to quota admission's :class:`Attributes` (:func:`attributes_from_review`).
6. The handler judges it; a handler that fails refuses the request (never an allow).

**Deep objects.** The API server stores a custom resource's free-form content nested up to
:data:`MAX_OBJECT_DEPTH` levels, and tally must judge those like any other. Parsing them, and
everything done with them after, recurses once or twice a level: the process's recursion limit
is raised at start-up for it (:mod:`tally.app.recursion`). A review nested deeper than the API
server can send is a 400 naming its depth, as is one too deep to parse at all.

Connections, TLS and their timeouts and cap: :mod:`tally.webhook.connections`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import ssl
import sys
from array import array
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Literal, NoReturn

import aiohttp.web
from pydantic import BaseModel, ConfigDict, ValidationError

from tally.admission.attributes import Attributes
from tally.admission.errors import AdmissionDenied
from tally.clusterquota import quota as cluster_quota
from tally.clusterquota.measures import MeasureCatalog
from tally.evaluators.base import GroupResource
from tally.evaluators.registry import Registry, group_resource_for_count_name
from tally.podset import validation
from tally.webhook.answers import Answers, review_key
from tally.webhook.connections import ConnectionGuard, GuardedSite
from tally.webhook.limits import InFlight, WebhookLimits

logger = logging.getLogger(__name__)

MAX_OBJECT_DEPTH: Final = 10_000
"""How deep the API server's JSON decoder lets an object nest (``sigs.k8s.io/json``, a fork of
Go's ``encoding/json``, whose scanner refuses past ``maxNestingDepth``, 10 000); so how deep a
custom resource's free-form content can be stored."""

MAX_REVIEW_DEPTH: Final = MAX_OBJECT_DEPTH + 2
"""The objects sit two levels into the review (``request.object``)."""

RETRY_AFTER_S: Final = 1
"""Seconds the API server is asked to wait before sending a review tally had no room for again
(client-go waits that long, then retries within the call's timeout)."""

REPORT_PERIOD_S: Final = 60.0
"""At most one warning this often about reviews answered 429."""


class _Envelope(BaseModel):
    # The API server owns these objects and adds fields over time: ignore what we don't read.
    model_config = ConfigDict(extra="ignore", frozen=True)


class RequestResource(_Envelope):
    group: str
    version: str
    resource: str


class RequestPayload(_Envelope):
    uid: str
    resource: RequestResource
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    userInfo: dict[str, Any]
    object: dict[str, Any] | None = None
    oldObject: dict[str, Any] | None = None


class AdmissionReview(_Envelope):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: RequestPayload


class ReviewError(ValueError):
    """A request body that is not an AdmissionReview; the message says why."""


def _no_constant(name: str) -> NoReturn:
    # Python's json reads NaN and Infinity, which are not JSON and which Go's decoder refuses.
    raise ReviewError(f"the body is not JSON: {name} is not a JSON value")


def parse_review(body: bytes | bytearray) -> dict[str, Any]:
    """The JSON of a valid AdmissionReview request, or :class:`ReviewError`."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ReviewError(f"the body is not UTF-8 text: {error.reason}") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except ReviewError:
        raise
    except json.JSONDecodeError as error:
        raise ReviewError(f"the body is not JSON: {error}") from None
    except ValueError:
        # The only other ValueError of Python's json: int()'s limit on the digits it converts.
        # The API server's decoder keeps a number as a 64-bit integer or float, and never
        # sends one of thousands of digits.
        raise ReviewError(
            "the body holds an integer of more than "
            f"{sys.get_int_max_str_digits()} digits, which no review from the API server does"
        ) from None
    except RecursionError:
        raise ReviewError(
            "the body is nested too deeply to parse; a review from the API server is nested "
            f"at most {MAX_REVIEW_DEPTH} levels (objects at most {MAX_OBJECT_DEPTH})"
        ) from None
    del text
    depth = _nesting_depth(body, MAX_REVIEW_DEPTH)
    if depth > MAX_REVIEW_DEPTH:
        raise ReviewError(
            f"the body is nested {depth} levels deep; a review from the API server is nested "
            f"at most {MAX_REVIEW_DEPTH} levels (objects at most {MAX_OBJECT_DEPTH})"
        )
    try:
        AdmissionReview.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'body'}: {e['msg']}"
            for e in error.errors()
        )
        raise ReviewError(f"not an admission.k8s.io/v1 AdmissionReview: {problems}") from None
    if data["request"].get("object") is None and data["request"].get("oldObject") is None:
        raise ReviewError("request.object and request.oldObject are both missing")
    return dict(data)


_JSON_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET_STEPS: Final = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")


def _nesting_depth(document: bytes | bytearray, at_most: int) -> int:
    """How deep the valid JSON ``document`` nests; any number up to ``at_most`` when it cannot
    nest deeper (fewer opening brackets than that).

    From the text, not the parsed objects: C-speed passes (strings dropped, brackets kept as
    +1/-1, their running sum's maximum) where walking the objects costs Python steps for each
    of them, and only for the rare document with more brackets than the limit.
    """
    if document.count(b"[") + document.count(b"{") <= at_most:
        return 0
    brackets = _JSON_STRING.sub(b"", document).translate(_BRACKET_STEPS, _NOT_BRACKETS)
    return max(itertools.accumulate(array("b", brackets)), default=0)


def review_response(
    review: Mapping[str, Any], allowed: bool, message: str = "", code: int = 0
) -> dict[str, Any]:
    """An AdmissionReview response for ``review``; a refusal carries ``status.code`` (403
    unless given) and ``status.message``, which the API server shows after ``admission
    webhook "<name>" denied the request: ``."""
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": allowed}
    if not allowed:
        response["status"] = {"message": message, "code": code or 403}
    return {"apiVersion": review["apiVersion"], "kind": review["kind"], "response": response}


def attributes_from_review(review: Mapping[str, Any]) -> Attributes:
    """Quota admission's view of a (validated) AdmissionReview request."""
    request = review["request"]
    resource = request["resource"]
    return Attributes(
        namespace=str(request.get("namespace") or ""),
        name=str(request.get("name") or ""),
        group_resource=GroupResource(resource["group"], resource["resource"]),
        subresource=str(request.get("subResource") or ""),
        operation=str(request["operation"]),
        obj=request.get("object"),
        old_obj=request.get("oldObject"),
        dry_run=bool(request.get("dryRun")),
    )


ReviewHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""Answers one checked AdmissionReview (``parse_review``'s result) with the response review."""

SHUTDOWN_TIMEOUT_S: Final = 10.0
"""How long a stopping server lets requests in progress finish, unless its caller has less
time (quota admission answers within its own 9.5 s timeout)."""
CLOSE_TIMEOUT_S: Final = 0.5
"""How long closing the connections waits for a handler still running once the drain is over
(aiohttp's runner; the reviews it would wait for were given their time already)."""

NOTED_PEERS: Final = 64
"""Addresses whose first review is logged; later new ones are not (an address per API server
replica, or per node where the CNI rewrites the source, stays far below)."""
MAX_HEADERS: Final = 32
"""Header fields a request may carry (aiohttp's default is 128, each up to 8 KiB): the API
server sends fewer than ten, and a head being received is held in memory."""


class WebhookServer:
    """tally's admission endpoints on tally's own aiohttp application: ``POST /<webhook id>``
    for each handler, over TLS with the :class:`ssl.SSLContext` it is given, within
    ``limits`` (:mod:`tally.webhook.limits`).

    The context is the one :mod:`tally.webhook.tls` keeps: a renewed certificate is loaded into
    it while the server runs, so the port never closes; it requires the API server's client
    certificate when mutual TLS is configured. Start once the caches are synced (no request may
    be judged on an unsynced cache); stop before the admission workers.
    """

    def __init__(
        self,
        handlers: Mapping[str, ReviewHandler],
        *,
        addr: str,
        port: int,
        context: ssl.SSLContext,
        access_log: bool = False,
        limits: WebhookLimits | None = None,
    ) -> None:
        """``access_log``: a line per request (aiohttp's access log); off by default, as
        upstream's admission plugin logs none and a busy cluster's log would fill with pod
        creates."""
        self.handlers = dict(handlers)
        self.addr = addr
        self.port = port
        self.context = context
        self.limits: Final = limits if limits is not None else WebhookLimits()
        self._access_log = access_log
        self._runner: aiohttp.web.AppRunner | None = None
        self._site: GuardedSite | None = None
        self._in_flight = InFlight(self.limits.max_reviews_in_flight, self.limits.body_budget_bytes)
        self._answers: Answers[bytes] = Answers(
            window=self.limits.answered_window, max_answers=self.limits.answered_max
        )
        self._refusals = 0
        self._peers: set[str] = set()
        self._reported_at: float | None = None

    @property
    def addresses(self) -> list[Any]:
        """Where the server listens (``(host, port)`` for IPv4); empty when it is stopped."""
        return self._site.addresses if self._site is not None else []

    @property
    def open_connections(self) -> int:
        """Connections open now, handshakes included."""
        return len(self._site.guard) if self._site is not None else 0

    @property
    def reviews_in_flight(self) -> int:
        """Reviews being read, parsed or judged now (retries awaiting a judgement included)."""
        return self._in_flight.reviews

    @property
    def body_bytes_in_flight(self) -> int:
        """Body bytes of those reviews held now."""
        return self._in_flight.bytes

    async def start(self) -> None:
        limits = self.limits
        app = aiohttp.web.Application(
            middlewares=[self._track], client_max_size=limits.max_body_bytes
        )
        app.add_routes([aiohttp.web.post("/{id}", self._serve)])
        kwargs: dict[str, Any] = {} if self._access_log else {"access_log": None}
        runner = aiohttp.web.AppRunner(
            app,
            handle_signals=False,
            shutdown_timeout=CLOSE_TIMEOUT_S,
            # aiohttp's own idle timer only backs tally's up: it fires after them.
            keepalive_timeout=limits.keepalive_timeout + limits.header_timeout,
            max_headers=MAX_HEADERS,
            **kwargs,
        )
        await runner.setup()
        assert runner.server is not None
        site = GuardedSite(
            runner,
            self.addr,
            self.port,
            guard=ConnectionGuard(limits, self.context, runner.server),
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        logger.info("serving admission webhooks at https://%s:%d/{%s}", self.addr, self.port,
                    ",".join(sorted(self.handlers)))  # fmt: skip

    async def stop(self, within: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Close the port, let the reviews in progress finish (at most ``within`` seconds),
        then close every connection."""
        runner, self._runner = self._runner, None
        site, self._site = self._site, None
        if site is not None:
            await site.stop()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._in_flight.drained()
        if runner is not None:
            # What is still in progress now is cut (the runner waits CLOSE_TIMEOUT_S at most).
            await runner.cleanup()
        if site is not None:
            site.guard.stop_timers()

    @aiohttp.web.middleware
    async def _track(
        self,
        request: aiohttp.web.Request,
        handler: Callable[[aiohttp.web.Request], Awaitable[aiohttp.web.StreamResponse]],
    ) -> aiohttp.web.StreamResponse:
        """Tell the connection guard a request is in progress until its response is written
        (here, not after this returns, so that a connection is idle only once it is)."""
        guard = self._site.guard if self._site is not None else None
        connection = guard.begin(request.transport) if guard is not None else None
        try:
            try:
                response = await handler(request)
            except aiohttp.web.HTTPException as error:
                await self._send(request, error)
                raise
            await self._send(request, response)
            return response
        finally:
            if guard is not None:
                guard.end(connection)

    async def _send(
        self, request: aiohttp.web.Request, response: aiohttp.web.StreamResponse
    ) -> None:
        try:
            async with asyncio.timeout(self.limits.body_timeout):
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:
            # A peer that does not read its answer: the connection goes, the slot with it.
            if self._site is not None:
                self._site.guard.abort(request.transport)
        except ConnectionError:
            pass  # the peer is gone; aiohttp sees it too

    async def _serve(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        webhook = request.match_info["id"]
        handler = self.handlers.get(webhook)
        if handler is None:
            raise aiohttp.web.HTTPNotFound(reason=f"no webhook at {request.path}")
        self._note_peer(request.remote)
        declared = request.content_length
        if declared is not None and declared > self.limits.max_body_bytes:
            raise self._too_large()
        if not self._in_flight.enter():
            raise self._too_many(f"{self._in_flight.max_reviews} reviews in flight")
        held = 0
        try:
            body = await self._read_body(request)
            held = len(body)
            key = review_key(webhook, body)
            earlier = self._answers.find(key)
            if earlier is None:
                try:
                    review = parse_review(body)
                except ReviewError as error:
                    raise aiohttp.web.HTTPBadRequest(reason=str(error)) from None
                del body
                judging = self._answers.judge(key, self._judge(handler, review, request.path))
                del review
                answer = await asyncio.shield(judging)
            else:
                # A retry of a review in progress or answered: the bytes are not needed again.
                del body
                self._in_flight.give_back(held)
                held = 0
                answer = await asyncio.shield(earlier)
        finally:
            self._in_flight.give_back(held)
            self._in_flight.leave()
        return aiohttp.web.Response(body=answer, content_type="application/json")

    async def _read_body(self, request: aiohttp.web.Request) -> bytearray:
        """The request's body, each chunk taken from the body budget as it arrives (given back
        here if the body is refused, by the caller otherwise)."""
        body = bytearray()
        try:
            async with asyncio.timeout(self.limits.body_timeout):
                async for chunk in request.content.iter_any():
                    if len(body) + len(chunk) > self.limits.max_body_bytes:
                        raise self._too_large()
                    if not self._in_flight.take(len(chunk)):
                        raise self._too_many(
                            f"{self._in_flight.max_bytes} bytes of review bodies in flight"
                        )
                    body += chunk
        except TimeoutError:
            self._in_flight.give_back(len(body))
            raise aiohttp.web.HTTPRequestTimeout(
                reason=f"the body did not arrive within {self.limits.body_timeout:g} s",
                headers={"Connection": "close"},
            ) from None
        except BaseException:
            self._in_flight.give_back(len(body))
            raise
        return body

    async def _judge(self, handler: ReviewHandler, review: dict[str, Any], path: str) -> bytes:
        try:
            response = await handler(review)
        except Exception as error:
            # Never an allow: the request is refused with the error, as upstream's plugin
            # refuses what it failed to evaluate.
            logger.exception("webhook %s failed on %s", path, _describe(review))
            response = review_response(review, False, f"tally failed: {error}", 500)
        return json.dumps(response).encode()

    def _note_peer(self, address: str | None) -> None:
        """Log the first review from each address (up to :data:`NOTED_PEERS`): where the API
        server's calls come from, which a NetworkPolicy admitting only the control plane must
        name (docs/install.md, "Who may call the webhook")."""
        if address is None or address in self._peers or len(self._peers) >= NOTED_PEERS:
            return
        self._peers.add(address)
        logger.info("webhook: first review from %s", address)

    def _too_large(self) -> aiohttp.web.HTTPException:
        return aiohttp.web.HTTPRequestEntityTooLarge(
            max_size=self.limits.max_body_bytes,
            actual_size=0,
            reason=(
                f"the body is larger than the webhook's limit of {self.limits.max_body_bytes} "
                "bytes (TALLY_WEBHOOK_MAX_BODY_BYTES)"
            ),
        )

    def _too_many(self, what: str) -> aiohttp.web.HTTPException:
        self._refusals += 1
        now = asyncio.get_running_loop().time()
        if self._reported_at is None or now - self._reported_at >= REPORT_PERIOD_S:
            logger.warning(
                "webhook at its limit of %s: %d review(s) answered 429 since the last warning "
                "(TALLY_WEBHOOK_MAX_REVIEWS_IN_FLIGHT, TALLY_WEBHOOK_BODY_BUDGET_BYTES)",
                what, self._refusals,
            )  # fmt: skip
            self._reported_at = now
            self._refusals = 0
        return aiohttp.web.HTTPTooManyRequests(
            reason=f"tally holds {what}, its limit",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )


def quota_review(admit: Callable[[Attributes], Awaitable[None]]) -> ReviewHandler:
    """The quota webhook: ``admit`` judges the request and raises ``AdmissionDenied`` to refuse
    it, with upstream's words and code."""

    async def review(review: dict[str, Any]) -> dict[str, Any]:
        attributes = attributes_from_review(review)
        try:
            await admit(attributes)
        except AdmissionDenied as denied:
            if denied.code != 403:
                # Not a quota saying no (403) but admission failing to decide: a timeout,
                # writes that kept conflicting, an object or quota it cannot read.
                logger.warning(
                    "quota admission refused %s with %d: %s",
                    _describe(review), denied.code, denied.message,
                )  # fmt: skip
            return review_response(review, False, denied.message, denied.code)
        return review_response(review, True)

    return review


async def podset_review(review: dict[str, Any]) -> dict[str, Any]:
    """PodSet validation (apps/v1 ReplicaSet rules): 422 with the API server's own wording."""
    request = review["request"]
    new = request.get("object")
    if new is None:
        return review_response(review, True)  # a DELETE: nothing to validate
    errors = validation.validate_podset(new, request.get("oldObject"))
    if errors:
        name = str(request.get("name") or (new.get("metadata") or {}).get("name") or "")
        return review_response(review, False, validation.invalid_message(name, errors), 422)
    return review_response(review, True)


def clusterquota_review(
    registry: Registry,
    catalog: MeasureCatalog | None = None,
    cluster_quotas: Callable[[], Iterable[Mapping[str, Any]]] = tuple,
) -> ReviewHandler:
    """ClusterQuota validation: ResourceQuota's rules for the spec (resource names, quantities,
    scopes) and a label selector that parses; measures that compile, over a kind tally can
    measure, defined as every other ClusterQuota (``cluster_quotas``) defines the same name;
    422, as the API server refuses an invalid object, with every problem named."""
    catalog = catalog if catalog is not None else MeasureCatalog()

    async def review(review: dict[str, Any]) -> dict[str, Any]:
        request = review["request"]
        new = request.get("object")
        if new is None:
            return review_response(review, True)
        errors = cluster_quota.validate(new)
        # Compiling runs cel-cpp's checker (about a millisecond per measure): few measures,
        # written rarely; not worth a thread.
        errors.extend(catalog.problems(new, cluster_quotas()))
        defined = {measure.name for measure in catalog.defined(new)}
        raw_hard = cluster_quota.spec_quota(new).get("hard")
        for resource in sorted(raw_hard) if isinstance(raw_hard, Mapping) else ():
            if str(resource) not in defined and not _measurable(registry, str(resource)):
                errors.append(
                    f'spec.quota.hard[{resource}]: Unsupported value: "{resource}": not a '
                    "resource any quota evaluator measures"
                )
        if errors:
            name = str(request.get("name") or (new.get("metadata") or {}).get("name") or "")
            message = f'ClusterQuota.tally.dev "{name}" is invalid: ' + (
                errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
            )
            return review_response(review, False, message, 422)
        return review_response(review, True)

    return review


def _measurable(registry: Registry, resource: str) -> bool:
    """Whether some evaluator measures ``resource``, or it counts objects (``count/<r>.<g>``:
    the kind may be created later, as for a ResourceQuota)."""
    if group_resource_for_count_name(resource) is not None:
        return True
    return any(evaluator.matching_resources([resource]) for evaluator in registry.list())


def _describe(review: Mapping[str, Any]) -> str:
    request = review["request"]
    resource = request["resource"]
    kind = str(GroupResource(resource["group"], resource["resource"]))
    sub = f"/{request['subResource']}" if request.get("subResource") else ""
    where = f"{request.get('namespace') or ''}/{request.get('name') or ''}"
    return f"{request['operation']} {kind}{sub} {where}"
