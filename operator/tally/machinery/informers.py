"""Informers: a Store per kind, kept true from watch events and from LISTs.

Upstream controllers read from informers (reflector → store → handlers). Here the watch stream
is Kopf's (``@kopf.on.event`` handlers call :meth:`Informer.on_event`), and this module adds
what Kopf does not give a plain event handler:

* **a synced point** — :meth:`Informer.sync` LISTs the kind itself and replaces the store,
  page by page (only one page of raw objects is held at a time); the controllers start their
  workers only after every informer synced (``WaitForCacheSync``). A second store of one kind
  (:meth:`Informer.add_view`) is fed its informer's LIST pages, re-lists included;
* **no ghosts** — when Kopf re-lists after a watch gap (its events then arrive with type
  ``None``) it never reports the objects deleted during the gap. Seeing such a listing begin
  after the first sync, the informer schedules a LIST of its own and reconciles the store
  against it (``Store.replace`` drops what the list lacks). Re-lists are debounced and spaced
  out. A kind with no object left after the gap gets no event at all from Kopf's re-list, so no
  informer of it can see its gap: :meth:`Informer.on_gap` tells the owner, which re-lists every
  informer not listed since (:meth:`Informer.schedule_relist`) — a cut connection or a
  restarted API server breaks every watch at once, and the namespaces' watch always re-delivers
  some object.
* **one re-list per listing** — a listing's objects arrive one event each, and at scale over
  minutes (30 000 pods through a busy event loop). Only the *first* object of a listing may
  schedule a re-list: a new listing is told from the one in progress by more listed objects
  than the store holds (each listed object is in the store once delivered, so only a second
  listing overruns it) or by a pause of ``LISTING_PAUSE_S`` between listed objects. Were every
  listed object that arrives after the last re-list to schedule another, every kind would
  re-list every ``MIN_RELIST_INTERVAL_S`` for as long as the listing lasts, each re-list
  slowing the listing further.
* **the first listing is no gap** — Kopf lists every kind once when its watches start, after
  tally's start-up LISTs, so what was deleted in between would stay a ghost: the owner
  schedules one re-list of every kind at start-up (the emptied kinds too). A kind's first
  listing schedules its own re-list (if that one already ran) but tells no owner: every other
  kind's is scheduled already.

* **when Kopf's first listing has arrived** — Kopf reports no end of a listing to its handlers,
  and at scale the replay of a kind's listing lasts minutes on the loop that answers reviews.
  :meth:`Informer.expect_listing` notes what the store holds as Kopf's watch begins; the
  :class:`ListingReplay` then says how much of it Kopf has delivered again (readiness waits
  for all of it: :mod:`tally.app.readiness`).

Handlers receive :class:`tally.machinery.cache.Change` values: ``old is None`` for an add, ``new is
None`` for a delete, both set for an update. They must be quick and must not await.

No Kopf import here: the lister is an async generator function (one item per LIST page) passed
in, so the logic is testable with plain data.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Generic, TypeVar

from tally.machinery.cache import Change, Replacement, Store
from tally.workqueue.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

P = TypeVar("P")
Obj = Mapping[str, Any]
Handler = Callable[[Change[P]], None]
Lister = Callable[[], AsyncIterator[Iterable[Obj]]]
"""A LIST of the kind, one page at a time."""

RELIST_DEBOUNCE_S: Final = 2.0
"""Kopf's re-list delivers every object as one burst; reconcile once after it settles."""
LISTING_PAUSE_S: Final = 10.0
"""A listing's objects arrive back to back (a page at a time); listed objects after a silence
this long are a new listing. Too short only costs a re-list more."""
MIN_RELIST_INTERVAL_S: Final = 30.0
"""A LIST of a large kind is expensive for the API server; watch gaps are rare. Bounds the
extra LISTs to one per kind per interval, and delays a ghost's removal by at most as long."""
RELIST_RETRY_S: Final = 5.0
REPLAY_CHECK_BUDGET: Final = 2_000
"""Objects :meth:`ListingReplay.remaining` looks at per call: a check made every 0.1 s must
not itself hold the loop (150 000 pods at once would, for tens of milliseconds)."""


