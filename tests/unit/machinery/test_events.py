"""Events: client-go's correlator (aggregate, de-duplicate, spam-filter;
:mod:`tally.machinery.correlator`), the sink loop and the recorder's queue
(:mod:`tally.machinery.broadcaster`), and the wire form (:mod:`tally.machinery.eventtypes`).

Ported from client-go v0.37.1 ``tools/record``: ``events_cache_test.go`` (the correlator),
``event_test.go`` (``recordToSink``: errors, expired Events, cancellation, ``Eventf``, lots of
Events) and ``util/util_test.go`` (Event names). Each case names its upstream test; expected
values are upstream's. Where upstream has no test (a whole scale-up burst, the refill after
300 s, the patch body, the LRU), the expected values are what client-go v0.37.1's own code
answered for the same script (a throwaway Go program against the module, quoted in the test).
Not covered here: the Kubernetes sink (``tally.podset.client.KubeEventSink``), which the e2e
tests exercise against the API server.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import pathlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tally.machinery import broadcaster as recording
from tally.machinery.correlator import (
    DEFAULT_AGGREGATE_INTERVAL_IN_SECONDS,
    DEFAULT_AGGREGATE_MAX_EVENTS,
    DEFAULT_SPAM_BURST,
    EventCorrelator,
    event_aggregator_by_reason_func,
    event_aggregator_by_reason_message_func,
    get_event_key,
    two_way_merge_patch,
)
from tally.machinery.eventtypes import (
    Event,
    EventSource,
    ObjectReference,
    event_from_json,
    event_to_json,
    format_time,
    generate_event_name,
    parse_time,
)

pytestmark = pytest.mark.unit

S = 1_000_000_000
"""One second in nanoseconds."""
START = 1_700_000_000 * S


class SimpleIntervalClock:
    """``k8s.io/utils/clock/testing.SimpleIntervalClock``: every ``now()`` moves on by
    ``duration`` first, then answers."""

    def __init__(self, time: int, duration: int) -> None:
        self.time = time
        self.duration = duration

    def now(self) -> int:
        self.time += self.duration
        return self.time

    def time_ns(self) -> int:
        """The reading the recorder and the correlator take (``tally.workqueue.Clock``)."""
        return self.now()


class FakeClock:
    """``k8s.io/utils/clock/testing.FakeClock``: moves only by ``step``."""

    def __init__(self, time: int = START) -> None:
        self.time = time

    def now(self) -> int:
        return self.time

    def time_ns(self) -> int:
        """The reading the recorder and the correlator take (``tally.workqueue.Clock``)."""
        return self.now()

    def step(self, seconds: float) -> None:
        self.time += int(seconds * S)


def test_core_imports_nothing_forbidden() -> None:
    """tally.machinery's eventtypes, correlator and broadcaster are pure core: no kopf,
    kubernetes_asyncio or pydantic."""
    package = pathlib.Path(recording.__file__).parent
    tree = ast.Module(
        body=[
            node
            for name in ("eventtypes.py", "correlator.py", "broadcaster.py")
            for node in ast.parse((package / name).read_text()).body
        ],
        type_ignores=[],
    )
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    bad = {
        name
        for name in imported
        if name.split(".")[0] in ("kopf", "kubernetes_asyncio", "pydantic")
    }
    assert set() == bad


# -- events_cache_test.go helpers --------------------------------------------------------------


def make_object_reference(kind: str, name: str, namespace: str) -> ObjectReference:
    return ObjectReference(
        kind=kind,
        name=name,
        namespace=namespace,
        uid="C934D34AFB20242",
        api_version="version",
        field_path="spec.containers{mycontainer}",
    )


def make_event(reason: str, message: str, involved_object: ObjectReference) -> Event:
    return Event(
        reason=reason,
        message=message,
        involved_object=involved_object,
        source=EventSource(component="kubelet", host="kublet.node1"),
        count=1,
        first_timestamp=START,
        last_timestamp=START,
        type="Normal",
    )


def make_events(num: int, template: Event) -> list[Event]:
    return [template] * num


def make_unique_events(num: int) -> list[Event]:
    return [
        make_event(
            f"reason-{i}", f"message-{i}", make_object_reference("Pod", f"pod-{i}", f"ns-{i}")
        )
        for i in range(num)
    ]


def make_similar_events(num: int, template: Event, message_prefix: str) -> list[Event]:
    return [
        dataclasses.replace(event, message=f"{message_prefix}-{i}-{event.message}")
        for i, event in enumerate(make_events(num, template))
    ]


def set_count(event: Event, count: int) -> Event:
    return dataclasses.replace(event, count=count)


def validate_event(actual: Event, expected: Event) -> None:
    """``validateEvent``: timestamps set, equal exactly when the count is 1, the name starts
    with the expected one; every other field equal (reporting controller not compared)."""
    assert actual.first_timestamp is not None
    assert actual.last_timestamp is not None
    if expected.count > 1:
        assert actual.first_timestamp != actual.last_timestamp, "compression shows in timestamps"
    else:
        assert actual.first_timestamp == actual.last_timestamp, "one occurrence, one timestamp"
    assert actual.name.startswith(expected.name)
    normalised = dataclasses.replace(
        actual,
        first_timestamp=expected.first_timestamp,
        last_timestamp=expected.last_timestamp,
        reporting_controller=expected.reporting_controller,
        name=expected.name,
    )
    assert expected == normalised


# -- the correlator ----------------------------------------------------------------------------


def test_event_aggregator_by_reason_func() -> None:
    """TestEventAggregatorByReasonFunc: events that vary only by message share an aggregate key."""
    event1 = make_event("end-of-world", "it was fun", make_object_reference("Pod", "pod1", "other"))
    event2 = make_event(
        "end-of-world", "it was awful", make_object_reference("Pod", "pod1", "other")
    )
    event3 = make_event("nevermind", "it was a bug", make_object_reference("Pod", "pod1", "other"))
    agg_key1, local_key1 = event_aggregator_by_reason_func(event1)
    agg_key2, local_key2 = event_aggregator_by_reason_func(event2)
    agg_key3, _ = event_aggregator_by_reason_func(event3)
    assert agg_key1 == agg_key2
    assert local_key1 != local_key2
    assert agg_key1 != agg_key3


def test_event_aggregator_by_reason_message_func() -> None:
    """TestEventAggregatorByReasonMessageFunc."""
    event1 = make_event("end-of-world", "it was fun", make_object_reference("Pod", "pod1", "other"))
    actual = event_aggregator_by_reason_message_func(event1)
    assert actual.startswith("(combined from similar events): ")


_FIRST = make_event("first", "i am first", make_object_reference("Pod", "my-pod", "my-ns"))
_DUPLICATE = make_event("duplicate", "me again", make_object_reference("Pod", "my-pod", "my-ns"))
_UNIQUE = make_event("unique", "snowflake", make_object_reference("Pod", "my-pod", "my-ns"))
_SIMILAR = dataclasses.replace(
    make_event("similar", "similar message", make_object_reference("Pod", "my-pod", "my-ns")),
    involved_object=dataclasses.replace(
        make_object_reference("Pod", "my-pod", "my-ns"), field_path="spec.containers{container1}"
    ),
)
_AGGREGATE = make_event(
    _SIMILAR.reason,
    event_aggregator_by_reason_message_func(_SIMILAR),
    _SIMILAR.involved_object,
)
_SIMILAR_BUT_DIFFERENT_CONTAINER = dataclasses.replace(
    _SIMILAR,
    involved_object=dataclasses.replace(
        _SIMILAR.involved_object, field_path="spec.containers{container2}"
    ),
)


@dataclasses.dataclass(frozen=True)
class CorrelatorCase:
    previous_events: list[Event]
    new_event: Event
    interval_seconds: int
    expected_event: Event | None = None
    expected_skip: bool = False


# TestEventCorrelator: its scenarios, one by one.
CORRELATOR_CASES = [
    pytest.param(CorrelatorCase([], _FIRST, 5, set_count(_FIRST, 1)), id="create-a-single-event"),
    pytest.param(
        CorrelatorCase(make_events(1, _DUPLICATE), _DUPLICATE, 5, set_count(_DUPLICATE, 2)),
        id="the-same-event-should-just-count",
    ),
    pytest.param(
        CorrelatorCase(
            make_events(DEFAULT_AGGREGATE_MAX_EVENTS, _DUPLICATE),
            _DUPLICATE,
            30,  # a larger interval induces aggregation but not spam
            set_count(_DUPLICATE, DEFAULT_AGGREGATE_MAX_EVENTS + 1),
        ),
        id="the-same-event-should-just-count-even-if-more-than-aggregate",
    ),
    pytest.param(
        CorrelatorCase(
            make_events(DEFAULT_SPAM_BURST + 1, _DUPLICATE), _DUPLICATE, 1, expected_skip=True
        ),
        id="the-same-event-is-spam-if-happens-too-frequently",
    ),
    pytest.param(
        CorrelatorCase(make_unique_events(30), _UNIQUE, 5, set_count(_UNIQUE, 1)),
        id="create-many-unique-events",
    ),
    pytest.param(
        CorrelatorCase(
            make_similar_events(DEFAULT_AGGREGATE_MAX_EVENTS - 1, _SIMILAR, _SIMILAR.message),
            _SIMILAR,
            5,
            set_count(_AGGREGATE, 1),
        ),
        id="similar-events-should-aggregate-event",
    ),
    pytest.param(
        CorrelatorCase(
            make_similar_events(DEFAULT_AGGREGATE_MAX_EVENTS, _SIMILAR, _SIMILAR.message),
            _SIMILAR,
            5,
            set_count(_AGGREGATE, 2),
        ),
        id="similar-events-many-times-should-count-the-aggregate",
    ),
    pytest.param(
        CorrelatorCase(
            make_events(1, _SIMILAR_BUT_DIFFERENT_CONTAINER), _SIMILAR, 5, set_count(_SIMILAR, 1)
        ),
        id="events-from-different-containers-do-not-aggregate",
    ),
    pytest.param(
        CorrelatorCase(
            make_similar_events(DEFAULT_AGGREGATE_MAX_EVENTS - 1, _SIMILAR, _SIMILAR.message),
            _SIMILAR,
            DEFAULT_AGGREGATE_INTERVAL_IN_SECONDS,
            set_count(_SIMILAR, 1),
        ),
        id="similar-events-whose-interval-is-greater-than-aggregate-interval-do-not-aggregate",
    ),
]


@pytest.mark.parametrize("case", CORRELATOR_CASES)
def test_event_correlator(case: CorrelatorCase) -> None:
    """TestEventCorrelator: counting and aggregation against a clock that moves on every read."""
    clock = SimpleIntervalClock(START, case.interval_seconds * S)
    correlator = EventCorrelator(clock)
    for previous in case.previous_events:
        now = clock.now()
        result = correlator.event_correlate(
            dataclasses.replace(previous, first_timestamp=now, last_timestamp=now)
        )
        if not result.skip:  # a skipped event needs no state update
            assert result.event is not None
            correlator.update_state(result.event)
    now = clock.now()
    result = correlator.event_correlate(
        dataclasses.replace(case.new_event, first_timestamp=now, last_timestamp=now)
    )
    assert case.expected_skip == result.skip
    if case.expected_skip:
        return
    assert result.event is not None
    assert case.expected_event is not None
    validate_event(result.event, case.expected_event)


def _spam_key_based_on_objects_and_reason(event: Event) -> str:
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
            event.reason,
        )
    )


_ORIGINAL = make_event("original", "i am first", make_object_reference("Pod", "my-pod", "my-ns"))
_DIFFERENT_REASON = make_event(
    "duplicate", "me again", make_object_reference("Pod", "my-pod", "my-ns")
)
_SPAM = make_event("original", "me again", make_object_reference("Pod", "my-pod", "my-ns"))


@pytest.mark.parametrize(
    ("new_event", "spam_key_func", "expected_skip"),
    [
        pytest.param(
            _DIFFERENT_REASON, None, True, id="spam-if-object-reference-is-the-same-default-filter"
        ),
        pytest.param(
            _DIFFERENT_REASON,
            _spam_key_based_on_objects_and_reason,
            False,
            id="not-spam-if-reason-differs-custom-filter",
        ),
        pytest.param(
            _SPAM,
            _spam_key_based_on_objects_and_reason,
            True,
            id="spam-if-only-message-differs-custom-filter",
        ),
    ],
)
def test_event_spam_filter(
    new_event: Event, spam_key_func: Callable[[Event], str] | None, expected_skip: bool
) -> None:
    """TestEventSpamFilter: burst 1, with the default and with a custom spam key."""
    clock = SimpleIntervalClock(START, 1 * S)
    kwargs: dict[str, Any] = {"spam_key_func": spam_key_func} if spam_key_func else {}
    correlator = EventCorrelator(clock, burst_size=1, **kwargs)
    result = correlator.event_correlate(_ORIGINAL)
    if not result.skip:
        assert result.event is not None
        correlator.update_state(result.event)
    result = correlator.event_correlate(new_event)
    assert expected_skip == result.skip
    if not expected_skip:
        assert result.event is not None
        validate_event(result.event, new_event)


# -- a scale-up burst, as kube-controller-manager's ReplicaSet controller records it ------------

_RS = ObjectReference(
    kind="ReplicaSet",
    namespace="ns",
    name="web",
    uid="u1",
    api_version="apps/v1",
    resource_version="7",
)
_RS_SOURCE = EventSource(component="replicaset-controller")


def _rs_event(clock: FakeClock, reason: str, message: str) -> Event:
    return recording.make_event(_RS, "Normal", reason, message, _RS_SOURCE, clock.now())


def test_scale_up_burst_aggregates_counts_then_drops() -> None:
    """30 ``SuccessfulCreate`` Events a second apart about one ReplicaSet, each answered by the
    server, then three more after 299 s.

    Expected values: client-go v0.37.1's ``NewEventCorrelator(fakeClock)`` on the same script
    (Go, the Event built as ``recorderImpl.makeEvent``/``generateEvent`` build it; after each
    result not skipped, ``UpdateState`` with the result and resourceVersion ``rv<i>``), which
    printed: 0-8 created as they are; 9 created as ``web.17979d004e9b1a00`` "(combined from
    similar events): Created pod: web-9", count 1, empty reportingController; 10-24 patches of
    it, count 2-16, ``{"count":N,"lastTimestamp":"2023-11-14T22:13:<30+..>Z","message":...}``;
    25-29 skipped; after 299 s one patch with count 22 (the skipped ones were counted), then a
    skip, and a ``SuccessfulDelete`` skipped too (one spam bucket per object and type).
    """
    clock = FakeClock()
    correlator = EventCorrelator(clock)
    results = []
    for i in range(30):
        result = correlator.event_correlate(
            _rs_event(clock, "SuccessfulCreate", f"Created pod: web-{i}")
        )
        results.append(result)
        if not result.skip:
            assert result.event is not None
            correlator.update_state(dataclasses.replace(result.event, resource_version=f"rv{i}"))
        clock.step(1)

    for i in range(9):  # the first nine: created one by one
        event = results[i].event
        assert event is not None
        assert (f"Created pod: web-{i}", 1, None) == (event.message, event.count, results[i].patch)
        assert f"web.{START + i * S:x}" == event.name
        assert "replicaset-controller" == event.reporting_controller

    aggregate = results[9].event
    assert aggregate is not None
    assert "web.17979d004e9b1a00" == aggregate.name
    assert "(combined from similar events): Created pod: web-9" == aggregate.message
    assert (1, None, "") == (aggregate.count, results[9].patch, aggregate.reporting_controller)
    assert START + 9 * S == aggregate.first_timestamp == aggregate.last_timestamp

    for i in range(10, 25):  # patches of the aggregate
        event = results[i].event
        assert event is not None
        message = f"(combined from similar events): Created pod: web-{i}"
        assert "web.17979d004e9b1a00" == event.name
        assert i - 8 == event.count
        assert START + 9 * S == event.first_timestamp
        assert {
            "count": i - 8,
            "lastTimestamp": f"2023-11-14T22:13:{20 + i}Z",
            "message": message,
        } == results[i].patch

    assert [True] * 5 == [r.skip for r in results[25:]]

    clock.step(299)
    after = [
        correlator.event_correlate(_rs_event(clock, reason, f"pod: web-{100 + i}"))
        for i, reason in enumerate(("SuccessfulCreate", "SuccessfulCreate", "SuccessfulDelete"))
    ]
    assert [False, True, True] == [r.skip for r in after]
    assert after[0].event is not None
    assert ("web.17979d004e9b1a00", 22) == (after[0].event.name, after[0].event.count)
    assert {
        "count": 22,
        "lastTimestamp": "2023-11-14T22:18:49Z",
        "message": "(combined from similar events): pod: web-100",
    } == after[0].patch


def test_nine_distinct_messages_then_the_tenth_is_aggregated() -> None:
    """events_cache.go: "if we see the same event that varies only by message more than 10
    times in a 10 minute period, aggregate the event"; the 10th is the first aggregate, the
    11th is a count patch of it (TestEventCorrelator's two similar-events scenarios)."""
    clock = FakeClock()
    correlator = EventCorrelator(clock)
    outcomes = []
    for i in range(11):
        result = correlator.event_correlate(_rs_event(clock, "SuccessfulCreate", f"m{i}"))
        assert result.event is not None
        correlator.update_state(result.event)
        outcomes.append((result.event.message, result.event.count, result.patch is not None))
    assert [(f"m{i}", 1, False) for i in range(9)] == outcomes[:9]
    assert ("(combined from similar events): m9", 1, False) == outcomes[9]
    assert ("(combined from similar events): m10", 2, True) == outcomes[10]


def test_identical_events_become_count_patches() -> None:
    """the-same-event-should-just-count, with the patch upstream sends: only count,
    lastTimestamp and message differ from the two-way merge patch's base."""
    clock = FakeClock()
    correlator = EventCorrelator(clock)
    first = correlator.event_correlate(_rs_event(clock, "SuccessfulDelete", "Deleted pod: a"))
    assert first.event is not None
    assert first.patch is None
    correlator.update_state(dataclasses.replace(first.event, resource_version="11"))
    for count in (2, 3):
        clock.step(1)
        result = correlator.event_correlate(_rs_event(clock, "SuccessfulDelete", "Deleted pod: a"))
        assert result.event is not None
        # The first occurrence's name, resourceVersion and firstTimestamp, the count raised.
        assert (first.event.name, "11", START, count) == (
            result.event.name,
            result.event.resource_version,
            result.event.first_timestamp,
            result.event.count,
        )
        assert {
            "count": count,
            "lastTimestamp": format_time(clock.now()),
            "message": "Deleted pod: a",
        } == result.patch
        correlator.update_state(result.event)


def test_the_26th_event_about_an_object_is_dropped_and_one_more_passes_after_300s() -> None:
    """The spam filter: ``defaultSpamBurst`` 25 Events about one object at once, then one per
    ``1/defaultSpamQPS`` = 300 s. Distinct reasons, so that nothing is aggregated or counted."""
    clock = FakeClock()
    correlator = EventCorrelator(clock)

    def record(i: int) -> bool:
        return correlator.event_correlate(_rs_event(clock, f"Reason{i}", "m")).skip

    assert [False] * 25 == [record(i) for i in range(25)]
    assert record(25) is True
    clock.step(299)
    assert record(26) is True
    clock.step(1)
    assert record(27) is False
    assert record(28) is True
    # Another object has its own bucket.
    other = dataclasses.replace(_RS, name="other", uid="u2")
    event = recording.make_event(other, "Normal", "R", "m", _RS_SOURCE, clock.now())
    assert correlator.event_correlate(event).skip is False


def test_spam_filter_forgets_the_least_recently_used_object() -> None:
    """The LRU (``k8s.io/utils/lru``): a bucket evicted by newer objects starts full again."""
    clock = FakeClock()
    correlator = EventCorrelator(clock, lru_cache_size=2, burst_size=1)

    def skipped(name: str) -> bool:
        ref = dataclasses.replace(_RS, name=name)
        event = recording.make_event(ref, "Normal", "R", "m", _RS_SOURCE, clock.now())
        return correlator.event_correlate(event).skip

    assert [False, True] == [skipped("a"), skipped("a")]
    assert [False, False] == [skipped("b"), skipped("c")]  # "c" evicts "a"
    assert skipped("a") is False
    assert skipped("c") is True  # "c" was still cached


# -- the patch and the wire form ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        # The three cases client-go v0.37.1's eventObserve answered in the Go program above.
        pytest.param(
            Event(count=2, last_timestamp=START + 10 * S, message="x"),
            {"count": 2, "lastTimestamp": "2023-11-14T22:13:30Z", "message": "x"},
            id="count-lastTimestamp-message",
        ),
        pytest.param(
            Event(count=2, last_timestamp=START + 30 * S),
            {"count": 2, "lastTimestamp": "2023-11-14T22:13:50Z"},
            id="empty-message-left-out",
        ),
        pytest.param(
            Event(count=2, message="m"),
            {"count": 2, "lastTimestamp": None, "message": "m"},
            id="zero-lastTimestamp-is-null",
        ),
    ],
)
def test_two_way_merge_patch(event: Event, expected: dict[str, Any]) -> None:
    assert expected == two_way_merge_patch(event)


