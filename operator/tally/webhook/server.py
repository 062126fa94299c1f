"""tally's admission webhook server: AdmissionReview in, verdict out, on its own aiohttp app.

Why not Kopf's webhook server: Kopf's public API cannot reload a certificate without
restarting the server (closing the port: the API server then refuses requests under
failurePolicy Fail), has no place for the API server's client CA (mutual TLS), deep-copies
every reviewed object to build an empty patch, and answers 404 for a resource its own CRD
watch has not seen yet (a ``count/`` resource a quota names right after its CRD appeared). Kopf
stays what tally is built on: the watches, start-up and clean-up, and probes.

The envelope is checked first, with a pydantic model of exactly the fields tally reads
(:func:`parse_review`): a body that is not UTF-8, not JSON or not an AdmissionReview gets a
400 naming what is wrong, never an allow (the API server applies the failure policy). The
object itself (``object``/``oldObject``) stays free-form: the evaluators report what they
cannot read. One translation to quota admission's :class:`Attributes`
(:func:`attributes_from_review`).

Routes: ``POST /<webhook id>`` for each handler (``/quota``, ``/validate-podsets``: the paths
:mod:`tally.webhook.configuration` registers); any other path is a 404.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Literal

import aiohttp.web
from pydantic import BaseModel, ConfigDict, ValidationError

from tally.admission.attributes import Attributes
from tally.admission.errors import AdmissionDenied
from tally.clusterquota import quota as cluster_quota
from tally.clusterquota.measures import MeasureCatalog
from tally.evaluators.base import GroupResource
from tally.evaluators.registry import Registry, group_resource_for_count_name
from tally.podset import validation

logger = logging.getLogger(__name__)


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


def parse_review(body: bytes) -> dict[str, Any]:
    """The JSON of a valid AdmissionReview request, or :class:`ReviewError`."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ReviewError(f"the body is not UTF-8 text: {error.reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ReviewError(f"the body is not JSON: {error}") from None
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
"""How long a stopping server lets requests in progress finish (quota admission answers within
its own 9.5 s timeout)."""


class WebhookServer:
    """tally's admission endpoints on tally's own aiohttp application: ``POST /<webhook id>``
    for each handler, over TLS with the :class:`ssl.SSLContext` it is given.

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
    ) -> None:
        """``access_log``: a line per request (aiohttp's access log); off by default, as
        upstream's admission plugin logs none and a busy cluster's log would fill with pod
        creates."""
        self.handlers = dict(handlers)
        self.addr = addr
        self.port = port
        self.context = context
        self._access_log = access_log
        self._runner: aiohttp.web.AppRunner | None = None

    async def start(self) -> None:
        app = aiohttp.web.Application()
        app.add_routes([aiohttp.web.post("/{id}", self._serve)])
        kwargs: dict[str, Any] = {} if self._access_log else {"access_log": None}
        runner = aiohttp.web.AppRunner(
            app, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S, **kwargs
        )
        await runner.setup()
        site = aiohttp.web.TCPSite(
            runner,
            self.addr,
            self.port,
            ssl_context=self.context,
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        logger.info("serving admission webhooks at https://%s:%d/{%s}", self.addr, self.port,
                    ",".join(sorted(self.handlers)))  # fmt: skip

    async def stop(self) -> None:
        """Close the port and let requests in progress finish (at most ``SHUTDOWN_TIMEOUT_S``)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _serve(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        handler = self.handlers.get(request.match_info["id"])
        if handler is None:
            raise aiohttp.web.HTTPNotFound(reason=f"no webhook at {request.path}")
        try:
            review = parse_review(await request.read())
        except ReviewError as error:
            raise aiohttp.web.HTTPBadRequest(reason=str(error)) from None
        try:
            response = await handler(review)
        except Exception as error:
            # Never an allow: the request is refused with the error, as upstream's plugin
            # refuses what it failed to evaluate.
            logger.exception("webhook %s failed on %s", request.path, _describe(review))
            response = review_response(review, False, f"tally failed: {error}", 500)
        return aiohttp.web.json_response(response)


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
