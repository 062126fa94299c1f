"""client-go's event recorder and broadcaster (``k8s.io/client-go/tools/record/event.go``
v0.37.1): recording an Event without blocking, and the loop that writes it to the API server.

* :func:`record_to_sink` / :func:`record_event` write one correlated Event through an
  :class:`EventSink`: create it, or patch it when the correlator says it exists (and create it
  after all when the patch answers 404); retry up to 12 tries, 10 s apart, when the server could
  not be reached, never when it answered with an error status; tell the correlator what the
  server stored (``UpdateState``).
* :class:`EventBroadcaster` is the part of upstream's broadcaster and recorder a controller
  uses: :meth:`EventBroadcaster.event` builds the Event (:func:`make_event`) and queues it
  without ever blocking (at most 1000 queued, later ones dropped); one task writes the queue
  through the correlator and the sink, one Event after another, as upstream's single watcher
  goroutine does. Serial on purpose: a patch must follow the create it patches, and the
  correlator must learn each answer before it decides about the next Event.

Its own module because it owns the side effects: the queue, the writer task, the retries and
their sleeps. What each Event becomes (aggregate, patch, drop) is
:class:`tally.machinery.correlator.EventCorrelator`'s decision.

Pure: no Kopf, no API client; the sink is a protocol, time comes from an injectable
:class:`tally.workqueue.Clock`. Everything runs on one event loop.

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
import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

from tally.machinery.correlator import EventCorrelator
from tally.machinery.eventtypes import (
    Event,
    EventSource,
    ObjectReference,
    generate_event_name,
    validate_event_type,
)
from tally.workqueue import clock as clocks

logger = logging.getLogger(__name__)

MAX_TRIES_PER_EVENT: Final = 12
"""Attempts to write one Event before it is given up (``maxTriesPerEvent``)."""
DEFAULT_SLEEP_DURATION: Final = 10.0
"""Seconds between attempts; the first sleep is a random fraction of it, so that clients do not
all retry in step after the API server comes back."""
MAX_QUEUED_EVENTS: Final = 1000
"""Events waiting to be written before new ones are dropped (``maxQueuedEvents``): recording
must never block a controller, and a controller that outruns the API server loses Events, not
memory."""

NAMESPACE_DEFAULT: Final = "default"
NAMESPACE_TERMINATING_CAUSE: Final = "NamespaceTerminating"
"""``v1.NamespaceTerminatingCause``: a write refused because the namespace is going away."""

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