def test_wire_form_round_trip() -> None:
    event = recording.make_event(
        _RS, "Warning", "FailedCreate", "Error creating: x", _RS_SOURCE, START + 123_456_789
    )
    body = event_to_json(event)
    assert {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"web.{START + 123_456_789:x}", "namespace": "ns"},
        "involvedObject": {
            "kind": "ReplicaSet",
            "namespace": "ns",
            "name": "web",
            "uid": "u1",
            "apiVersion": "apps/v1",
            "resourceVersion": "7",
        },
        "reason": "FailedCreate",
        "message": "Error creating: x",
        "source": {"component": "replicaset-controller"},
        "firstTimestamp": "2023-11-14T22:13:20Z",
        "lastTimestamp": "2023-11-14T22:13:20Z",
        "count": 1,
        "type": "Warning",
        "reportingComponent": "replicaset-controller",
        "reportingInstance": "",
    } == body
    # The server answers in whole seconds and adds a resourceVersion.
    served = {**body, "metadata": {**body["metadata"], "resourceVersion": "42"}}
    assert dataclasses.replace(
        event, resource_version="42", first_timestamp=START, last_timestamp=START
    ) == event_from_json(served)
    assert START + 500_000_000 == parse_time("2023-11-14T22:13:20.5Z")


@pytest.mark.parametrize(
    ("ref_name", "expected"),
    [
        pytest.param("test-pod", "test-pod.178959f726d80ec", id="valid name"),
        pytest.param("x" * 300, None, id="invalid name - too long"),
        pytest.param("test.POD", None, id="invalid name - upper case"),
        pytest.param("test.pod/invalid!chars?", None, id="invalid name - special chars"),
        pytest.param(
            "--test.pod/invalid!chars?",
            None,
            id="invalid name - special chars and non alphanumeric starting character",
        ),
    ],
)
def test_generate_event_name(ref_name: str, expected: str | None) -> None:
    """TestGenerateEventName (``util/util_test.go``): a UUID where the name would be invalid."""
    actual = generate_event_name(ref_name, 105999103295324396)
    assert len(actual) <= 253
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", actual)
    if expected is not None:
        assert expected == actual


