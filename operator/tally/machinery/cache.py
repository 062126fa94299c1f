"""In-memory caches of the objects quota is computed from: one store per group/resource.

A store keeps, per namespace and name, a compact *projection* of each object (whatever the
evaluator's ``project`` returns; for pods a small frozen record instead of the whole JSON), the
object's uid and resourceVersion, and when it was last written. It is fed two ways:

* **events** (``upsert`` / ``delete``), from watch streams;
* **lists** (``replace``, or ``begin_replace`` page by page), a fresh LIST of the whole kind.
  This is upstream's informer ``Replace``: it is how a store becomes *synced* the first time,
  and how it drops the ghosts that a watch gap leaves behind (an object deleted while no watch
  was open never produces a DELETED event; Kopf re-lists after a gap but never reports what
  disappeared).

Invariants:

* An event never goes backwards: an ``upsert`` whose uid and resourceVersion equal the stored
  ones is dropped (a resync or re-list replays objects unchanged, and a controller must not
  treat that as an update).
* A LIST is a snapshot taken at some moment; events that arrived while it was in flight are
  newer. ``replace(items, started_at)`` therefore leaves alone every entry written, and every
  deletion recorded, at or after ``started_at``; it only fixes entries older than the list.
  A deletion is remembered only while a LIST may need it (one begun before it is being read,
  or ``DELETION_MEMORY_S``), so deletions never accumulate between LISTs.
* ``synced`` is set by the first ``replace`` and never cleared: readers (the quota controller's
  workers, admission) wait on it, like upstream's ``WaitForCacheSync``.

:class:`RecentWrites` is the other half of reading from a cache: the objects this process
wrote itself, newer than the cache until their watch events arrive.

Pure: no Kopf, no API client. Time comes from an injectable monotonic clock. Everything runs
on one event loop, so no method awaits and none needs a lock.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

P = TypeVar("P")

DELETION_MEMORY_S = 60.0
"""How long a deletion is remembered when no LIST is being read: ``replace`` is handed a LIST
after it was read, with when it began; a LIST is read in seconds (a minute is ample)."""

Obj = Mapping[str, Any]
Key = tuple[str, str]
"""(namespace, name); namespace ``""`` for cluster-scoped objects."""


@dataclass(frozen=True, slots=True)
class Entry(Generic[P]):
    """What a store keeps for one object."""

    uid: str
    resource_version: str
    projection: P
    written_at: float
    """Monotonic time of the event or list that wrote this entry."""


class ChangeKind(enum.Enum):
    ADDED = "added"
    UPDATED = "updated"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class Change(Generic[P]):
    """One effective change to a store, for the caller's event handlers (replenishment).

    ``kind`` says what happened; ``old``/``new`` cannot, because a projection may itself be
    ``None`` (an object count keeps nothing of its objects).
    """

    namespace: str
    name: str
    old: P | None
    """The projection before the change; None when ``kind`` is ADDED."""
    new: P | None
    """The projection after the change; None when ``kind`` is DELETED."""
    kind: ChangeKind


class StoreError(ValueError):
    """An object without the metadata a store needs (name, uid)."""


def object_key(obj: Obj) -> Key:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        raise StoreError("object has no metadata.name")
    namespace = metadata.get("namespace") or ""
    if not isinstance(namespace, str):
        raise StoreError("metadata.namespace is not a string")
    return namespace, metadata["name"]


def _uid_and_version(obj: Obj) -> tuple[str, str]:
    metadata = obj["metadata"]
    return str(metadata.get("uid") or ""), str(metadata.get("resourceVersion") or "")


class Store(Generic[P]):
    """Projections of one kind's objects, indexed by namespace."""

    def __init__(
        self,
        project: Callable[[Obj], P],
        *,
        reproject: Callable[[P, Obj], P] | None = None,
        name: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``reproject(previous, obj)``: the projection of an update of the object whose
        previous projection is given, where that can be had cheaper than ``project(obj)``
        (the previous one itself, when nothing it holds changed)."""
        self.name = name
        self._project = project
        self._reproject = reproject
        self._clock = clock
        # namespace -> name -> entry. Empty namespaces are removed, so iterating namespaces
        # never visits one with nothing in it.
        self._entries: dict[str, dict[str, Entry[P]]] = {}
        # Deletions seen by events: key -> (uid, when), in the order seen. A LIST that started
        # before a deletion may still contain the object; this keeps ``replace`` from
        # resurrecting it. A deletion older than a list's start is reflected by the list, so
        # each one is kept only while a LIST may need it: while one begun before it is being
        # read, or for DELETION_MEMORY_S (``replace`` is handed a LIST after reading it).
        # Pruned as deletions come, not only at a LIST: a watch that never breaks never
        # re-lists.
        self._deleted: dict[Key, tuple[str, float]] = {}
        self._listing_since: float | None = None
        """When the LIST being read now (``begin_replace``, not finished) began."""
        self._synced = asyncio.Event()

    # -- reading

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def get(self, namespace: str, name: str) -> P | None:
        entry = self._entries.get(namespace, {}).get(name)
        return entry.projection if entry is not None else None

    def entry(self, namespace: str, name: str) -> Entry[P] | None:
        return self._entries.get(namespace, {}).get(name)

    def in_namespace(self, namespace: str) -> Iterator[P]:
        """Projections of every object in ``namespace`` (objects being deleted included)."""
        return (entry.projection for entry in self._entries.get(namespace, {}).values())

    def namespaces(self) -> list[str]:
        return list(self._entries)

    def names_in(self, namespace: str) -> list[str]:
        """The names of the objects in ``namespace`` (``""``: cluster-scoped objects)."""
        return list(self._entries.get(namespace, {}))

    def count_in(self, namespace: str) -> int:
        return len(self._entries.get(namespace, {}))

    def __len__(self) -> int:
        return sum(len(names) for names in self._entries.values())

    def now(self) -> float:
        """This store's clock, which stamps every write (``Entry.written_at``)."""
        return self._clock()

    def written_after(self, namespace: str, name: str, since: float) -> bool:
        """Whether the object is gone or was last written (by an event or a LIST) after
        ``since`` (:meth:`now`'s time): whatever the store held of it then has been delivered
        again, even unchanged (an event's replay refreshes the write time)."""
        entry = self.entry(namespace, name)
        return entry is None or entry.written_at > since

    # -- writing from events

    def upsert(self, obj: Obj) -> Change[P] | None:
        """Store ``obj`` (ADDED or MODIFIED); None when nothing changed."""
        namespace, name = object_key(obj)
        uid, version = _uid_and_version(obj)
        old = self.entry(namespace, name)
        now = self._clock()
        if old is not None and old.uid == uid and old.resource_version == version:
            # A replay of what we hold (re-list, resync): not an update. Still refresh the
            # write time: the object demonstrably exists now.
            self._entries[namespace][name] = Entry(uid, version, old.projection, now)
            return None
        # Project first: an object the evaluator rejects changes nothing.
        if old is not None and old.uid == uid and self._reproject is not None:
            projection = self._reproject(old.projection, obj)
        else:
            projection = self._project(obj)
        self._deleted.pop((namespace, name), None)
        self._entries.setdefault(namespace, {})[name] = Entry(uid, version, projection, now)
        if old is None:
            return Change(namespace, name, None, projection, ChangeKind.ADDED)
        return Change(namespace, name, old.projection, projection, ChangeKind.UPDATED)

    def delete(self, obj: Obj) -> Change[P] | None:
        """Forget ``obj`` (DELETED); None if it was not stored."""
        namespace, name = object_key(obj)
        uid, _ = _uid_and_version(obj)
        now = self._clock()
        self._deleted.pop((namespace, name), None)  # re-added last: the order stays time order
        self._deleted[(namespace, name)] = (uid, now)
        self._forget_deletions_before(now - DELETION_MEMORY_S)
        names = self._entries.get(namespace)
        if names is None:
            return None
        old = names.get(name)
        if old is None or (uid and old.uid and old.uid != uid):
            # A delete for an older incarnation of a re-created object leaves the new one.
            return None
        del names[name]
        if not names:
            del self._entries[namespace]
        return Change(namespace, name, old.projection, None, ChangeKind.DELETED)

    # -- writing from lists

    def replace(self, items: Iterable[Obj], started_at: float) -> list[Change[P]]:
        """Reconcile with a complete LIST that was started at ``started_at`` (monotonic).

        Returns the effective changes: objects the list has that the store missed or held in
        an older version, and ghosts the store held that the list does not have. Entries and
        deletions recorded by events at or after ``started_at`` win over the list.
        """
        replacement = self.begin_replace(started_at)
        return [*replacement.add(items), *replacement.finish()]

    def begin_replace(self, started_at: float) -> Replacement[P]:
        """:meth:`replace`, one LIST page at a time: only a page of raw objects is ever held
        (a LIST of 10 000 pods held whole cost ~170 MiB of peak memory, bench/scale.py)."""
        self._listing_since = started_at  # a newer LIST supersedes one abandoned halfway
        return Replacement(self, started_at)

    def _forget_deletions_before(self, horizon: float) -> None:
        if self._listing_since is not None:
            horizon = min(horizon, self._listing_since)
        while self._deleted:
            oldest = next(iter(self._deleted))
            if self._deleted[oldest][1] >= horizon:
                return
            del self._deleted[oldest]

    def _apply_listed(self, obj: Obj, started_at: float) -> Change[P] | None:
        namespace, name = object_key(obj)
        uid, version = _uid_and_version(obj)
        deleted = self._deleted.get((namespace, name))
        if deleted is not None and deleted[1] >= started_at and deleted[0] in ("", uid):
            return None  # deleted by an event after the list was taken
        current = self.entry(namespace, name)
        if current is not None and current.written_at >= started_at:
            return None  # an event after the list start is newer than the list
        if current is not None and current.uid == uid and current.resource_version == version:
            return None
        projection = self._project(obj)
        self._entries.setdefault(namespace, {})[name] = Entry(
            uid, version, projection, self._clock()
        )
        if current is None:
            return Change(namespace, name, None, projection, ChangeKind.ADDED)
        return Change(namespace, name, current.projection, projection, ChangeKind.UPDATED)

    def _finish_replace(self, listed: set[Key], started_at: float) -> list[Change[P]]:
        changes: list[Change[P]] = []
        for namespace in list(self._entries):
            names = self._entries[namespace]
            for name in list(names):
                entry = names[name]
                if (namespace, name) in listed or entry.written_at >= started_at:
                    continue
                del names[name]  # a ghost: deleted while nobody was watching
                changes.append(Change(namespace, name, entry.projection, None, ChangeKind.DELETED))
            if not names:
                del self._entries[namespace]
        self._deleted = {
            key: deleted for key, deleted in self._deleted.items() if deleted[1] >= started_at
        }
        if self._listing_since == started_at:
            self._listing_since = None
        self._synced.set()
        return changes


class Replacement(Generic[P]):
    """A LIST being applied to a store page by page (:meth:`Store.begin_replace`).

    Events may arrive between pages; they are newer than the list and win, exactly as they
    win over a list applied at once. The caller dispatches each page's changes before it
    awaits the next page, so handlers never see a list's change after a newer event's.
    Ghosts are known only at the end: :meth:`finish` removes them and marks the store synced.
    A replacement abandoned mid-way (the LIST failed) leaves valid entries and no sync mark.
    """

    def __init__(self, store: Store[P], started_at: float) -> None:
        self._store = store
        self.started_at = started_at
        self._listed: set[Key] = set()
        self._finished = False

    def add(self, items: Iterable[Obj]) -> list[Change[P]]:
        """Apply one page; returns its effective changes."""
        if self._finished:
            raise RuntimeError(f"{self._store.name}: the replacement is already finished")
        changes: list[Change[P]] = []
        for obj in items:
            self._listed.add(object_key(obj))
            change = self._store._apply_listed(obj, self.started_at)
            if change is not None:
                changes.append(change)
        return changes

    def finish(self) -> list[Change[P]]:
        """The list is complete: drop the ghosts (returned as DELETED changes)."""
        if self._finished:
            raise RuntimeError(f"{self._store.name}: the replacement is already finished")
        self._finished = True
        return self._store._finish_replace(self._listed, self.started_at)


class RecentWrites:
    """Objects this process wrote recently, preferred over older cached copies.

    Upstream's quota admission ``updatedQuotas`` LRU and its ``checkCache``: right after a
    write the cache lags behind, and work that read the cached copy would judge stale state
    and fail its own write on conflict (upstream measured 22 quota updates with 12 conflicts
    before this cache and 15 with 0 after). Keyed by (namespace, name); it relies on etcd
    resourceVersions being comparable integers for one object, as upstream's
    ``APIObjectVersioner`` does; a version that is not an integer never wins.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._size = size
        #: (namespace, name) → the stored object a write returned; least recently used first.
        self._entries: collections.OrderedDict[Key, Obj] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, stored: Obj) -> None:
        """Remember the object a successful write returned."""
        key = object_key(stored)
        self._entries[key] = stored
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def check_cache(self, cached: Obj) -> Obj:
        """The newer of ``cached`` and the remembered write of the same object.

        Once the cache has caught up (its version is at least the remembered one) the entry is
        dropped, as upstream does.
        """
        key = object_key(cached)
        remembered = self._entries.get(key)
        if remembered is None:
            return cached
        self._entries.move_to_end(key)
        if cached is remembered:
            # Handed back what a check already returned (a caller checking a copy it got from
            # here): the cache has not caught up. Dropping the entry now would make the next
            # check return the cache's older copy, and a write based on it lose its
            # compare-and-swap.
            return remembered
        current, written = _integer_version(cached), _integer_version(remembered)
        if written is None or (current is not None and current >= written):
            del self._entries[key]
            return cached
        return remembered


def _integer_version(obj: Obj) -> int | None:
    metadata = obj.get("metadata")
    value = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
