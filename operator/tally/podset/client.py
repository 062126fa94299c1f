"""The PodSet controller's writes over kubernetes-asyncio: pods, PodSet status, Events.

Every call has a timeout, carries tally's field manager, and turns API failures into
:class:`tally.podset.controller.PodControlError` with the HTTP status and the Status causes
(the controller needs "namespace terminating" and "not found" apart from other errors).

Events go through :class:`tally.machinery.broadcaster.EventBroadcaster` (client-go's recorder
and correlator): recorded without blocking, aggregated, counted and spam-filtered, then created
or patched by one background task through :class:`KubeEventSink`. A lost Event must never fail
or slow a sync.

An optional :class:`tally.workqueue.TokenBucket` (``TALLY_PODSET_QPS`` /
``TALLY_PODSET_BURST``, built by :func:`token_bucket`) sits in front of the pod writes, the
PodSet reads and status writes, and the Event writes, like the client-side rate limiter of
kube-controller-manager's ``replicaset-controller`` client (``--kube-api-qps`` 20 /
``--kube-api-burst`` 30 by default), which its Event sink shares, so the two can be compared
on equal terms. Each request first awaits :meth:`~tally.workqueue.TokenBucket.wait`
(client-go's ``flowcontrol.NewTokenBucketRateLimiter``): concurrent requests are served in call
order at exactly ``qps``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any, Final

from kubernetes_asyncio import client

from tally.kube import rest
from tally.machinery.broadcaster import EventBroadcaster, StatusError
from tally.machinery.errors import Conflict
from tally.machinery.eventtypes import (
    Event,
    EventSource,
    ObjectReference,
    event_from_json,
    event_to_json,
)
from tally.podset.claim import PATCH_CONTENT_TYPE, PODSET_API_VERSION, PODSET_KIND
from tally.podset.controller import PodControlError
from tally.workqueue import TokenBucket

logger = logging.getLogger(__name__)

GROUP: Final = "tally.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "podsets"
COMPONENT: Final = "tally-podset-controller"


def _status_of(error: client.ApiException) -> tuple[str, list[str]]:
    """The Status message and its causes' reasons (``details.causes[].reason``)."""
    message = str(error.reason or "")
    causes: list[str] = []
    try:
        body = json.loads(error.body or "{}")
        message = body.get("message") or message
        causes = [c.get("reason", "") for c in (body.get("details") or {}).get("causes") or []]
    except (TypeError, ValueError, AttributeError):
        pass
    return message, causes


def _control_error(error: client.ApiException) -> PodControlError:
    message, causes = _status_of(error)
    return PodControlError(message, status=int(error.status or 0), causes=causes)


def token_bucket(qps: float, burst: int) -> TokenBucket | None:
    """The limiter the settings ask for: None (unlimited) when ``qps`` is 0; a ``burst`` of 0
    means ``ceil(qps)`` (one second's worth). A cancelled ``wait`` keeps its token (client-go's
    ``Wait`` would give it back): at worst one is lost per cancellation."""
    if qps <= 0:
        return None
    return TokenBucket(qps, burst if burst > 0 else max(1, math.ceil(qps)))