# -- the sink loop (event_test.go) -------------------------------------------------------------


class UnexpectedObjectError(Exception):
    """Stands in for ``errors.UnexpectedObjectError``: neither a status nor a construction error,
    so it is retried."""


class Sink:
    """``testEventSink``: ``on_create`` / ``on_patch`` decide; by default each call succeeds and
    returns the Event it was given."""

    def __init__(
        self,
        on_create: Callable[[Event], Event] | None = None,
        on_patch: Callable[[Event, Mapping[str, Any] | None], Event] | None = None,
    ) -> None:
        self.on_create = on_create
        self.on_patch = on_patch

    async def create(self, event: Event) -> Event:
        return self.on_create(event) if self.on_create else event

    async def patch(self, event: Event, patch: Mapping[str, Any] | None) -> Event:
        return self.on_patch(event, patch) if self.on_patch else event


class Waits:
    """Records the sleeps ``record_to_sink`` asks for; ``shut_down`` makes them end the retries."""

    def __init__(self, shut_down: bool = False) -> None:
        self.delays: list[float] = []
        self.shut_down = shut_down

    async def __call__(self, delay: float) -> bool:
        self.delays.append(delay)
        return not self.shut_down


# TestWriteEventError. Upstream reuses one correlator for every case, and so does this test;
# the Events have count 0 (``&v1.Event{}``), so none is ever taken for a repeat.
WRITE_ERROR_CORRELATOR = EventCorrelator(SimpleIntervalClock(START, S))


