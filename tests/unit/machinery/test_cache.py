"""tally.machinery.cache.Store: events, the re-list reconciliation (no ghosts), and the synced gate.

The list/event interleavings are the ones client-go's DeltaFIFO ``Replace`` exists for: an
object deleted during a watch gap, an event newer than an in-flight LIST, a re-created object.
"""

from __future__ import annotations

from typing import Any

import pytest

from tally.machinery.cache import Change, ChangeKind, RecentWrites, Store, StoreError

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def obj(name: str, rv: str, uid: str | None = None, ns: str = "a", **data: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "resourceVersion": rv,
        },
        **data,
    }


def project(o: Any) -> str:
    """A projection that shows which version was stored."""
    return f"{o['metadata']['name']}@{o['metadata']['resourceVersion']}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Store[str]:
    return Store(project, clock=clock)


def test_upsert_reports_changes_and_drops_replays(store: Store[str]) -> None:
    assert store.upsert(obj("p", "1")) == Change("a", "p", None, "p@1", ChangeKind.ADDED)
    # Same uid and resourceVersion: a resync replay, not an update (sample-controller).
    assert store.upsert(obj("p", "1")) is None
    assert store.upsert(obj("p", "2")) == Change("a", "p", "p@1", "p@2", ChangeKind.UPDATED)
    assert list(store.in_namespace("a")) == ["p@2"]
    assert len(store) == 1


def test_an_update_of_the_same_object_is_reprojected_from_its_previous_projection(
    clock: FakeClock,
) -> None:
    seen: list[tuple[str, str]] = []

    def reproject(previous: str, o: Any) -> str:
        seen.append((previous, o["metadata"]["resourceVersion"]))
        return previous  # nothing this projection holds changed

    store: Store[str] = Store(project, reproject=reproject, clock=clock)
    store.upsert(obj("p", "1"))
    # The update is still a change (handlers see every version), holding the same projection.
    assert store.upsert(obj("p", "2")) == Change("a", "p", "p@1", "p@1", ChangeKind.UPDATED)
    assert seen == [("p@1", "2")]
    entry = store.entry("a", "p")
    assert entry is not None
    assert entry.resource_version == "2"
    # A re-created object (another uid) is projected from scratch.
    assert store.upsert(obj("p", "3", uid="other")) == Change(
        "a", "p", "p@1", "p@3", ChangeKind.UPDATED
    )
    assert seen == [("p@1", "2")]


def test_delete_and_namespaces(store: Store[str]) -> None:
    store.upsert(obj("p", "1"))
    store.upsert(obj("q", "1", ns="b"))
    assert sorted(store.namespaces()) == ["a", "b"]
    assert store.delete(obj("p", "2")) == Change("a", "p", "p@1", None, ChangeKind.DELETED)
    assert store.delete(obj("p", "2")) is None
    assert store.namespaces() == ["b"]
    assert list(store.in_namespace("a")) == []


def test_delete_of_an_older_incarnation_keeps_the_new_object(store: Store[str]) -> None:
    store.upsert(obj("p", "5", uid="new"))
    assert store.delete(obj("p", "3", uid="old")) is None
    assert store.get("a", "p") == "p@5"


def test_first_replace_syncs_and_fills(store: Store[str], clock: FakeClock) -> None:
    assert not store.synced
    changes = store.replace([obj("p", "1"), obj("q", "1", ns="b")], started_at=clock.now)
    assert store.synced
    assert sorted((c.namespace, c.name, c.old, c.new) for c in changes) == [
        ("a", "p", None, "p@1"),
        ("b", "q", None, "q@1"),
    ]


def test_replace_drops_ghosts_deleted_during_a_watch_gap(
    store: Store[str], clock: FakeClock
) -> None:
    store.replace([obj("p", "1"), obj("q", "1")], started_at=clock.now)
    clock.now += 10
    # q was deleted while the watch was down: no DELETED event; the next LIST lacks it.
    changes = store.replace([obj("p", "1")], started_at=clock.now)
    assert changes == [Change("a", "q", "q@1", None, ChangeKind.DELETED)]
    assert list(store.in_namespace("a")) == ["p@1"]


