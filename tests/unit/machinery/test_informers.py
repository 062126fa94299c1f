"""tally.machinery.informers.Informer: a LIST applied page by page, each page dispatched at once."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import builders
from tally.machinery.cache import Change, ChangeKind, Store
from tally.machinery.informers import Informer

pytestmark = pytest.mark.unit


# Pods as a store holds them: metadata only.
pod = functools.partial(builders.pod, namespace="a", uid="u-{name}", bare=True)


def project(o: Any) -> str:
    return f"{o['metadata']['name']}@{o['metadata']['resourceVersion']}"


async def test_sync_dispatches_each_page_before_the_next_is_listed() -> None:
    seen: list[tuple[str, ChangeKind]] = []
    pages_listed = 0
    informer: Informer[str] | None = None

    async def lister() -> AsyncIterator[list[dict[str, Any]]]:
        nonlocal pages_listed
        pages_listed += 1
        yield [pod("p", resource_version="1")]
        # The first page's change was handled before the second page is asked for.
        assert seen == [("p@1", ChangeKind.ADDED)]
        # A watch event between pages: newer than the LIST, so the second page's q@1 loses.
        assert informer is not None
        informer.on_event("ADDED", pod("q", resource_version="9"))
        pages_listed += 1
        yield [pod("q", resource_version="1")]

    store: Store[str] = Store(project)
    store.upsert(pod("ghost", resource_version="1"))
    informer = Informer("pods", store, lister)
    informer.add_handler(lambda change: seen.append((str(change.new or change.old), change.kind)))
    changes = await informer.sync()
    assert pages_listed == 2
    assert seen == [
        ("p@1", ChangeKind.ADDED),
        ("q@9", ChangeKind.ADDED),
        ("ghost@1", ChangeKind.DELETED),
    ]
    # What sync returns is the LIST's own effect (the event's change went out as it came).
    assert changes == [
        Change("a", "p", None, "p@1", ChangeKind.ADDED),
        Change("a", "ghost", "ghost@1", None, ChangeKind.DELETED),
    ]
    assert store.synced


async def test_two_informers_fed_from_one_list() -> None:
    async def never() -> AsyncIterator[list[dict[str, Any]]]:
        raise AssertionError("the shared LIST is fed by the caller")
        yield []

    first = Informer("a", Store(project), never)
    second = Informer("b", Store(lambda o: o["metadata"]["name"]), never)
    syncs = first.begin_sync(), second.begin_sync()
    for page in ([pod("p", resource_version="1")], [pod("q", resource_version="2")]):
        for sync in syncs:
            sync.add(page)
    for sync in syncs:
        sync.finish()
    assert sorted(first.store.in_namespace("a")) == ["p@1", "q@2"]
    assert sorted(second.store.in_namespace("a")) == ["p", "q"]
    assert first.synced
    assert second.synced


async def test_a_view_is_listed_and_relisted_by_its_owners_one_list() -> None:
    lists = 0

    async def lister() -> AsyncIterator[list[dict[str, Any]]]:
        nonlocal lists
        lists += 1
        yield [pod("p", resource_version="1")]

    async def never() -> AsyncIterator[list[dict[str, Any]]]:
        raise AssertionError("a view's LIST is its owner's")
        yield []

    owner = Informer("pods", Store(project), lister, relist_debounce=0.01, min_relist_interval=0)
    view = Informer("pods(view)", Store(lambda o: o["metadata"]["name"]), never)
    owner.add_view(view)
    view.store.upsert(pod("ghost", resource_version="1"))
    await owner.sync()
    assert (1, ["p"], ["p"]) == (lists, owner.store.names_in("a"), view.store.names_in("a"))
    # The view's own re-list (its first listing from Kopf) is its owner's.
    view.on_event(None, pod("p", resource_version="1"))
    assert view._relist_task is None
    assert owner._relist_task is not None
    await owner._relist_task
    assert 2 == lists


async def test_a_list_failing_mid_way_keeps_its_pages_and_does_not_sync() -> None:
    async def failing() -> AsyncIterator[list[dict[str, Any]]]:
        yield [pod("p", resource_version="1")]
        raise ConnectionError("the API server went away")

    store: Store[str] = Store(project)
    store.upsert(pod("maybe-ghost", resource_version="1"))
    informer = Informer("pods", store, failing)
    with pytest.raises(ConnectionError):
        await informer.sync()
    assert not store.synced
    # Without the whole list nothing can be called a ghost.
    assert sorted(store.in_namespace("a")) == ["maybe-ghost@1", "p@1"]


def _listing(*objects: dict[str, Any]) -> Any:
    async def lister() -> AsyncIterator[list[dict[str, Any]]]:
        yield list(objects)

    return lister


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _informer(
    store: Store[str], *objects: dict[str, Any], clock: Clock | None = None
) -> Informer[str]:
    """The store's clock is the real one: give a ``clock`` only where no ghost is looked for."""
    return Informer(
        "pods",
        store,
        _listing(*objects),
        clock=clock or time.monotonic,
        relist_debounce=0.01,
        min_relist_interval=0.0,
    )