@pytest.mark.parametrize(
    ("times_to_send_error", "attempts_wanted", "error"),
    [
        pytest.param(1000, 1, recording.RequestConstructionError(), id="giveUp1"),
        pytest.param(1000, 1, recording.StatusError(500), id="giveUp2"),
        pytest.param(1000, 12, UnexpectedObjectError(), id="retry1"),
        pytest.param(1000, 12, RuntimeError("A weird error"), id="retry2"),
        pytest.param(2, 2, RuntimeError("A weird error"), id="succeedEventually"),
    ],
)
async def test_write_event_error(
    times_to_send_error: int, attempts_wanted: int, error: Exception
) -> None:
    attempts = 0

    def on_create(event: Event) -> Event:
        nonlocal attempts
        attempts += 1
        if attempts < times_to_send_error:
            raise error
        return event

    waits = Waits()
    await recording.record_to_sink(
        Sink(on_create=on_create), Event(), WRITE_ERROR_CORRELATOR, wait=waits, rand=lambda: 0.5
    )
    assert attempts_wanted == attempts
    # The first sleep is randomised (here half of it), the later ones are the full 10 s.
    assert [5.0, *[10.0] * (attempts_wanted - 2)][: attempts_wanted - 1] == waits.delays


async def test_update_expired_event() -> None:
    """TestUpdateExpiredEvent: a patch answered 404 becomes a create, without resourceVersion."""
    correlator = EventCorrelator(SimpleIntervalClock(START, S))
    created: list[Event] = []

    def on_patch(event: Event, patch: Mapping[str, Any] | None) -> Event:
        raise recording.StatusError(404, "NotFound")

    def on_create(event: Event) -> Event:
        created.append(event)
        return event

    event = Event(resource_version="updated-resource-version", count=2)
    await recording.record_to_sink(
        Sink(on_create=on_create, on_patch=on_patch), event, correlator, wait=Waits()
    )
    assert 1 == len(created), "Event did not get created after patch failed"
    assert "" == created[0].resource_version