class Informer(Generic[P]):
    """One kind's store, its LIST, and the handlers interested in its changes."""

    def __init__(
        self,
        name: str,
        store: Store[P],
        lister: Lister,
        *,
        clock: Callable[[], float] = time.monotonic,
        relist_debounce: float = RELIST_DEBOUNCE_S,
        min_relist_interval: float = MIN_RELIST_INTERVAL_S,
    ) -> None:
        self.name = name
        self.store = store
        self.lister = lister
        """The LIST used by :meth:`sync`."""
        self._clock = clock
        self._relist_debounce = relist_debounce
        self._min_relist_interval = min_relist_interval
        self._handlers: list[Handler[P]] = []
        self._last_list_started: float | None = None
        self._relist_task: asyncio.Task[None] | None = None
        self.relists = 0
        """LISTs made after the first (for metrics and tests)."""
        self.on_gap: Callable[[float], None] | None = None
        """Called with the clock's time when this informer sees Kopf re-list after a watch
        gap (once per listing): other kinds had the same gap, and an emptied one cannot see
        it."""
        self.listings = 0
        """Kopf listings seen since the first sync (the first is its watch's start)."""
        self._listed = 0
        """Objects of the listing in progress delivered so far."""
        self._last_listed: float | None = None
        self._store_size = 0
        """The store's size when last counted during the listing in progress."""
        self._views: list[Informer[Any]] = []
        self._owner: Informer[Any] | None = None
        """The informer whose LISTs feed this view (:meth:`add_view`)."""
        self.listing: ListingReplay | None = None
        """How much of Kopf's first listing has arrived (:meth:`expect_listing`)."""

    def add_handler(self, handler: Handler[P]) -> None:
        self._handlers.append(handler)

    @property
    def synced(self) -> bool:
        return self.store.synced

    @property
    def last_list_started(self) -> float | None:
        """When the last LIST of this informer began (the clock's time), None before any."""
        return self._last_list_started

    # -- LIST

    @property
    def views(self) -> Sequence[Informer[Any]]:
        """The second stores of this kind (:meth:`add_view`); read on every event, so the
        list itself, not a copy."""
        return self._views

    def add_view(self, view: Informer[Any]) -> None:
        """A second store of this kind (another projection, fed the same events by the
        owner): every LIST of this informer feeds it the same pages, and its re-lists are this
        informer's — one LIST of 30 000 pods for both, not one each."""
        view._owner = self
        self._views.append(view)

    async def sync(self) -> list[Change[P]]:
        """LIST the kind and reconcile the store (and its views') with it; dispatch the
        changes found. Returns this store's changes."""
        listing = self.begin_sync()
        views = [view.begin_sync() for view in self._views]
        async for page in self.lister():
            listing.add(page)
            for view_listing in views:
                view_listing.add(page)
        for view_listing in views:
            view_listing.finish()
        return listing.finish()

    def begin_sync(self) -> ListSync[P]:
        """A LIST starting now, whose pages the caller feeds (:meth:`sync` does, from the
        informer's own lister; start-up feeds one pod LIST to two informers)."""
        started = self._clock()
        self._last_list_started = started
        return ListSync(self, self.store.begin_replace(started))

    # -- events

    def on_event(self, event_type: str | None, obj: Obj) -> None:
        """One watch event from Kopf: ``ADDED``, ``MODIFIED``, ``DELETED``, or ``None`` (an
        object from a listing)."""
        change = self.store.delete(obj) if event_type == "DELETED" else self.store.upsert(obj)
        if change is not None:
            self._dispatch([change])
        if event_type is None and self.store.synced and self._listing_begins():
            self.schedule_relist()
            if self.listings > 1 and self.on_gap is not None:
                # After a gap (not the watch's first listing): the owner has the other kinds
                # re-listed, even with this kind's own re-list already pending.
                self.on_gap(self._clock())

    def _listing_begins(self) -> bool:
        """Count one listed object (already in the store); True if it begins a new listing."""
        now = self._clock()
        begins = self._last_listed is None or now - self._last_listed > LISTING_PAUSE_S
        self._last_listed = now
        self._listed += 1
        if not begins and self._listed > self._store_size:
            # The store's size costs a walk of its namespaces: counted again only when the
            # listing overruns the last count (once per listing, or when objects were added).
            self._store_size = len(self.store)
            begins = self._listed > self._store_size
        if begins:
            self._listed = 1
            self._store_size = len(self.store)
            self.listings += 1
        return begins

    def _dispatch(self, changes: list[Change[P]]) -> None:
        for change in changes:
            for handler in self._handlers:
                try:
                    handler(change)
                except Exception:
                    # One broken handler must not stop the store from being kept true.
                    logger.exception("%s: handler failed for %s/%s", self.name, change.namespace,
                                     change.name)  # fmt: skip

    def expect_listing(self) -> None:
        """Kopf's watch of this kind begins after now (tally's LIST came first): its listing
        will deliver every object the store holds, or the object is deleted meanwhile (the
        start-up re-list drops what was deleted before Kopf listed)."""
        self.listing = ListingReplay(self.store)

    # -- re-list after a watch gap

    @property
    def relisting(self) -> bool:
        """Whether a re-list of this kind is scheduled or under way (a view's is its
        owner's)."""
        if self._owner is not None:
            return self._owner.relisting
        return self._relist_task is not None and not self._relist_task.done()

    def schedule_relist(self, *, unless_listed_since: float | None = None) -> bool:
        """Reconcile the store with a LIST soon (debounced, and no sooner than the minimum
        interval after the last LIST); False if one is already scheduled, or if a LIST began
        at or after ``unless_listed_since`` (the clock's time)."""
        if self._owner is not None:
            return self._owner.schedule_relist(unless_listed_since=unless_listed_since)
        if self._relist_task is not None and not self._relist_task.done():
            return False
        if (
            unless_listed_since is not None
            and self._last_list_started is not None
            and self._last_list_started >= unless_listed_since
        ):
            return False
        self._relist_task = asyncio.create_task(self._relist(), name=f"relist-{self.name}")
        return True

    async def _relist(self) -> None:
        while True:
            since = self._clock() - (self._last_list_started or float("-inf"))
            await asyncio.sleep(max(self._relist_debounce, self._min_relist_interval - since))
            try:
                changes = await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("%s: re-list failed; retrying in %.0f s", self.name,
                                 RELIST_RETRY_S)  # fmt: skip
                await asyncio.sleep(RELIST_RETRY_S)
                continue
            self.relists += 1
            if changes:
                logger.info(self._relist_message(), self.name, len(changes))
            return

    def _relist_message(self) -> str:
        """How a re-list's changes are logged. The first one, before Kopf's watch has re-listed
        after a gap, is the start-up re-list: what it finds changed since tally's own LIST was
        made before Kopf's watch began (tally's own first status writes among them), which
        Kopf's first listing would deliver too, minus what was deleted. Only a re-list after a
        gap reports what a watch missed."""
        if self.relists == 1 and self.listings <= 1:
            return (
                "%s: the start-up re-list applied %d change(s) made since tally's own LIST, "
                "before Kopf's watch began (tally's own writes among them)"
            )
        return "%s: re-list reconciled %d change(s) missed by the watch"

    async def stop(self) -> None:
        task, self._relist_task = self._relist_task, None
        if task is not None and not task.done():
            await cancel_and_wait(task)


