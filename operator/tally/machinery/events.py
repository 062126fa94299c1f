"""core/v1 Events on their way from a controller to the API server: client-go's correlator and
the loop that writes its answers (``k8s.io/client-go/tools/record`` v0.37.1).

This module owns everything between "a controller records an Event" and "the API server holds
it", ported from ``events_cache.go`` (the correlator) and ``event.go`` (recorder, broadcaster,
``recordToSink``):

* :class:`EventCorrelator` runs every Event through three steps, in upstream's order
  (``EventCorrelate``):

  1. **aggregate** (:class:`EventAggregator`): once 10 Events that differ only in their
     message (same source, object, type, reason) are seen within 600 s of each other, the 10th
     and later ones become one Event whose message is ``(combined from similar events): `` plus
     the latest message;
  2. **observe** (``eventLogger``, de-duplication): an Event seen before (same
     :func:`get_event_key`; for an aggregate, the same aggregate key) is not created again but
     patched: its ``count`` goes up and ``lastTimestamp``/``message`` are replaced;
  3. **filter** (:class:`EventSourceObjectSpamFilter`): a token bucket per source, object and
     type (:func:`get_spam_key`; :class:`tally.workqueue.TokenBucket`, asked passively) lets 25
     Events through at once and one more every 300 s; the rest are dropped.

  So a PodSet scaled 0 → 500 costs 9 creates, 1 create of the aggregate and 15 patches of it (25
  writes; the 475 later ``SuccessfulCreate`` Events are dropped), like kube-controller-manager's
  ReplicaSet controller, instead of 500 creates. The caches are LRUs of 4096 entries.
* :func:`record_to_sink` / :func:`record_event` write one correlated Event through an
  :class:`EventSink`: create it, or patch it when the correlator says it exists (and create it
  after all when the patch answers 404); retry up to 12 tries, 10 s apart, when the server could
  not be reached, never when it answered with an error status; tell the correlator what the
  server stored (``UpdateState``).
* :class:`EventBroadcaster` is the part of upstream's broadcaster and recorder a controller
  uses: :meth:`EventBroadcaster.event` builds the Event (``makeEvent``) and queues it without
  ever blocking (at most 1000 queued, later ones dropped); one task writes the queue through
  the correlator and the sink, one Event after another, as upstream's single watcher goroutine
  does. Serial on purpose: a patch must follow the create it patches, and the correlator must
  learn each answer before it decides about the next Event.

Pure: no Kopf, no API client; the sink is a protocol, time comes from an injectable
:class:`tally.workqueue.Clock`, read with ``time_ns()`` (wall-clock nanoseconds: Events carry
dates, and aggregate names carry ``UnixNano``). Everything runs on one event loop, so the
mutexes upstream takes are left out.

Names follow upstream (``event_correlate``, ``event_aggregate``, ``event_observe``,
``update_state``, ``filter``); upstream's ``CorrelatorOptions`` are the keyword arguments of
:class:`EventCorrelator`, defaults as in ``populateDefaults``.

Deliberately left out: ``StartLogging``/``StartStructuredLogging`` and fan-out to several
watchers (tally has one sink); ``AnnotatedEventf`` and the events/v1 API (``tools/events``); the
``Update`` method of the sink (``recordToSink`` never calls it); the rest client's own retries
of 429/5xx answers that carry ``Retry-After``. Two differences from upstream:
:meth:`EventBroadcaster.shutdown` tries each Event still queued once (upstream drops them when
its context is cancelled) so that a graceful stop loses nothing it could write; and a sink
error that is neither :class:`StatusError` nor :class:`RequestConstructionError` (upstream's
"actual http transport errors") is any other ``Exception`` here, so a bug in a sink is retried
like a broken connection, 12 times, logged each time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import logging
import random
import re
import struct
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Generic, Protocol, TypeVar

from tally.workqueue import clock as clocks
from tally.workqueue import tokenbucket

logger = logging.getLogger(__name__)

MAX_LRU_CACHE_ENTRIES: Final = 4096
"""Entries in each of the correlator's three LRU caches (``maxLruCacheEntries``)."""
DEFAULT_AGGREGATE_MAX_EVENTS: Final = 10
"""More than this many Events that vary only by message within the interval below are
aggregated ("if we see the same event that varies only by message more than 10 times in a 10
minute period, aggregate the event"); in the code the 10th already is."""
DEFAULT_AGGREGATE_INTERVAL_IN_SECONDS: Final = 600
"""How long after the last similar Event a new one still counts as similar."""
DEFAULT_SPAM_BURST: Final = 25
"""Events a source may send about one object at once ("allow a source to send 25 events about
an object but control the refill rate to 1 new event every 5 minutes; this helps control the
long-tail of events for things that are always unhealthy")."""
DEFAULT_SPAM_QPS: Final = 1.0 / 300.0
"""The spam filter's refill rate: one Event per 300 s per source and object."""