async def test_patch_refused_otherwise_is_not_retried_nor_created() -> None:
    """recordEvent: only a 404 turns a patch into a create; other statuses abandon the Event."""
    correlator = EventCorrelator(SimpleIntervalClock(START, S))
    calls: list[str] = []

    def on_patch(event: Event, patch: Mapping[str, Any] | None) -> Event:
        calls.append("patch")
        raise recording.StatusError(422, "Invalid")

    def on_create(event: Event) -> Event:
        calls.append("create")
        return event

    await recording.record_to_sink(
        Sink(on_create=on_create, on_patch=on_patch), Event(count=2), correlator, wait=Waits()
    )
    assert ["patch"] == calls


async def test_cancel_event() -> None:
    """TestCancelEvent: shut down before the first sleep: one try, then given up at once."""
    correlator = EventCorrelator(SimpleIntervalClock(START, S))
    attempts = 0

    def on_create(event: Event) -> Event:
        nonlocal attempts
        attempts += 1
        raise UnexpectedObjectError()

    await recording.record_to_sink(
        Sink(on_create=on_create), Event(), correlator, wait=Waits(shut_down=True)
    )
    assert 1 == attempts


# -- the recorder and its queue ----------------------------------------------------------------


class CachingSink:
    """``OnCreateFactory`` / ``OnPatchFactory``: creates are kept by event key, patches are
    applied to the kept JSON (a flat merge: the patch holds top-level fields only)."""

    def __init__(self) -> None:
        self.cache: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, Event]] = []

    async def create(self, event: Event) -> Event:
        self.cache[get_event_key(event)] = event_to_json(event)
        self.writes.append(("create", event))
        return event

    async def patch(self, event: Event, patch: Mapping[str, Any] | None) -> Event:
        cached = self.cache[get_event_key(event)]
        patched = event_from_json({**cached, **(patch or {})})
        self.writes.append(("patch", patched))
        return patched