def test_replace_keeps_what_events_wrote_after_the_list_started(
    store: Store[str], clock: FakeClock
) -> None:
    store.replace([obj("p", "1")], started_at=clock.now)
    clock.now += 10
    list_started = clock.now
    clock.now += 1
    # While the LIST was in flight: r was created, p was updated, and the list has neither.
    store.upsert(obj("r", "7"))
    store.upsert(obj("p", "8"))
    changes = store.replace([obj("p", "1")], started_at=list_started)
    assert changes == []
    assert sorted(store.in_namespace("a")) == ["p@8", "r@7"]


def test_replace_does_not_resurrect_an_object_deleted_after_the_list_started(
    store: Store[str], clock: FakeClock
) -> None:
    store.replace([obj("p", "1")], started_at=clock.now)
    clock.now += 10
    list_started = clock.now
    clock.now += 1
    store.delete(obj("p", "2"))
    assert store.replace([obj("p", "1")], started_at=list_started) == []
    assert store.get("a", "p") is None


def test_deletions_are_remembered_only_as_long_as_a_list_may_need_them(
    store: Store[str], clock: FakeClock
) -> None:
    # A deletion is kept so that a LIST begun before it does not bring the object back; a
    # store whose watch never breaks never re-lists, so waiting for the next LIST to forget
    # them kept one entry per object ever deleted (a namespace-churning cluster, all day).
    store.replace([obj(f"p{i}", "1") for i in range(100)], started_at=clock.now)
    for i in range(100):
        clock.now += 1
        store.delete(obj(f"p{i}", "2"))
    # The first 40 deletions are over a minute old now: only the last 60 and the new one stay.
    clock.now += 1
    store.delete(obj("late", "2"))
    assert 61 == len(store._deleted)
    # A LIST still being read keeps every deletion since it began, however old.
    listing = store.begin_replace(clock.now)
    clock.now += 500
    store.delete(obj("later", "2"))
    assert 2 == len(store._deleted)  # "late" (at the LIST's start) and "later"
    clock.now += 1
    store.delete(obj("last", "2"))
    assert listing.add([obj("later", "1"), obj("last", "1")]) == []
    assert [] == listing.finish()
    assert None is store.get("a", "later")


def test_replace_takes_newer_versions_and_recreations(store: Store[str], clock: FakeClock) -> None:
    store.replace([obj("p", "1"), obj("q", "1", uid="q-old")], started_at=clock.now)
    clock.now += 10
    changes = store.replace([obj("p", "4"), obj("q", "9", uid="q-new")], started_at=clock.now)
    assert sorted((c.name, c.old, c.new) for c in changes) == [
        ("p", "p@1", "p@4"),
        ("q", "q@1", "q@9"),
    ]
    assert store.entry("a", "q") is not None
    assert store.entry("a", "q").uid == "q-new"  # type: ignore[union-attr]


def test_an_old_deletion_does_not_hide_a_listed_recreation(
    store: Store[str], clock: FakeClock
) -> None:
    store.upsert(obj("p", "1", uid="first"))
    store.delete(obj("p", "2", uid="first"))
    clock.now += 10
    # The list started after the deletion, so the object it shows is a re-creation.
    changes = store.replace([obj("p", "3", uid="second")], started_at=clock.now)
    assert changes == [Change("a", "p", None, "p@3", ChangeKind.ADDED)]


async def test_wait_synced_returns_after_the_first_replace(store: Store[str]) -> None:
    store.replace([], started_at=0.0)
    await store.wait_synced()
    assert store.synced


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({}, id="no-metadata"),
        pytest.param({"metadata": {"namespace": "a"}}, id="no-name"),
        pytest.param({"metadata": {"name": "p", "namespace": 3}}, id="namespace-not-a-string"),
    ],
)
def test_objects_without_metadata_are_rejected_and_change_nothing(
    store: Store[str], bad: dict[str, Any]
) -> None:
    with pytest.raises(StoreError):
        store.upsert(bad)
    assert len(store) == 0


