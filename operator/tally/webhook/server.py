"""The AdmissionReview boundary: what a request to tally's webhook must look like.

Kopf's webhook server turns only malformed JSON into a 400; a body that is not UTF-8, or JSON
that is not an AdmissionReview, escapes its handler as a TypeError/KeyError and aiohttp answers
an opaque "500 Server got itself in trouble". tally's server checks the envelope first, with a
pydantic model of exactly the fields Kopf and tally read, and answers 400 naming what is wrong.
A request refused here is never allowed: the API server applies the failure policy (Fail).

What is left to Kopf and tally: the object itself (``object``/``oldObject`` stay free-form;
evaluators report what they cannot read), and the decision.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, cast

import aiohttp.web
import kopf

# Kopf's webhook errors are not exported; its own ``_serve`` maps them to HTTP statuses, which
# this module's ``_serve`` does in its place (Kopf is pinned: pyproject.toml).
from kopf._cogs.structs import reviews
from kopf._core.engines.admission import (
    AmbiguousResourceError,
    UnknownResourceError,
    WebhookError,
)
from pydantic import BaseModel, ConfigDict, ValidationError

from tally.admission.attributes import Attributes
from tally.evaluators.base import GroupResource


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


Fallback = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""Answers a whole AdmissionReview (returns the response review)."""


def review_response(
    review: Mapping[str, Any], allowed: bool, message: str = "", code: int = 0
) -> dict[str, Any]:
    """An AdmissionReview response for ``review``, shaped as Kopf shapes its own."""
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


class WebhookServer(kopf.WebhookServer):
    """Kopf's webhook server, with the AdmissionReview checked before Kopf sees it, serving
    with tally's own SSL context (see :meth:`_build_ssl`).

    ``fallbacks`` answer a handler id themselves when Kopf does not know the request's
    resource yet (404). That happens for a custom resource a quota names right after its CRD
    appeared: tally widens its webhook rules at once, while Kopf learns about the resource only
    from its own CRD watch, which can lag. Failing closed there would refuse creates that a
    quota allows.
    """

    def __init__(self, *, fallbacks: Mapping[str, Fallback] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fallbacks = dict(fallbacks or {})

    def _build_ssl(self) -> tuple[bytes | None, ssl.SSLContext | None]:
        """The context tally built (``context=``), as it is. Kopf would otherwise load
        certificate files into it and restart the whole server whenever they change, closing
        the port for a moment (the API server then refuses requests, failurePolicy Fail);
        :mod:`tally.webhook.tls` reloads the certificate inside the running context instead."""
        if self.context is None:
            raise ValueError("tally's webhook server needs its SSL context (context=)")
        return self.cadata, self.context

    async def _serve(  # type: ignore[override]
        self, fn: kopf.WebhookFn, request: aiohttp.web.Request
    ) -> aiohttp.web.Response:
        """Kopf's ``WebhookServer._serve`` on the review parsed and checked once: Kopf's own
        would read the body and parse the JSON a second time (a pod's review, for every
        create). The errors map to the same HTTP statuses as Kopf's."""
        try:
            review = parse_review(await request.read())
        except ReviewError as error:
            raise aiohttp.web.HTTPBadRequest(reason=str(error)) from None
        webhook = request.match_info.get("id")
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            response: Mapping[str, Any] = await fn(
                cast(reviews.Request, review),
                webhook=webhook,
                sslpeer=sslpeer,
                headers=dict(request.headers),
            )
        except UnknownResourceError as error:
            fallback = self.fallbacks.get(webhook or "")
            if fallback is None:
                raise aiohttp.web.HTTPNotFound(reason=str(error) or None) from None
            response = await fallback(review)
        except AmbiguousResourceError as error:
            raise aiohttp.web.HTTPConflict(reason=str(error) or None) from None
        except WebhookError as error:
            raise aiohttp.web.HTTPBadRequest(reason=str(error) or None) from None
        return aiohttp.web.json_response(response)