async def test_eventf() -> None:
    """TestEventf: a recorder's Events through the sink, creates and count patches in turn."""
    test_ref = ObjectReference(
        kind="Pod",
        name="foo",
        namespace="baz",
        uid="bar",
        api_version="v1",
        field_path="spec.containers[2]",
    )
    test_pod = dataclasses.replace(test_ref, field_path="")
    test_ref2 = dataclasses.replace(test_ref, uid="differentUid", field_path="spec.containers[3]")
    table = [
        (test_ref, "Started", 1, "create"),
        (test_pod, "Killed", 1, "create"),
        (test_ref, "Started", 2, "patch"),
        (test_ref2, "Started", 1, "create"),
        (test_ref, "Started", 3, "patch"),
        (test_ref2, "Stopped", 1, "create"),
        (test_ref2, "Stopped", 2, "patch"),
    ]
    clock = FakeClock()
    sink = CachingSink()
    broadcaster = recording.EventBroadcaster(
        sink, EventSource(component="eventTest"), clock=clock, sleep_duration=0
    )
    for ref, reason, count, write in table:
        clock.step(1)
        broadcaster.event(ref, "Normal", reason, "some verbose message: 1")
        await broadcaster.drained()
        kind, actual = sink.writes[-1]
        assert write == kind
        expected = Event(
            name="foo",
            namespace="baz",
            involved_object=ref,
            reason=reason,
            message="some verbose message: 1",
            source=EventSource(component="eventTest"),
            reporting_controller="eventTest",
            count=count,
            type="Normal",
        )
        validate_event(actual, expected)
    assert len(table) == len(sink.writes)
    await broadcaster.shutdown()