def test_an_object_the_projection_rejects_changes_nothing(clock: FakeClock) -> None:
    def strict(o: Any) -> str:
        if "bad" in o:
            raise ValueError("spec.containers: expected a list")
        return project(o)

    store: Store[str] = Store(strict, clock=clock)
    store.upsert(obj("p", "1"))
    with pytest.raises(ValueError, match=r"spec\.containers"):
        store.upsert(obj("p", "2", bad=True))
    with pytest.raises(ValueError, match=r"spec\.containers"):
        store.upsert(obj("q", "1", ns="b", bad=True))
    assert store.get("a", "p") == "p@1"
    assert store.namespaces() == ["a"]


def test_changes_say_what_happened_even_when_projections_are_none(clock: FakeClock) -> None:
    # Object counts keep nothing of their objects: the kind, not None-ness, tells a delete.
    store: Store[None] = Store(lambda o: None, clock=clock)
    added = store.upsert(obj("p", "1"))
    updated = store.upsert(obj("p", "2"))
    deleted = store.delete(obj("p", "3"))
    assert [c.kind for c in (added, updated, deleted) if c is not None] == [
        ChangeKind.ADDED,
        ChangeKind.UPDATED,
        ChangeKind.DELETED,
    ]


# -- a LIST applied page by page (begin_replace)


def test_a_paged_replace_equals_a_whole_one(clock: FakeClock) -> None:
    whole: Store[str] = Store(project, clock=clock)
    paged: Store[str] = Store(project, clock=clock)
    for s in (whole, paged):
        s.replace([obj("p", "1"), obj("ghost", "1")], started_at=clock.now)
    clock.now += 10
    listed = [obj("p", "2"), obj("q", "1"), obj("r", "1", ns="b")]
    expected = whole.replace(listed, started_at=clock.now)

    replacement = paged.begin_replace(clock.now)
    changes = [*replacement.add(listed[:2]), *replacement.add(listed[2:])]
    changes += replacement.finish()
    assert changes == expected
    assert {ns: sorted(paged.in_namespace(ns)) for ns in paged.namespaces()} == {
        "a": ["p@2", "q@1"],
        "b": ["r@1"],
    }


def test_ghosts_go_and_the_store_is_synced_only_when_the_list_is_finished(
    store: Store[str], clock: FakeClock
) -> None:
    store.upsert(obj("ghost", "1"))
    clock.now += 1
    replacement = store.begin_replace(clock.now)
    assert replacement.add([obj("p", "1")]) == [Change("a", "p", None, "p@1", ChangeKind.ADDED)]
    # A page does not say what the next pages hold: the ghost stays until the end.
    assert store.get("a", "ghost") == "ghost@1"
    assert not store.synced
    assert replacement.finish() == [Change("a", "ghost", "ghost@1", None, ChangeKind.DELETED)]
    assert store.synced
    with pytest.raises(RuntimeError, match="already finished"):
        replacement.add([obj("q", "1")])


def test_events_between_pages_win_over_later_pages(store: Store[str], clock: FakeClock) -> None:
    store.replace([obj("p", "1"), obj("q", "1")], started_at=clock.now)
    clock.now += 10
    replacement = store.begin_replace(clock.now)
    replacement.add([obj("p", "1")])
    clock.now += 1
    # Between the pages: q updated and r deleted by watch events, both newer than the LIST.
    store.upsert(obj("q", "5"))
    store.upsert(obj("r", "3"))
    store.delete(obj("r", "4"))
    assert replacement.add([obj("q", "1"), obj("r", "2")]) == []
    assert replacement.finish() == []
    assert sorted(store.in_namespace("a")) == ["p@1", "q@5"]


def test_a_remembered_write_handed_back_is_not_the_cache_catching_up() -> None:
    # A caller may check a copy it got from a check (a view built from the newest copy, then
    # checked again for the freshest): that is not the cache at the written version, and the
    # write must still be remembered while the cache is behind.
    writes = RecentWrites(10)
    cached, written = obj("q", "5"), obj("q", "9")
    writes.add(written)
    newest = writes.check_cache(cached)
    assert newest is written
    assert writes.check_cache(newest) is written
    assert writes.check_cache(cached) is written  # the cache is still at 5
    caught_up = obj("q", "9")
    assert writes.check_cache(caught_up) is caught_up
    assert 0 == len(writes)