async def test_kopfs_first_listing_relists_the_kind_and_tells_no_owner() -> None:
    # Kopf's watch starts after tally's own LIST, with a listing of its own: ``ghost`` was
    # deleted in between, and neither reports it. The informer LISTs once more; the owner
    # scheduled every kind's re-list at start-up already, so it is not told.
    store: Store[str] = Store(project)
    informer = _informer(store, pod("p", resource_version="2"))
    gaps: list[float] = []
    informer.on_gap = gaps.append
    store.replace(
        [pod("p", resource_version="1"), pod("ghost", resource_version="1")], started_at=0
    )
    informer.on_event(None, pod("p", resource_version="2"))
    assert informer._relist_task is not None
    await informer._relist_task
    assert ([], 1, ["p"]) == (gaps, informer.relists, store.names_in("a"))


async def test_a_listing_delivered_slowly_is_relisted_once() -> None:
    # At scale a listing reaches the handlers over minutes, and the re-list it scheduled is
    # done long before its last object: the rest of the listing schedules nothing more.
    clock = Clock()
    store: Store[str] = Store(project)
    names = [f"p{index}" for index in range(20)]
    store.replace([pod(name, resource_version="1") for name in names], started_at=0)
    informer = _informer(store, *(pod(name, resource_version="1") for name in names), clock=clock)
    for name in names:
        clock.now += 5.0  # every object well within LISTING_PAUSE_S of the one before
        informer.on_event(None, pod(name, resource_version="1"))
        task = informer._relist_task
        if task is not None:
            await task
    assert (1, 1) == (informer.listings, informer.relists)


async def test_a_later_listing_is_a_gap_told_to_the_owner_once() -> None:
    clock = Clock()
    store: Store[str] = Store(project)
    store.replace([pod("p", resource_version="1"), pod("q", resource_version="1")], started_at=0)
    informer = _informer(
        store, pod("p", resource_version="1"), pod("q", resource_version="1"), clock=clock
    )
    gaps: list[float] = []
    informer.on_gap = gaps.append
    for name in ("p", "q"):  # Kopf's first listing
        informer.on_event(None, pod(name, resource_version="1"))
    assert informer._relist_task is not None
    await informer._relist_task
    informer.on_event("MODIFIED", pod("p", resource_version="2"))
    # A watch gap right after: Kopf lists again, p first. Two objects were listed already and
    # the store holds two: a third listed object can only be a new listing's.
    clock.now = 1.0
    informer.on_event(None, pod("p", resource_version="2"))
    informer.on_event(None, pod("q", resource_version="1"))
    assert ([1.0], 2) == (gaps, informer.listings)
    await informer._relist_task
    # Another gap, after a silence: a new listing too.
    clock.now = 100.0
    informer.on_event(None, pod("q", resource_version="1"))
    assert ([1.0, 100.0], 3) == (gaps, informer.listings)
    await informer._relist_task
    assert 3 == informer.relists


async def test_an_emptied_kind_relists_when_told_of_another_kinds_gap() -> None:
    # Every secret was deleted during the gap: Kopf's re-list of secrets delivers nothing.
    # Only the owner, told of the pods' gap, can have the secrets re-listed.
    secrets_store: Store[str] = Store(project)
    secrets_store.replace([pod("s", resource_version="1")], started_at=0)
    secrets = Informer(
        "secrets", secrets_store, _listing(), relist_debounce=0.01, min_relist_interval=0.0
    )
    pods_store: Store[str] = Store(project)
    pods_store.replace([pod("p", resource_version="1")], started_at=0)
    clock = Clock()
    pods = _informer(pods_store, pod("p", resource_version="1"), clock=clock)
    pods.on_gap = lambda since: secrets.schedule_relist(unless_listed_since=since)
    pods.on_event(None, pod("p", resource_version="1"))  # Kopf's first listing
    assert pods._relist_task is not None
    await pods._relist_task
    clock.now = 100.0
    pods.on_event(None, pod("p", resource_version="1"))  # the gap's
    assert secrets._relist_task is not None
    await secrets._relist_task
    assert (1, []) == (secrets.relists, secrets_store.names_in("a"))
    await pods.stop()