MAX_TRIES_PER_EVENT: Final = 12
"""Attempts to write one Event before it is given up (``maxTriesPerEvent``)."""
DEFAULT_SLEEP_DURATION: Final = 10.0
"""Seconds between attempts; the first sleep is a random fraction of it, so that clients do not
all retry in step after the API server comes back."""
MAX_QUEUED_EVENTS: Final = 1000
"""Events waiting to be written before new ones are dropped (``maxQueuedEvents``): recording
must never block a controller, and a controller that outruns the API server loses Events, not
memory."""

EVENT_TYPE_NORMAL: Final = "Normal"
EVENT_TYPE_WARNING: Final = "Warning"
NAMESPACE_DEFAULT: Final = "default"
NAMESPACE_TERMINATING_CAUSE: Final = "NamespaceTerminating"
"""``v1.NamespaceTerminatingCause``: a write refused because the namespace is going away."""

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


_EPOCH_JSON: Final = format_time(0)


def two_way_merge_patch(event: Event) -> dict[str, Any]:
    """What ``eventObserve``'s ``strategicpatch.CreateTwoWayMergePatch`` produces.

    Upstream diffs the Event against a copy with ``count`` 0, ``lastTimestamp`` at the Unix
    epoch and an empty ``message``, so the patch holds exactly those of the three fields whose
    JSON differs: ``count`` unless 0 (``omitempty``), ``lastTimestamp`` unless it formats as the
    epoch (``null`` when unset), ``message`` unless empty. Everything else, the resourceVersion
    included, is equal on both sides and therefore absent. Keys in Go's (sorted) order.
    """
    patch: dict[str, Any] = {}
    if event.count != 0:
        patch["count"] = event.count
    last = format_time(event.last_timestamp)
    if last != _EPOCH_JSON:
        patch["lastTimestamp"] = last
    if event.message:
        patch["message"] = event.message
    return patch


# -- keys --------------------------------------------------------------------------------------

# Upstream joins the fields with no separator; kept, so that tally's keys are upstream's.


def get_event_key(event: Event) -> str:
    """Identifies an Event for de-duplication: source, object (with field path), type, reason
    and message."""
    ref = event.involved_object
    return "".join(
        (
            event.source.component,
            event.source.host,
            ref.kind,
            ref.namespace,
            ref.name,
            ref.field_path,
            ref.uid,
            ref.api_version,
            event.type,
            event.reason,
            event.message,
        )
    )


def get_spam_key(event: Event) -> str:
    """Identifies a source and object (and type) for the spam filter: reason and message are not
    part of it, so every Normal Event about one object shares one bucket."""
    ref = event.involved_object
    return "".join(
        (
            event.source.component,
            event.source.host,
            ref.kind,
            ref.namespace,
            ref.name,
            ref.uid,
            ref.api_version,
            event.type,
        )
    )


EventSpamKeyFunc = Callable[[Event], str]
EventAggregatorKeyFunc = Callable[[Event], tuple[str, str]]
"""Returns ``(aggregate_key, local_key)``: the group an Event is aggregated in, and what makes
it distinct inside that group."""
EventAggregatorMessageFunc = Callable[[Event], str]


def event_aggregator_by_reason_func(event: Event) -> tuple[str, str]:
    """Aggregates Events that match exactly on source, object (without field path), type,
    reason, reporting controller and instance; the message tells them apart."""
    ref = event.involved_object
    aggregate_key = "".join(
        (
            event.source.component,
            event.source.host,
            ref.kind,
            ref.namespace,
            ref.name,
            ref.uid,
            ref.api_version,
            event.type,
            event.reason,
            event.reporting_controller,
            event.reporting_instance,
        )
    )
    return aggregate_key, event.message


def event_aggregator_by_reason_message_func(event: Event) -> str:
    """The message of an aggregate: the latest message, prefixed."""
    return "(combined from similar events): " + event.message


