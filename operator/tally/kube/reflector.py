"""Reflector: tally's own LIST + WATCH of one resource, feeding an :class:`Informer`.

Kopf feeds the informers of the kinds tally always watches. It cannot feed the kinds that
quotas name at run time (``count/widgets.example.com``): Kopf scans API groups for handlers
only at start-up, so a handler added later for a group nobody scanned is never watched. For
those kinds tally runs this reflector, a small port of client-go's ``tools/cache/reflector.go``:

1. LIST the resource in all namespaces, in pages, through :meth:`Informer.sync` (the store is
   reconciled with the list, so objects deleted while nobody watched leave it: no ghosts), and
   keep the list's ``metadata.resourceVersion``;
2. WATCH from that resourceVersion with bookmarks, applying ADDED / MODIFIED / DELETED through
   :meth:`Informer.on_event` and remembering the newest resourceVersion seen (BOOKMARK events
   only move it forward);
3. when the server ends the watch (its ``timeoutSeconds``), watch again from there.

Failures, and what each costs:

* **410 Gone** (the resourceVersion fell out of the watch cache), as an HTTP status or an
  ERROR event: LIST again at once if the watch had delivered something since the last LIST,
  otherwise after the back-off (a server that keeps answering 410 must not be hammered).
* **any other ERROR event**: LIST again after the back-off.
* **connection errors, time-outs, 5xx, 429, 401, malformed lines**: wait (1 s doubling to
  30 s; reset by the first event of a working watch) and WATCH again from the last
  resourceVersion; if that has expired meanwhile, the 410 path above takes over.
* **403, 404, 405** (RBAC forbids it, the resource is gone — a deleted CRD —, or it cannot be
  listed/watched): no retry will fix that here. The reflector reports the :class:`StatusError`
  through ``on_failure`` and stops; whoever started it decides what next
  (:mod:`tally.resourcequota.monitor` drops the kind and tells the quotas naming it).

A (re)start always begins with a LIST, so a reflector stopped and started again converges like
a fresh one.

Why raw HTTP instead of ``kubernetes_asyncio.watch.Watch``: ``Watch`` deserialises events into
model classes (none exist for custom resources, and they cost memory and time for the rest),
opens a second ``ApiClient`` with the default configuration, silently retries a 410 once with
the same stale resourceVersion, and raises a bare ``ApiException`` for ERROR events. Here the
stream is the ``ApiClient``'s own aiohttp session (same credentials, TLS and pool), read as
newline-separated JSON into plain dicts.

The state machine (:class:`Reflector`) talks to a :class:`ListWatchSource`; the Kubernetes one
is :class:`KubeListWatch`. Tests drive the reflector with a scripted source and a fake sleep.
Not here: resync (tally's controller has its own), watch-list streaming (``sendInitialEvents``),
label/field selectors, jitter on the back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import aiohttp
from kubernetes_asyncio import client

from tally.kube import rest
from tally.machinery.cache import Store
from tally.machinery.informers import Informer
from tally.workqueue import start_watched
from tally.workqueue.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

Obj = Mapping[str, Any]

INITIAL_BACKOFF_S: Final = 1.0
MAX_BACKOFF_S: Final = 30.0
"""client-go backs its reflectors off from 800 ms to 30 s; a dead API server is retried twice a
minute at worst, and a short blip costs one second."""
MIN_WATCH_TIMEOUT_S: Final = 300
"""client-go's ``minWatchTimeout``: each watch asks the server to end it after 5 to 10 minutes
(randomised so that reflectors started together do not reconnect together). Bounds how long a
watch that silently stopped delivering goes unnoticed."""
READ_TIMEOUT_MARGIN_S: Final = 30.0
"""The client-side read time-out is the server's ``timeoutSeconds`` plus this: a watch can be
silent for its whole life (bookmarks come about once a minute, not reliably), so only a server
that overran its own deadline is taken for dead."""
CONNECT_TIMEOUT_S: Final = 10.0
PAGE_SIZE: Final = 500
"""Objects per LIST page (as ``rest.list_objects``): one page is all either side holds."""

FATAL_STATUSES: Final = frozenset({403, 404, 405})
"""Forbidden (RBAC), Not Found (resource or group gone), Method Not Allowed (no list/watch)."""


@dataclass(frozen=True, slots=True)
class ResourceRef:
    """Which collection to list and watch: all namespaces of ``group/version, plural``."""

    group: str
    """``""`` for the core group."""
    version: str
    plural: str

    def __str__(self) -> str:
        return "/".join(part for part in (self.group, self.version, self.plural) if part)


class StatusError(Exception):
    """The API server refused a LIST or WATCH (an HTTP status, or an ERROR event's Status)."""

    def __init__(self, code: int, reason: str = "", message: str = "") -> None:
        self.code = code
        self.reason = reason
        self.message = message
        super().__init__(f"{code} {reason}: {message}" if message else f"{code} {reason}")

    @classmethod
    def from_status(cls, status: Obj, default_code: int = 500) -> StatusError:
        """From a ``Status`` object (an ERROR event's object or an error response body)."""
        code = status.get("code")
        return cls(
            code if isinstance(code, int) else default_code,
            str(status.get("reason") or ""),
            str(status.get("message") or ""),
        )


class ErrorEvent(StatusError):
    """An ERROR event inside a watch stream (as opposed to an HTTP status when opening it)."""


Outcome = Literal["expired", "fatal", "transient"]


def classify(error: BaseException) -> Outcome:
    """What a failed LIST or WATCH means for the reflector (see the module docstring)."""
    if isinstance(error, StatusError):
        if error.code == 410:
            return "expired"
        if error.code in FATAL_STATUSES:
            return "fatal"
    return "transient"


class Backoff:
    """Exponential back-off: ``initial``, doubling, capped at ``maximum``; :meth:`reset` when
    things work again."""

    def __init__(self, initial: float = INITIAL_BACKOFF_S, maximum: float = MAX_BACKOFF_S) -> None:
        self.initial = initial
        self.maximum = maximum
        self.failures = 0
        """Failures since the last reset; the next delay is ``initial * 2**failures``."""

    def next(self) -> float:
        delay = min(self.initial * 2.0**self.failures, self.maximum)
        if delay < self.maximum:
            self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


class ListWatchSource(Protocol):
    """The two calls a reflector makes. Implementations raise :class:`StatusError` for API
    refusals; anything else they raise is taken as a transient (connection) failure."""

    async def list_page(self, continue_token: str, limit: int) -> Obj:
        """One page of the collection: a ``*List`` object (``items``, ``metadata.continue``,
        ``metadata.resourceVersion``)."""
        ...

    def watch(self, resource_version: str, timeout_seconds: int) -> AsyncGenerator[Obj, None]:
        """Watch events (``{"type": ..., "object": ...}``) from ``resource_version`` until the
        server ends the stream. Closing the iterator closes the connection."""
        ...


LIST_TROUBLE_AFTER: Final = 3
"""Failed LISTs in a row after which the owner hears of it (1 + 2 + 4 s of backoff): a kind
the API server keeps failing to list (a conversion webhook that is down, an aggregated API
that is gone) is not a blip."""


class Reflector:
    """Keeps one informer's store true by LIST and WATCH (upstream ``Reflector``).

    Build it with a store; it makes the :class:`Informer` (its lister is the reflector's paged
    LIST, which also yields the resourceVersion to watch from): add handlers on
    :attr:`informer`. :meth:`start` runs it in a task, :meth:`stop` ends it.
    """

    def __init__(
        self,
        source: ListWatchSource,
        store: Store[Any],
        *,
        name: str,
        on_synced: Callable[[], None] | None = None,
        on_failure: Callable[[StatusError], None] | None = None,
        on_list_trouble: Callable[[Exception | None], None] | None = None,
        page_size: int = PAGE_SIZE,
        watch_timeout: Callable[[], int] | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.name = name
        self._source = source
        self.informer: Informer[Any] = Informer(name, store, self._list)
        self._on_synced = on_synced
        """Called once, after the first LIST of this reflector reconciled the store."""
        self._on_failure = on_failure
        """Called with the error when the reflector gives up (403/404/405); it then stops."""
        self._on_list_trouble = on_list_trouble
        """Called with the error once :data:`LIST_TROUBLE_AFTER` LISTs in a row failed (the
        reflector goes on retrying), and with None when a LIST succeeds after that."""
        self._list_failures = 0
        self._page_size = page_size
        self._watch_timeout = watch_timeout or _random_watch_timeout
        self._backoff = backoff or Backoff()
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self.resource_version: str | None = None
        """Where the next WATCH starts; ``None`` means LIST first."""
        self._listed_version = ""
        """The resourceVersion of the LIST in flight (set by :meth:`_list`)."""
        self._synced_once = False
        self.failure: StatusError | None = None
        """The error the reflector stopped on, if it did."""
        self.lists = 0
        self.watches = 0
        """Counters, for logs and tests."""

    # -- lifecycle

    def start(self) -> None:
        """Run (or run again after :meth:`stop`), starting with a LIST."""
        if self._task is not None and not self._task.done():
            return
        self.failure = None
        self.resource_version = None
        self._backoff.reset()
        # ``run`` returns only after reporting a fatal error itself; only a crash is logged here.
        self._task = start_watched(
            self.run(),
            name=f"reflector-{self.name}",
            logger=logger,
            died="%(reflector)s: reflector died; the kind is no longer watched",
            context={"reflector": self.name},
        )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            await cancel_and_wait(task)
        await self.informer.stop()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- the state machine

    async def run(self) -> None:
        """LIST, WATCH, recover; returns only after a fatal error (reported first)."""
        while True:
            if self.resource_version is None:
                try:
                    await self.informer.sync()
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    self._list_failures += 1
                    if self._list_failures == LIST_TROUBLE_AFTER and self._on_list_trouble:
                        self._callback(self._on_list_trouble, error)
                    if not await self._recover("LIST", error, progressed=False):
                        return
                    continue
                if self._list_failures >= LIST_TROUBLE_AFTER and self._on_list_trouble:
                    self._callback(self._on_list_trouble, None)
                self._list_failures = 0
                self.lists += 1
                self.resource_version = self._listed_version
                if not self._synced_once:
                    self._synced_once = True
                    if self._on_synced is not None:
                        self._callback(self._on_synced)
            progressed = False
            try:
                self.watches += 1
                timeout = self._watch_timeout()
                async with contextlib.aclosing(
                    self._source.watch(self.resource_version, timeout)
                ) as events:
                    async for event in events:
                        progressed = True
                        self._backoff.reset()
                        self._apply(event)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if not await self._recover("WATCH", error, progressed=progressed):
                    return
                continue
            # The server ended the watch (timeoutSeconds): a normal end, watch on.
            logger.debug("%s: watch ended at resourceVersion %s", self.name, self.resource_version)

    def _apply(self, event: Obj) -> None:
        """One watch event; ERROR events raise :class:`ErrorEvent`."""
        event_type = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, Mapping):
            raise ValueError(f"watch event without an object: {str(event)[:200]}")
        if event_type == "ERROR":
            raise ErrorEvent.from_status(obj)
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if event_type in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self.informer.on_event(str(event_type), obj)
            except ValueError:
                # A malformed object (no name): skip it, keep the stream.
                logger.exception("%s: dropped a %s event", self.name, event_type)
        elif event_type != "BOOKMARK":
            logger.warning("%s: ignored a watch event of type %r", self.name, event_type)
            return
        if isinstance(version, str) and version:
            self.resource_version = version

    async def _recover(self, call: str, error: Exception, *, progressed: bool) -> bool:
        """Decide what a failed LIST or WATCH means; wait if needed. False: stop for good."""
        outcome = classify(error)
        if outcome == "fatal":
            assert isinstance(error, StatusError)
            self.failure = error
            logger.error("%s: %s refused (%s); stopping this reflector", self.name, call, error)
            if self._on_failure is not None:
                self._callback(self._on_failure, error)
            return False
        if outcome == "expired" or isinstance(error, ErrorEvent):
            # The resourceVersion is gone from the watch cache (or the server said something
            # we cannot resume from): only a fresh LIST can tell what was missed.
            self.resource_version = None
            delay = 0.0 if outcome == "expired" and progressed else self._backoff.next()
            level = logging.INFO if outcome == "expired" else logging.WARNING
            logger.log(level, "%s: %s: %s; listing again in %.1f s", self.name, call, error, delay)
        else:
            delay = self._backoff.next()
            logger.warning(
                "%s: %s failed (%s: %s); retrying in %.1f s",
                self.name, call, type(error).__name__, error, delay,
            )  # fmt: skip
        if delay > 0:
            await self._sleep(delay)
        return True

    def _callback(self, callback: Callable[..., None], *args: Any) -> None:
        """Call an owner's callback; its bug must not kill the watch."""
        try:
            callback(*args)
        except Exception:
            logger.exception("%s: callback %r failed", self.name, callback)

    async def _list(self) -> AsyncIterator[list[Obj]]:
        """Every object, page by page (the informer's lister); keeps the resourceVersion.

        A continue token that expires mid-way raises 410, which the caller turns into a fresh
        LIST from the first page.
        """
        token = ""
        while True:
            page = await self._source.list_page(token, self._page_size)
            metadata = page.get("metadata") or {}
            token = str(metadata.get("continue") or "")
            if not token:
                self._listed_version = str(metadata.get("resourceVersion") or "")
            yield list(page.get("items") or [])
            if not token:
                return


def _random_watch_timeout() -> int:
    return random.randint(MIN_WATCH_TIMEOUT_S, 2 * MIN_WATCH_TIMEOUT_S)


class KubeListWatch:
    """:class:`ListWatchSource` over a kubernetes-asyncio ``ApiClient``, plain JSON only."""

    def __init__(self, api: client.ApiClient, resource: ResourceRef) -> None:
        self._api = api
        self.resource = resource
        self._path = rest.collection_path(resource.group, resource.version, resource.plural)

    async def list_page(self, continue_token: str, limit: int) -> Obj:
        query = [("limit", str(limit))]
        if continue_token:
            query.append(("continue", continue_token))
        try:
            return await rest.get_json(self._api, self._path, query)
        except client.ApiException as error:
            raise _status_error(error) from error

    async def watch(self, resource_version: str, timeout_seconds: int) -> AsyncGenerator[Obj, None]:
        query = [
            ("watch", "1"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        response = await rest.open_watch(
            self._api,
            self._path,
            query,
            aiohttp.ClientTimeout(
                total=None,
                sock_connect=CONNECT_TIMEOUT_S,
                sock_read=timeout_seconds + READ_TIMEOUT_MARGIN_S,
            ),
        )
        try:
            if response.status >= 300:
                body = await response.text()
                raise _status_error_from_body(response.status, response.reason or "", body)
            async for line in rest.watch_lines(response.content.iter_any()):
                yield _parse_event(line)
        finally:
            response.close()


def _parse_event(line: bytes) -> Obj:
    event = json.loads(line)
    if not isinstance(event, dict):
        raise ValueError(f"watch line is not a JSON object: {line[:200]!r}")
    return event


def _status_error_from_body(code: int, reason: str, body: str) -> StatusError:
    with contextlib.suppress(ValueError):
        status = json.loads(body)
        if isinstance(status, dict):
            return StatusError.from_status(status, default_code=code)
    return StatusError(code, reason, body[:200].strip())


def _status_error(error: client.ApiException) -> StatusError:
    code = int(error.status or 0)
    body = error.body if isinstance(error.body, str) else ""
    return _status_error_from_body(code, str(error.reason or ""), body)