async def test_a_kind_listed_since_the_gap_is_not_listed_again_for_it() -> None:
    clock = Clock()
    store: Store[str] = Store(project)
    informer = _informer(store, clock=clock)
    clock.now = 50.0
    await informer.sync()
    assert not informer.schedule_relist(unless_listed_since=40.0)
    assert informer._relist_task is None
    assert informer.schedule_relist(unless_listed_since=60.0)
    await informer.stop()


async def test_events_before_the_first_sync_schedule_no_relist() -> None:
    store: Store[str] = Store(project)
    informer = Informer("pods", store, _listing())
    gaps: list[str] = []
    informer.on_gap = lambda: gaps.append("gap")
    informer.on_event(
        None, pod("p", resource_version="1")
    )  # Kopf's first listing, before tally's own LIST
    assert ([], None) == (gaps, informer._relist_task)


async def test_relisting_while_a_relist_is_scheduled_or_under_way() -> None:
    # Readiness waits for the start-up re-list: the informer (and a view, for its owner) says
    # whether one is still to come.
    store: Store[str] = Store(project)
    owner = _informer(store, pod("p", resource_version="1"))
    view = Informer("pods(view)", Store(project), _listing())
    owner.add_view(view)
    assert (False, False) == (owner.relisting, view.relisting)
    assert owner.schedule_relist()
    assert (True, True) == (owner.relisting, view.relisting)
    assert owner._relist_task is not None
    await owner._relist_task
    assert (1, False, False) == (owner.relists, owner.relisting, view.relisting)


# -- how far Kopf's first listing has come (ListingReplay)