class KubePodControl:
    def __init__(self, api: client.ApiClient, *, limiter: TokenBucket | None = None) -> None:
        self._api = api
        self._limiter = limiter

    async def _call(self, path: str, method: str, body: Any, content_type: str) -> Any:
        if self._limiter is not None:
            await self._limiter.wait()
        try:
            return await self._api.call_api(
                path,
                method,
                query_params=[("fieldManager", rest.FIELD_MANAGER)] if method != "DELETE" else [],
                body=body,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                response_types_map={200: "object", 201: "object", 202: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=rest.REQUEST_TIMEOUT_S,
            )
        except client.ApiException as error:
            raise _control_error(error) from error

    async def create_pod(self, namespace: str, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        path = rest.collection_path("", "v1", "pods", namespace)
        created = await self._call(path, "POST", dict(pod), "application/json")
        return created if isinstance(created, Mapping) else {}

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        path = rest.collection_path("", "v1", "pods", namespace) + f"/{name}"
        # The UID precondition: never delete a re-created pod of the same name.
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._call(path, "DELETE", body, "application/json")

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        path = rest.collection_path("", "v1", "pods", namespace) + f"/{name}"
        await self._call(path, "PATCH", dict(patch), PATCH_CONTENT_TYPE)


class KubePodSetClient:
    def __init__(self, api: client.ApiClient, *, limiter: TokenBucket | None = None) -> None:
        self._api = api
        self._limiter = limiter

    def _path(self, namespace: str, name: str) -> str:
        return rest.collection_path(GROUP, VERSION, PLURAL, namespace) + f"/{name}"

    async def get_podset(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        if self._limiter is not None:
            await self._limiter.wait()
        try:
            return await rest.get_json(self._api, self._path(namespace, name))
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    async def update_status(
        self, podset: Mapping[str, Any], new_status: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        metadata = podset["metadata"]
        path = self._path(metadata["namespace"], metadata["name"]) + "/status"
        if self._limiter is not None:
            await self._limiter.wait()
        # The object as read, resourceVersion included: a 409 means it changed meanwhile and
        # the sync is retried from a fresher cache.
        try:
            return await rest.put_json(self._api, path, {**podset, "status": dict(new_status)})
        except client.ApiException as error:
            if error.status == 409:
                key = f"{metadata['namespace']}/{metadata['name']}"
                raise Conflict(f"{key}: {error.reason}") from error
            raise


class KubeEventSink:
    """:class:`tally.machinery.broadcaster.EventSink` over the core/v1 events API (client-go's
    ``EventSinkImpl``): POST to create, strategic merge PATCH to count a repeat."""

    def __init__(self, api: client.ApiClient, *, limiter: TokenBucket | None = None) -> None:
        self._api = api
        self._limiter = limiter

    async def _call(self, path: str, method: str, body: Any, content_type: str) -> Event:
        if self._limiter is not None:
            await self._limiter.wait()
        try:
            raw = await self._api.call_api(
                path,
                method,
                query_params=[("fieldManager", rest.FIELD_MANAGER)],
                body=body,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                response_types_map={200: "object", 201: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=rest.REQUEST_TIMEOUT_S,
            )
        except client.ApiException as error:
            # The server answered: the correlator's sink loop must not retry (upstream's
            # StatusError). Anything else (no connection, a timeout) propagates and is retried.
            message, causes = _status_of(error)
            raise StatusError(int(error.status or 0), message, tuple(causes)) from error
        return event_from_json(raw if isinstance(raw, Mapping) else {})

    async def create(self, event: Event) -> Event:
        path = rest.collection_path("", "v1", "events", event.namespace)
        return await self._call(path, "POST", event_to_json(event), "application/json")

    async def patch(self, event: Event, patch: Mapping[str, Any] | None) -> Event:
        path = rest.collection_path("", "v1", "events", event.namespace) + f"/{event.name}"
        return await self._call(path, "PATCH", dict(patch or {}), PATCH_CONTENT_TYPE)


class KubeEventRecorder:
    """Records Events about PodSets like upstream's ReplicaSet controller: through client-go's
    correlator (aggregation, counting, spam filter) and one background writer
    (:class:`tally.machinery.broadcaster.EventBroadcaster`), with source
    ``tally-podset-controller``."""

    def __init__(self, api: client.ApiClient, *, limiter: TokenBucket | None = None) -> None:
        self._broadcaster = EventBroadcaster(
            KubeEventSink(api, limiter=limiter), EventSource(component=COMPONENT)
        )

    def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        metadata = obj.get("metadata") or {}
        # ``ref.GetReference``: the object as the controller saw it, resourceVersion included
        # (no correlation key uses it).
        ref = ObjectReference(
            kind=PODSET_KIND,
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            uid=str(metadata.get("uid") or ""),
            api_version=PODSET_API_VERSION,
            resource_version=str(metadata.get("resourceVersion") or ""),
        )
        self._broadcaster.event(ref, type_, reason, message)

    async def flush(self, within: float | None = None) -> None:
        """For shutdown: write what is queued (each Event tried once, for ``within`` seconds
        at most) and stop the writer; Events recorded afterwards are dropped."""
        await self._broadcaster.shutdown(within)