# -- LRU and the spam rate ---------------------------------------------------------------------

K = TypeVar("K")
V = TypeVar("V")


class _LRU(Generic[K, V]):
    """``k8s.io/utils/lru``: ``get`` and ``add`` make an entry the most recent; ``add`` beyond
    ``max_entries`` evicts the least recent (0 = unbounded)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        #: Least recently used first.
        self._entries: collections.OrderedDict[K, V] = collections.OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def add(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        if self.max_entries and len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def _float32(value: float) -> float:
    """Upstream's spam QPS is a ``float32``: 1/300 is 0.0033333334 there, not 0.00333...33."""
    rounded: float = struct.unpack("f", struct.pack("f", value))[0]
    return rounded


_NS_PER_SECOND: Final = 1e9
"""Nanoseconds in a second: the scale of the wall-clock times the spam filter's buckets are
given (:meth:`tally.workqueue.TokenBucket.allow` divides elapsed time by it)."""


# -- the correlator's three parts --------------------------------------------------------------


class EventSourceObjectSpamFilter:
    """Limits how many Events a source sends about one object: one token bucket (``burst``,
    refilled at ``qps``) per :func:`get_spam_key`, in an LRU of ``lru_cache_size`` buckets.

    Each bucket is ``flowcontrol.NewTokenBucketPassiveRateLimiterWithClock``: asked with
    ``AllowN(now, 1)`` (:meth:`tally.workqueue.TokenBucket.allow`), on the clock's wall
    nanoseconds, with upstream's ``float32`` rate; a refused Event takes no token.
    """

    def __init__(
        self,
        lru_cache_size: int,
        burst: int,
        qps: float,
        clock: clocks.Clock,
        spam_key_func: EventSpamKeyFunc,
    ) -> None:
        self._cache: _LRU[str, tokenbucket.TokenBucket] = _LRU(lru_cache_size)
        self._burst = burst
        self._qps = _float32(qps)
        self._clock = clock
        self._spam_key_func = spam_key_func

    def filter(self, event: Event) -> bool:
        """True when ``event`` must be dropped (its source and object are out of tokens)."""
        key = self._spam_key_func(event)
        limiter = self._cache.get(key)
        if limiter is None:
            limiter = tokenbucket.TokenBucket(self._qps, self._burst, per_second=_NS_PER_SECOND)
        skip = not limiter.allow(self._clock.time_ns())
        self._cache.add(key, limiter)
        return skip


@dataclasses.dataclass(slots=True)
class _AggregateRecord:
    local_keys: set[str]
    """The distinct local keys (messages) seen in this group; never more than ``max_events - 1``
    once aggregation has begun."""
    last_timestamp: int | None
    """When an Event of this group was last seen."""


class EventAggregator:
    """Turns the ``max_events``-th and later similar Events (same aggregate key, different local
    keys) within ``max_interval_in_seconds`` of the previous one into one aggregate Event."""

    def __init__(
        self,
        lru_cache_size: int,
        key_func: EventAggregatorKeyFunc,
        message_func: EventAggregatorMessageFunc,
        max_events: int,
        max_interval_in_seconds: int,
        clock: clocks.Clock,
    ) -> None:
        self._cache: _LRU[str, _AggregateRecord] = _LRU(lru_cache_size)
        self._key_func = key_func
        self._message_func = message_func
        self._max_events = max_events
        self._max_interval_ns = max_interval_in_seconds * 1_000_000_000
        self._clock = clock

    def event_aggregate(self, new_event: Event) -> tuple[Event, str]:
        """The Event to write and its cache key for de-duplication: ``new_event`` and its full
        :func:`get_event_key` below the threshold; else a new aggregate Event and the aggregate
        key (so that each later one patches the same aggregate)."""
        now = self._clock.time_ns()
        event_key = get_event_key(new_event)
        aggregate_key, local_key = self._key_func(new_event)

        record = self._cache.get(aggregate_key)
        # Too old, or none at all: start afresh.
        if (
            record is None
            or record.last_timestamp is None
            or now - record.last_timestamp > self._max_interval_ns
        ):
            record = _AggregateRecord(local_keys=set(), last_timestamp=None)
        record.local_keys.add(local_key)
        record.last_timestamp = now
        self._cache.add(aggregate_key, record)

        if len(record.local_keys) < self._max_events:
            return new_event, event_key

        # Do not let the set grow past the threshold: drop any one key (upstream's PopAny), so
        # that each new message aggregates again while a message already kept does not.
        record.local_keys.pop()

        aggregate = Event(
            name=f"{new_event.involved_object.name}.{now:x}",
            namespace=new_event.namespace,
            involved_object=new_event.involved_object,
            reason=new_event.reason,
            message=self._message_func(new_event),
            source=new_event.source,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            type=new_event.type,
            # No reporting controller or instance: upstream's aggregate copy leaves them out.
        )
        return aggregate, aggregate_key


