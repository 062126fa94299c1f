"""client-go's ``EventCorrelator`` (``k8s.io/client-go/tools/record/events_cache.go`` v0.37.1):
what becomes of an Event before it is written.

:class:`EventCorrelator` runs every Event through three steps, in upstream's order
(``EventCorrelate``):

1. **aggregate** (:class:`EventAggregator`): once 10 Events that differ only in their message
   (same source, object, type, reason) are seen within 600 s of each other, the 10th and later
   ones become one Event whose message is ``(combined from similar events): `` plus the latest
   message;
2. **observe** (``eventLogger``, de-duplication): an Event seen before (same
   :func:`get_event_key`; for an aggregate, the same aggregate key) is not created again but
   patched: its ``count`` goes up and ``lastTimestamp``/``message`` are replaced;
3. **filter** (:class:`EventSourceObjectSpamFilter`): a token bucket per source, object and type
   (:func:`get_spam_key`; :class:`tally.workqueue.TokenBucket`, asked passively) lets 25 Events
   through at once and one more every 300 s; the rest are dropped.

So a PodSet scaled 0 → 500 costs 9 creates, 1 create of the aggregate and 15 patches of it (25
writes; the 475 later ``SuccessfulCreate`` Events are dropped), like kube-controller-manager's
ReplicaSet controller, instead of 500 creates. The caches are LRUs of 4096 entries.

Its own module because it decides and writes nothing: it answers "create, patch, or drop" for
one Event at a time and learns what the server stored (``UpdateState``);
:mod:`tally.machinery.broadcaster` does the writing.

Pure: no Kopf, no API client; time comes from an injectable :class:`tally.workqueue.Clock`,
read with ``time_ns()`` (wall-clock nanoseconds: Events carry dates, and aggregate names carry
``UnixNano``). Everything runs on one event loop, so the mutexes upstream takes are left out.

Names follow upstream (``event_correlate``, ``event_aggregate``, ``event_observe``,
``update_state``, ``filter``); upstream's ``CorrelatorOptions`` are the keyword arguments of
:class:`EventCorrelator`, defaults as in ``populateDefaults``.
"""

from __future__ import annotations

import collections
import dataclasses
import struct
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

from tally.machinery.eventtypes import Event, format_time
from tally.workqueue import clock as clocks
from tally.workqueue import tokenbucket

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

# -- the patch ---------------------------------------------------------------------------------

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
