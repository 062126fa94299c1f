"""The PodSet recorder's Kubernetes side: :class:`tally.podset.client.KubeEventSink` and
:class:`~tally.podset.client.KubeEventRecorder`, on a fake API client that records requests.

What goes over the wire (paths, methods, content types, bodies) and how API errors reach the
sink loop (an answered error is a :class:`tally.machinery.broadcaster.StatusError`, never retried;
anything else propagates and is retried). The correlator itself is ``test_events.py``'s.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client

from tally.machinery.broadcaster import StatusError
from tally.machinery.eventtypes import Event
from tally.podset.client import KubeEventRecorder, KubeEventSink
from tally.workqueue import FakeClock, TokenBucket

pytestmark = pytest.mark.unit


class FakeApi:
    """Records ``call_api`` requests; answers with the body plus a resourceVersion, or raises
    the next error in ``errors``."""

    def __init__(self, errors: list[BaseException] | None = None) -> None:
        self.requests: list[tuple[str, str, str, Any]] = []
        self.errors = list(errors or [])
        self.stored: dict[str, Any] = {}

    async def call_api(self, path: str, method: str, **kwargs: Any) -> Any:
        content_type = kwargs["header_params"]["Content-Type"]
        self.requests.append((method, path, content_type, kwargs["body"]))
        assert [("fieldManager", "tally")] == kwargs["query_params"]
        if self.errors:
            raise self.errors.pop(0)
        if method == "POST":
            body = dict(kwargs["body"])
            body["metadata"] = {**body["metadata"], "resourceVersion": "1"}
            self.stored[body["metadata"]["name"]] = body
            return body
        name = path.rsplit("/", 1)[1]
        patched = {**self.stored[name], **kwargs["body"]}
        self.stored[name] = patched
        return patched


def _api_exception(status: int, body: dict[str, Any]) -> client.ApiException:
    error = client.ApiException(status=status, reason="reason")
    error.body = json.dumps(body)
    return error


PODSET = {
    "apiVersion": "tally.dev/v1alpha1",
    "kind": "PodSet",
    "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "resourceVersion": "5"},
}


async def test_recorder_creates_then_patches_the_same_event() -> None:
    api = FakeApi()
    recorder = KubeEventRecorder(api)  # type: ignore[arg-type]
    recorder.event(PODSET, "Warning", "FailedCreate", "Error creating: quota")
    recorder.event(PODSET, "Warning", "FailedCreate", "Error creating: quota")
    await recorder.flush()
    (post, patch) = api.requests
    assert ("POST", "/api/v1/namespaces/ns/events", "application/json") == post[:3]
    body = post[3]
    assert {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "PodSet",
        "name": "web",
        "namespace": "ns",
        "uid": "u1",
        "resourceVersion": "5",
    } == body["involvedObject"]
    assert {"component": "tally-podset-controller"} == body["source"]
    assert ("FailedCreate", "Error creating: quota", "Warning", 1) == (
        body["reason"],
        body["message"],
        body["type"],
        body["count"],
    )
    name = body["metadata"]["name"]
    assert name.startswith("web.")
    assert (
        "PATCH",
        f"/api/v1/namespaces/ns/events/{name}",
        "application/strategic-merge-patch+json",
    ) == patch[:3]
    assert ["count", "lastTimestamp", "message"] == list(patch[3])
    assert 2 == patch[3]["count"]


async def test_sink_turns_answered_errors_into_status_errors() -> None:
    answered = _api_exception(
        403,
        {
            "message": 'events "x" is forbidden: unable to create new content in namespace ns '
            "because it is being terminated",
            "details": {"causes": [{"reason": "NamespaceTerminating"}]},
        },
    )
    sink = KubeEventSink(FakeApi([answered]))  # type: ignore[arg-type]
    with pytest.raises(StatusError) as raised:
        await sink.create(Event(name="x", namespace="ns"))
    assert 403 == raised.value.code
    assert ("NamespaceTerminating",) == raised.value.causes
    assert "being terminated" in str(raised.value)


async def test_sink_lets_transport_errors_through_for_retry() -> None:
    sink = KubeEventSink(FakeApi([ConnectionError("refused")]))  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):
        await sink.create(Event(name="x", namespace="ns"))


async def test_recorder_retries_a_transport_error_then_gives_up_on_shutdown() -> None:
    """Best effort: a failed write is logged, never raised to the controller; flush ends the
    retries instead of sleeping 10 s."""
    api = FakeApi([ConnectionError("refused")])
    recorder = KubeEventRecorder(api)  # type: ignore[arg-type]
    recorder.event(PODSET, "Normal", "SuccessfulCreate", "Created pod: web-1")
    await recorder.flush()
    assert 1 == len(api.requests)
    assert {} == api.stored


async def test_event_writes_share_the_controller_limiter() -> None:
    """Upstream's Event sink uses the replicaset-controller's client, so its writes spend the
    same ``--kube-api-qps`` budget; tally's recorder takes the PodSet limiter likewise."""
    sleeps: list[float] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    limiter = TokenBucket(1, 1, clock=FakeClock(), sleep=sleep)
    recorder = KubeEventRecorder(FakeApi(), limiter=limiter)  # type: ignore[arg-type]
    recorder.event(PODSET, "Normal", "SuccessfulCreate", "Created pod: web-1")
    recorder.event(PODSET, "Normal", "SuccessfulDelete", "Deleted pod: web-1")
    await recorder.flush()
    assert [1.0] == sleeps  # the second write waited for the second token