@dataclasses.dataclass(frozen=True, slots=True)
class _EventLog:
    """What the logger remembers of one Event it has seen."""

    count: int
    first_timestamp: int | None
    name: str
    """The name the Event was created with: the target of later patches."""
    resource_version: str


class _EventLogger:
    """``eventLogger``: counts occurrences of each Event, turning repeats into patches."""

    def __init__(self, lru_cache_entries: int) -> None:
        self._cache: _LRU[str, _EventLog] = _LRU(lru_cache_entries)

    def event_observe(self, new_event: Event, key: str) -> tuple[Event, dict[str, Any] | None]:
        """The Event to write (for a repeat: the first one's name, resourceVersion and
        firstTimestamp with the count raised) and the patch to write it with (None: create)."""
        event = new_event
        patch: dict[str, Any] | None = None
        last = self._cache.get(key)
        if last is not None and last.count > 0:
            event = dataclasses.replace(
                new_event,
                name=last.name,
                resource_version=last.resource_version,
                first_timestamp=last.first_timestamp,
                count=last.count + 1,
            )
            patch = two_way_merge_patch(event)
        # Recorded even if the spam filter then drops the Event: the count keeps counting, so
        # the next patch that gets through carries the true total.
        self._cache.add(key, _log_of(event))
        return event, patch

    def update_state(self, event: Event) -> None:
        """Learn the server's answer (its name and resourceVersion) under the Event's full key."""
        self._cache.add(get_event_key(event), _log_of(event))


