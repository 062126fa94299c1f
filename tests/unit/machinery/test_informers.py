"""tally.machinery.informers.Informer: a LIST applied page by page, each page dispatched at once."""

from __future__ import annotations

import functools
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


async def test_a_kopf_relist_after_the_first_sync_reconciles_and_tells_the_owner() -> None:
    # Kopf's re-list (events of type None) never reports what was deleted during the gap: the
    # informer LISTs itself, and the ghost goes.
    store: Store[str] = Store(project)
    informer = Informer(
        "pods",
        store,
        _listing(pod("p", resource_version="2")),
        relist_debounce=0.01,
        min_relist_interval=0.0,
    )
    gaps: list[str] = []
    informer.on_gap = lambda: gaps.append("gap")
    store.replace(
        [pod("p", resource_version="1"), pod("ghost", resource_version="1")], started_at=0
    )
    informer.on_event(None, pod("p", resource_version="2"))
    informer.on_event(None, pod("p", resource_version="2"))  # the same re-list: one gap, one LIST
    assert ["gap"] == gaps
    assert informer._relist_task is not None
    await informer._relist_task
    assert (1, ["p"]) == (informer.relists, store.names_in("a"))


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
    pods = Informer(
        "pods",
        pods_store,
        _listing(pod("p", resource_version="1")),
        relist_debounce=0.01,
        min_relist_interval=0.0,
    )
    pods.on_gap = secrets.schedule_relist
    pods.on_event(None, pod("p", resource_version="1"))
    assert secrets._relist_task is not None
    await secrets._relist_task
    assert (1, []) == (secrets.relists, secrets_store.names_in("a"))
    await pods.stop()


async def test_events_before_the_first_sync_schedule_no_relist() -> None:
    store: Store[str] = Store(project)
    informer = Informer("pods", store, _listing())
    gaps: list[str] = []
    informer.on_gap = lambda: gaps.append("gap")
    informer.on_event(
        None, pod("p", resource_version="1")
    )  # Kopf's first listing, before tally's own LIST
    assert ([], None) == (gaps, informer._relist_task)