class ListingReplay:
    """How far Kopf's first listing of a kind has come, told from the store alone.

    Every write stamps an entry (:attr:`Entry.written_at`), a listed object's replay too, so
    what the store held when the watch began has arrived once each of those entries is newer
    or gone. A cursor walks the objects held then, in the order tally's LIST gave them (the
    order Kopf's listing delivers them, namespace by namespace), and never walks back: an
    entry once newer stays newer. Costs a list of the namespaces, and one namespace's names
    at a time; nothing per object.
    """

    def __init__(self, store: Store[Any]) -> None:
        self._store = store
        self._since = store.now()
        self._namespaces = store.namespaces()
        self._sizes = [store.count_in(namespace) for namespace in self._namespaces]
        self.total = sum(self._sizes)
        """Objects held when the watch began."""
        self.arrived = 0
        """Of those, the ones walked past: delivered again, or gone. Exact at a namespace's
        end; within one, objects deleted before the cursor reached it are not counted yet."""
        self._next = 0
        self._names: list[str] | None = None
        self._name_next = 0

    @property
    def done(self) -> bool:
        return self._next == len(self._namespaces)

    def remaining(self, budget: int = REPLAY_CHECK_BUDGET) -> int:
        """Objects not yet known to have arrived (0 once all have), after walking at most
        ``budget`` more of them."""
        store, since = self._store, self._since
        while budget > 0 and self._next < len(self._namespaces):
            namespace = self._namespaces[self._next]
            if self._names is None:
                self._names, self._name_next = store.names_in(namespace), 0
            names = self._names
            while self._name_next < len(names) and budget > 0:
                if not store.written_after(namespace, names[self._name_next], since):
                    return self._remaining()
                self._name_next += 1
                budget -= 1
            if self._name_next == len(names):
                self.arrived += self._sizes[self._next]
                self._next += 1
                self._names = None
        if not self.done:
            return self._remaining()
        self._namespaces, self._sizes, self._next = [], [], 0  # nothing more to walk
        return 0

    def _remaining(self) -> int:
        """Still to come, the current namespace's walked objects counted as arrived (at least
        the one the cursor waits at)."""
        walked = self._name_next if self._names is not None else 0
        return max(1, self.total - self.arrived - walked)


class ListSync(Generic[P]):
    """One LIST applied to an informer's store page by page, each page's changes dispatched
    at once (before the next page is awaited, so never after a newer event's)."""

    def __init__(self, informer: Informer[P], replacement: Replacement[P]) -> None:
        self._informer = informer
        self._replacement = replacement
        self.changes: list[Change[P]] = []

    def add(self, page: Iterable[Obj]) -> None:
        changes = self._replacement.add(page)
        self.changes.extend(changes)
        self._informer._dispatch(changes)

    def finish(self) -> list[Change[P]]:
        """The LIST is complete: ghosts removed and dispatched; returns every change."""
        changes = self._replacement.finish()
        self.changes.extend(changes)
        self._informer._dispatch(changes)
        return self.changes