class Ticks:
    """A clock that moves on by one at every reading: every write is newer than the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def listed_informer(*keys: tuple[str, str]) -> Informer[str]:
    store: Store[str] = Store(project, clock=Ticks())
    for namespace, name in keys:
        store.upsert(builders.pod(name, namespace=namespace, uid=f"u-{name}", bare=True,
                                  resource_version="1"))  # fmt: skip
    informer: Informer[str] = Informer("pods", store, empty_lister)
    informer.expect_listing()
    return informer


async def empty_lister() -> AsyncIterator[list[dict[str, Any]]]:
    yield []


def replayed(namespace: str, name: str, version: str = "1") -> dict[str, Any]:
    return builders.pod(name, namespace=namespace, uid=f"u-{name}", bare=True,
                        resource_version=version)  # fmt: skip


def test_a_listing_has_arrived_once_kopf_delivered_every_object_held_again() -> None:
    informer = listed_informer(("a", "p"), ("a", "q"), ("b", "r"))
    listing = informer.listing
    assert listing is not None
    assert (listing.total, listing.remaining(), listing.done) == (3, 3, False)
    # Kopf's listing replays what the store holds unchanged (same resourceVersion): that is
    # no change for the store, yet it is the listing arriving.
    informer.on_event(None, replayed("a", "p"))
    assert listing.remaining() == 2
    informer.on_event(None, replayed("a", "q"))
    assert listing.remaining() == 1
    informer.on_event(None, replayed("b", "r"))
    assert (listing.remaining(), listing.done) == (0, True)


async def test_objects_deleted_before_kopf_listed_them_count_as_arrived() -> None:
    # Deleted between tally's LIST and Kopf's: Kopf never delivers them, the start-up re-list
    # removes them from the store, and the listing is complete without them.
    informer = listed_informer(("a", "p"), ("a", "q"), ("b", "r"))
    listing = informer.listing
    assert listing is not None
    informer.on_event(None, replayed("a", "q"))
    informer.on_event(None, replayed("b", "r"))
    assert listing.remaining() == 3  # a/p was neither delivered nor removed
    informer.store.replace(
        [replayed("a", "q"), replayed("b", "r")], started_at=informer.store.now()
    )
    assert listing.remaining() == 0
    await informer.stop()


def test_objects_deleted_by_an_event_count_as_arrived() -> None:
    informer = listed_informer(("a", "p"), ("b", "q"))
    listing = informer.listing
    assert listing is not None
    informer.on_event("DELETED", replayed("a", "p"))
    assert listing.remaining() == 1
    informer.on_event(None, replayed("b", "q"))
    assert listing.remaining() == 0


def test_a_listing_delivered_out_of_order_is_complete_only_when_the_first_object_arrives() -> None:
    informer = listed_informer(("a", "p"), ("b", "r"), ("c", "s"))
    listing = informer.listing
    assert listing is not None
    informer.on_event(None, replayed("c", "s"))
    informer.on_event("MODIFIED", replayed("b", "r", version="2"))
    assert listing.remaining() == 3  # the cursor waits at a/p
    informer.on_event(None, replayed("a", "p"))
    assert listing.remaining() == 0


def test_objects_created_after_the_watch_began_are_not_waited_for() -> None:
    informer = listed_informer(("a", "p"))
    listing = informer.listing
    assert listing is not None
    informer.on_event("ADDED", replayed("a", "new"))
    informer.on_event("ADDED", replayed("z", "other"))
    assert listing.remaining() == 1
    informer.on_event(None, replayed("a", "p"))
    assert listing.remaining() == 0


def test_an_empty_kind_has_nothing_to_wait_for() -> None:
    listing = listed_informer().listing
    assert listing is not None
    assert (listing.total, listing.remaining(), listing.done) == (0, 0, True)


def test_each_check_walks_at_most_its_budget() -> None:
    informer = listed_informer(*(("a", f"p{i}") for i in range(5)))
    listing = informer.listing
    assert listing is not None
    for i in range(5):
        informer.on_event(None, replayed("a", f"p{i}"))
    assert listing.remaining(budget=2) == 3
    assert listing.remaining(budget=2) == 1
    assert not listing.done
    assert listing.remaining(budget=2) == 0
    assert listing.done


async def test_the_start_up_relist_is_logged_as_such(caplog: pytest.LogCaptureFixture) -> None:
    # Kopf's watch begins after tally's own LIST; what the start-up re-list finds changed was
    # made before that watch began, which no watch missed: the log must not say one did.
    store: Store[str] = Store(project)
    informer = _informer(store, pod("p", resource_version="2"))
    store.replace(
        [pod("p", resource_version="1"), pod("ghost", resource_version="1")], started_at=0
    )
    informer.on_event(None, pod("p", resource_version="1"))  # Kopf's first listing
    assert informer._relist_task is not None
    with caplog.at_level("INFO", logger="tally.machinery.informers"):
        await informer._relist_task
    assert [
        "pods: the start-up re-list applied 2 change(s) made since tally's own LIST, before "
        "Kopf's watch began (tally's own writes among them)"
    ] == [r.getMessage() for r in caplog.records]


async def test_a_relist_after_a_gap_reports_what_the_watch_missed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store: Store[str] = Store(project)
    store.replace([pod("p", resource_version="1"), pod("q", resource_version="1")], started_at=0)
    lists = [
        [pod("p", resource_version="1"), pod("q", resource_version="1")],  # the start-up re-list
        [pod("p", resource_version="1")],  # after the gap: q was deleted during it
    ]

    async def lister() -> AsyncIterator[list[dict[str, Any]]]:
        yield lists.pop(0)

    informer = Informer("pods", store, lister, relist_debounce=0.01, min_relist_interval=0.0)
    for name in ("p", "q"):  # Kopf's first listing
        informer.on_event(None, pod(name, resource_version="1"))
    assert informer._relist_task is not None
    await informer._relist_task
    # A gap: Kopf lists again and reports no deletion. Two objects were listed and the store
    # holds two: a third listed object can only be a new listing's.
    informer.on_event(None, pod("p", resource_version="1"))
    assert 2 == informer.listings
    with caplog.at_level("INFO", logger="tally.machinery.informers"):
        await informer._relist_task
    assert (["pods: re-list reconciled 1 change(s) missed by the watch"], ["p"]) == (
        [r.getMessage() for r in caplog.records],
        store.names_in("a"),
    )