def _log_of(event: Event) -> _EventLog:
    return _EventLog(
        count=event.count,
        first_timestamp=event.first_timestamp,
        name=event.name,
        resource_version=event.resource_version,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class EventCorrelateResult:
    """What to do with one Event (``EventCorrelateResult``)."""

    event: Event | None = None
    """The Event after correlation; None when skipped."""
    patch: dict[str, Any] | None = None
    """When set: write the Event as this strategic merge patch of the existing one."""
    skip: bool = False
    """Do nothing more with the Event (the spam filter dropped it)."""


class EventCorrelator:
    """Filters, aggregates, counts and de-duplicates Events before they reach the API server.

    Defaults (``NewEventCorrelator``): aggregation after 10 similar Events in a rolling 10
    minutes, counting of identical Events, 25 Events per source and object at once and one
    every 5 minutes after that, LRUs of 4096 entries. The keyword arguments are upstream's
    ``CorrelatorOptions``.
    """

    def __init__(
        self,
        clock: clocks.Clock | None = None,
        *,
        lru_cache_size: int = MAX_LRU_CACHE_ENTRIES,
        burst_size: int = DEFAULT_SPAM_BURST,
        qps: float = DEFAULT_SPAM_QPS,
        key_func: EventAggregatorKeyFunc = event_aggregator_by_reason_func,
        message_func: EventAggregatorMessageFunc = event_aggregator_by_reason_message_func,
        max_events: int = DEFAULT_AGGREGATE_MAX_EVENTS,
        max_interval_in_seconds: int = DEFAULT_AGGREGATE_INTERVAL_IN_SECONDS,
        spam_key_func: EventSpamKeyFunc = get_spam_key,
    ) -> None:
        clock = clock if clock is not None else clocks.RealClock()
        self._filter = EventSourceObjectSpamFilter(
            lru_cache_size, burst_size, qps, clock, spam_key_func
        )
        self._aggregator = EventAggregator(
            lru_cache_size, key_func, message_func, max_events, max_interval_in_seconds, clock
        )
        self._logger = _EventLogger(lru_cache_size)

    def event_correlate(self, new_event: Event) -> EventCorrelateResult:
        # The order matters: aggregation decides the cache key the logger counts under, and the
        # filter judges the Event as it would be written.
        aggregate_event, cache_key = self._aggregator.event_aggregate(new_event)
        observed_event, patch = self._logger.event_observe(aggregate_event, cache_key)
        if self._filter.filter(observed_event):
            return EventCorrelateResult(skip=True)
        return EventCorrelateResult(event=observed_event, patch=patch)

    def update_state(self, event: Event) -> None:
        """Learn the latest state the server returned for an Event."""
        self._logger.update_state(event)


# -- writing to the API server -----------------------------------------------------------------


class StatusError(Exception):
    """The server answered with an error status (``errors.StatusError``): never retried."""

    def __init__(self, code: int, message: str = "", causes: tuple[str, ...] = ()) -> None:
        super().__init__(message or f"status {code}")
        self.code = code
        self.causes = causes
        """``details.causes[].reason`` (upstream's ``CauseType``), e.g. NamespaceTerminating."""


class RequestConstructionError(Exception):
    """The request could not even be built (``restclient.RequestConstructionError``): it would
    be built the same way next time, so it is not retried."""


class EventSink(Protocol):
    """Stores Events (``EventSink``); raises :class:`StatusError` when the server answers with
    an error, anything else when it cannot be reached."""

    async def create(self, event: Event) -> Event:
        """Create ``event`` in its namespace; returns what the server stored."""

    async def patch(self, event: Event, patch: Mapping[str, Any] | None) -> Event:
        """Strategic-merge-patch the Event named ``event.name`` in ``event.namespace``."""


async def record_event(
    sink: EventSink,
    event: Event,
    patch: Mapping[str, Any] | None,
    update_existing_event: bool,
    correlator: EventCorrelator,
) -> bool:
    """One attempt to write ``event``. True when it was written or must be abandoned, False when
    it should be retried."""
    try:
        new_event: Event | None = None
        not_found = False
        if update_existing_event:
            try:
                new_event = await sink.patch(event, patch)
            except StatusError as error:
                if error.code != 404:
                    raise
                not_found = True
        # The patch can fail because the Event was removed meanwhile (Events expire after an
        # hour by default): create it again, without a resourceVersion.
        if not update_existing_event or not_found:
            new_event = await sink.create(dataclasses.replace(event, resource_version=""))
    except RequestConstructionError as error:
        logger.error("unable to construct event %s (will not retry!): %s", _describe(event), error)
        return True
    except StatusError as error:
        # Something about the Event is wrong, or the namespace is going away: trying again would
        # fail again. AlreadyExists and NamespaceTerminating are routine.
        if error.code == 409 or NAMESPACE_TERMINATING_CAUSE in error.causes:
            logger.debug("server rejected event %s (will not retry!): %s", _describe(event), error)
        else:
            logger.error("server rejected event %s (will not retry!): %s", _describe(event), error)
        return True
    except Exception as error:  # upstream's "actual http transport errors": retry
        logger.error(
            "unable to write event %s (may retry after sleeping): %s", _describe(event), error
        )
        return False
    assert new_event is not None
    # The server's state (name, resourceVersion) is what the next patch must refer to.
    correlator.update_state(new_event)
    return True


def _describe(event: Event) -> str:
    ref = event.involved_object
    return f"{event.reason} about {ref.kind} {ref.namespace}/{ref.name}"


async def record_to_sink(
    sink: EventSink,
    event: Event,
    correlator: EventCorrelator,
    *,
    sleep_duration: float = DEFAULT_SLEEP_DURATION,
    wait: Callable[[float], Awaitable[bool]],
    rand: Callable[[], float] = random.random,
) -> None:
    """Correlate ``event`` and write the result, trying up to :data:`MAX_TRIES_PER_EVENT` times.

    ``wait(delay)`` sleeps between tries and returns False when the recorder is shut down
    meanwhile (upstream's ``select`` on its context), which ends the retries.
    """
    result = correlator.event_correlate(event)
    if result.skip or result.event is None:
        return
    tries = 0
    while True:
        if await record_event(sink, result.event, result.patch, result.event.count > 1, correlator):
            break
        tries += 1
        if tries >= MAX_TRIES_PER_EVENT:
            logger.error("unable to write event %s (retry limit exceeded!)", _describe(event))
            break
        delay = sleep_duration
        if tries == 1:
            # Randomise the first sleep, so that clients are not synced up if the API server
            # goes down.
            delay = sleep_duration * rand()
        if not await wait(delay):
            logger.error("unable to write event %s (recorder is shut down)", _describe(event))
            return


# -- the recorder ------------------------------------------------------------------------------

_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)
_DNS1123_SUBDOMAIN_MAX_LENGTH: Final = 253