async def test_lots_of_events() -> None:
    """TestLotsOfEvents: 1000 Events (distinct objects and reasons: no spam filtering, no
    aggregation), each failing four times first; none is dropped, each is tried five times."""
    counts = [0] * recording.MAX_QUEUED_EVENTS
    recorded: list[int] = []

    def on_create(event: Event) -> Event:
        num = int(event.message)
        counts[num] += 1
        if counts[num] < 5:
            raise RuntimeError("fake error")
        recorded.append(num)
        return event

    broadcaster = recording.EventBroadcaster(
        Sink(on_create=on_create), EventSource(component="eventTest"), sleep_duration=0
    )
    for i in range(recording.MAX_QUEUED_EVENTS):
        ref = ObjectReference(
            kind="Pod", name=f"foo-{i}", namespace="baz", uid="bar", api_version="version"
        )
        broadcaster.event(ref, "Normal", f"Reason-{i}", str(i))
    await broadcaster.drained()
    assert list(range(recording.MAX_QUEUED_EVENTS)) == recorded
    assert [5] * recording.MAX_QUEUED_EVENTS == counts
    await broadcaster.shutdown()


async def test_recording_never_blocks_and_drops_past_the_queue_limit() -> None:
    """``ActionOrDrop``: a full queue drops the new Event instead of waiting."""
    release = asyncio.Event()
    created: list[str] = []

    class SlowSink(Sink):
        async def create(self, event: Event) -> Event:
            await release.wait()
            created.append(event.reason)
            return event

    broadcaster = recording.EventBroadcaster(
        SlowSink(), EventSource(component="c"), max_queued_events=2
    )
    refs = [ObjectReference(kind="Pod", name=f"p{i}", namespace="ns") for i in range(4)]
    broadcaster.event(refs[0], "Normal", "R0", "m")
    await asyncio.sleep(0)  # the writer takes R0 and waits on the sink
    for i in (1, 2, 3):
        broadcaster.event(refs[i], "Normal", f"R{i}", "m")  # R3 finds the queue full
    release.set()
    await broadcaster.drained()
    assert ["R0", "R1", "R2"] == created
    await broadcaster.shutdown()


