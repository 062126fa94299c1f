"""The core/v1 Event as tally's recorder and correlator handle it: its fields, the object it is
about, its source, its JSON, its name and its valid types.

Ported from ``k8s.io/api/core/v1`` (``Event``, ``ObjectReference``, ``EventSource``, and
``metav1.Time``'s JSON) and client-go v0.37.1 ``tools/record/util`` (``GenerateEventName``,
``ValidateEventType``). Its own module because three parties share it:
:mod:`tally.machinery.correlator` compares and counts Events, :mod:`tally.machinery.broadcaster`
builds and writes them, and the Kubernetes sink (``tally.podset.client.KubeEventSink``) sends
and reads the wire form.

Pure: frozen dataclasses and functions over them. Timestamps are wall-clock nanoseconds since
the Unix epoch, ``None`` where Go has the zero time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any, Final

from tally.machinery import validation

EVENT_TYPE_NORMAL: Final = "Normal"
EVENT_TYPE_WARNING: Final = "Warning"

# -- the Event ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectReference:
    """``v1.ObjectReference``: the object an Event is about. Empty strings are Go's zero values."""

    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""
    api_version: str = ""
    resource_version: str = ""
    """The object's resourceVersion when the Event was recorded; no key includes it, so Events
    about successive versions of one object are still correlated."""
    field_path: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class EventSource:
    """``v1.EventSource``: the component (and host) that reports the Event."""

    component: str = ""
    host: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """The fields of a core/v1 ``Event`` the recorder and correlator use.

    Timestamps are wall-clock nanoseconds since the Unix epoch, ``None`` where Go has the zero
    time; on the wire they have whole seconds (``metav1.Time``).
    """

    name: str = ""
    namespace: str = ""
    resource_version: str = ""
    """``metadata.resourceVersion`` the server last answered with (kept, never sent in a patch)."""
    involved_object: ObjectReference = ObjectReference()
    reason: str = ""
    message: str = ""
    source: EventSource = EventSource()
    first_timestamp: int | None = None
    last_timestamp: int | None = None
    count: int = 0
    type: str = ""
    reporting_controller: str = ""
    """``reportingComponent`` on the wire."""
    reporting_instance: str = ""


# -- the wire form -----------------------------------------------------------------------------

_RFC3339: Final = "%Y-%m-%dT%H:%M:%SZ"
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def format_time(ns: int | None) -> str | None:
    """``metav1.Time`` JSON: RFC 3339 in UTC, whole seconds; ``None`` (null) for the zero time."""
    if ns is None:
        return None
    return (_EPOCH + dt.timedelta(seconds=ns // 1_000_000_000)).strftime(_RFC3339)


def parse_time(raw: Any) -> int | None:
    """The inverse of :func:`format_time` (fractions of a second are accepted, as Go's RFC 3339
    parser does)."""
    if not isinstance(raw, str) or not raw:
        return None
    parsed = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return ((parsed - _EPOCH) // dt.timedelta(microseconds=1)) * 1000


def _omit_empty(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value not in ("", None, 0)}


def event_to_json(event: Event) -> dict[str, Any]:
    """The body of a create: a core/v1 ``Event`` as JSON (empty fields left out, like Go's
    ``omitempty``; the two reporting fields are always sent, as in Go)."""
    ref = event.involved_object
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": _omit_empty(
            {
                "name": event.name,
                "namespace": event.namespace,
                "resourceVersion": event.resource_version,
            }
        ),
        "involvedObject": _omit_empty(
            {
                "kind": ref.kind,
                "namespace": ref.namespace,
                "name": ref.name,
                "uid": ref.uid,
                "apiVersion": ref.api_version,
                "resourceVersion": ref.resource_version,
                "fieldPath": ref.field_path,
            }
        ),
        **_omit_empty({"reason": event.reason, "message": event.message}),
        "source": _omit_empty({"component": event.source.component, "host": event.source.host}),
        "firstTimestamp": format_time(event.first_timestamp),
        "lastTimestamp": format_time(event.last_timestamp),
        **_omit_empty({"count": event.count, "type": event.type}),
        "reportingComponent": event.reporting_controller,
        "reportingInstance": event.reporting_instance,
    }
    return body


def event_from_json(raw: Mapping[str, Any]) -> Event:
    """An Event as the server returned it (what :meth:`EventCorrelator.update_state` learns)."""
    metadata = raw.get("metadata") or {}
    ref = raw.get("involvedObject") or {}
    source = raw.get("source") or {}
    return Event(
        name=str(metadata.get("name") or ""),
        namespace=str(metadata.get("namespace") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        involved_object=ObjectReference(
            kind=str(ref.get("kind") or ""),
            namespace=str(ref.get("namespace") or ""),
            name=str(ref.get("name") or ""),
            uid=str(ref.get("uid") or ""),
            api_version=str(ref.get("apiVersion") or ""),
            resource_version=str(ref.get("resourceVersion") or ""),
            field_path=str(ref.get("fieldPath") or ""),
        ),
        reason=str(raw.get("reason") or ""),
        message=str(raw.get("message") or ""),
        source=EventSource(
            component=str(source.get("component") or ""), host=str(source.get("host") or "")
        ),
        first_timestamp=parse_time(raw.get("firstTimestamp")),
        last_timestamp=parse_time(raw.get("lastTimestamp")),
        count=int(raw.get("count") or 0),
        type=str(raw.get("type") or ""),
        reporting_controller=str(raw.get("reportingComponent") or ""),
        reporting_instance=str(raw.get("reportingInstance") or ""),
    )


# -- name and type -----------------------------------------------------------------------------


def generate_event_name(ref_name: str, unix_nano: int) -> str:
    """``<object name>.<UnixNano in hex>``, or a random UUID where that is no valid name (a
    long object name; issues.k8s.io/127594)."""
    name = f"{ref_name}.{unix_nano:x}"
    if validation.is_dns1123_subdomain(name):
        return str(uuid.uuid4())
    return name


def validate_event_type(event_type: str) -> bool:
    return event_type in (EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING)