def generate_event_name(ref_name: str, unix_nano: int) -> str:
    """``<object name>.<UnixNano in hex>``, or a random UUID where that is no valid name (a
    long object name; issues.k8s.io/127594)."""
    name = f"{ref_name}.{unix_nano:x}"
    if len(name) > _DNS1123_SUBDOMAIN_MAX_LENGTH or not _DNS1123_SUBDOMAIN.match(name):
        return str(uuid.uuid4())
    return name


def validate_event_type(event_type: str) -> bool:
    return event_type in (EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING)


def make_event(
    ref: ObjectReference,
    event_type: str,
    reason: str,
    message: str,
    source: EventSource,
    now: int,
) -> Event:
    """``makeEvent`` plus what ``generateEvent`` sets: a first occurrence, named after the
    object and the time, in the object's namespace (``default`` for a cluster-scoped one)."""
    return Event(
        name=generate_event_name(ref.name, now),
        namespace=ref.namespace or NAMESPACE_DEFAULT,
        involved_object=ref,
        reason=reason,
        message=message,
        source=source,
        first_timestamp=now,
        last_timestamp=now,
        count=1,
        type=event_type,
        reporting_controller=source.component,
        reporting_instance=source.host,
    )


class EventBroadcaster:
    """One controller's recorder and sink writer (upstream's broadcaster with one recorder and
    ``StartRecordingToSink``).

    :meth:`event` never blocks and never raises: it queues the Event, or drops it when
    :data:`MAX_QUEUED_EVENTS` are already waiting. One task, started with the first Event,
    takes them off the queue in order and runs :func:`record_to_sink` on each with one
    :class:`EventCorrelator`. :meth:`shutdown` stops the retries, tries each queued Event once,
    and ends the task.
    """

    def __init__(
        self,
        sink: EventSink,
        source: EventSource,
        *,
        clock: clocks.Clock | None = None,
        correlator: EventCorrelator | None = None,
        sleep_duration: float = DEFAULT_SLEEP_DURATION,
        max_queued_events: int = MAX_QUEUED_EVENTS,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._sink = sink
        self._source = source
        self._clock: clocks.Clock = clock if clock is not None else clocks.RealClock()
        self.correlator = correlator if correlator is not None else EventCorrelator(self._clock)
        self._sleep_duration = sleep_duration
        self._rand = rand
        #: Events recorded and not yet taken by the writer task.
        self._queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=max_queued_events)
        self._writer: asyncio.Task[None] | None = None
        #: Set by ``shutdown``: no more sleeping between tries, no more Events accepted.
        self._stopping = asyncio.Event()

    def event(self, ref: ObjectReference, event_type: str, reason: str, message: str) -> None:
        """Record an Event about ``ref`` (``Event``); must be called on the event loop."""
        if not validate_event_type(event_type):
            logger.error("unsupported event type %r", event_type)
            return
        if self._stopping.is_set():
            logger.error("unable to record event %s: recorder is shut down", reason)
            return
        event = make_event(ref, event_type, reason, message, self._source, self._clock.time_ns())
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            logger.error("unable to record event: too many queued events, dropped %s", reason)
            return
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="event-writer")

    async def _write_all(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await record_to_sink(
                    self._sink,
                    event,
                    self.correlator,
                    sleep_duration=self._sleep_duration,
                    wait=self._wait,
                    rand=self._rand,
                )
            except Exception:  # a lost Event must never stop the writer
                logger.exception("event writer: unexpected error on %s", _describe(event))
            finally:
                self._queue.task_done()

    async def _wait(self, delay: float) -> bool:
        if self._stopping.is_set():
            return False
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        except TimeoutError:
            return True
        return False

    async def drained(self) -> None:
        """Return once every Event recorded so far has been written or given up."""
        await self._queue.join()

    async def shutdown(self, within: float | None = None) -> None:
        """Write what is queued (each Event tried once; what is left after ``within`` seconds
        is dropped), then stop the writer task."""
        self._stopping.set()
        writer = self._writer
        if writer is None:
            return
        if not writer.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await self._queue.join()
            writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