async def test_invalid_event_type_is_not_recorded() -> None:
    """``generateEvent``: only Normal and Warning Events are recorded."""
    sink = CachingSink()
    broadcaster = recording.EventBroadcaster(sink, EventSource(component="c"))
    broadcaster.event(ObjectReference(name="p", namespace="ns"), "Info", "R", "m")
    await broadcaster.shutdown()
    assert [] == sink.writes


async def test_shutdown_tries_each_queued_event_once_then_drops_new_ones() -> None:
    """tally's flush on shutdown: no more sleeping between tries, one try per queued Event (the
    API server is unreachable here), and Events recorded afterwards are dropped."""
    attempts: list[str] = []

    def on_create(event: Event) -> Event:
        attempts.append(event.reason)
        raise ConnectionError("refused")

    broadcaster = recording.EventBroadcaster(
        Sink(on_create=on_create), EventSource(component="c"), rand=lambda: 1.0
    )
    for i in range(3):
        broadcaster.event(ObjectReference(name=f"p{i}", namespace="ns"), "Normal", f"R{i}", "m")
    await asyncio.sleep(0.01)  # R0 failed once; the writer sleeps (10 s) before its retry
    assert ["R0"] == attempts
    await asyncio.wait_for(broadcaster.shutdown(), timeout=5)
    assert ["R0", "R1", "R2"] == attempts
    broadcaster.event(ObjectReference(name="late", namespace="ns"), "Normal", "R3", "m")
    await asyncio.sleep(0.01)
    assert ["R0", "R1", "R2"] == attempts
