"""tally.app.heap: freed heap memory goes back to the operating system, periodically, and a
failing trim never stops the operator."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import threading
import weakref
from pathlib import Path

import pytest

from tally.app.heap import (
    FULL_COLLECTION_EVERY,
    HeapTrimmer,
    collector_paused,
    freeze_long_lived,
    full_collections_rarely,
    glibc_malloc_trim,
)
from tally.app.settings import Settings, SettingsError

pytestmark = pytest.mark.unit


def rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


def test_trim_gives_freed_heap_pages_back() -> None:
    # What the soak saw, on plain data: blocks above CPython's 512-byte small-object limit
    # come from malloc; freeing all but every 64th leaves the heap full of holes that glibc
    # keeps resident (the survivors pin its top, so nothing is returned on free).
    trim = glibc_malloc_trim()
    assert trim is not None, "this is a glibc system: tally's image and CI run on one"
    ctypes.CDLL(None).malloc_trim(0)  # start from a trimmed heap
    blocks = [bytearray(4000) for _ in range(40_000)]  # ~160 MB, touched (zero-filled)
    survivors = blocks[::64]
    del blocks
    before = rss_anon_kib()
    assert trim() is True
    after = rss_anon_kib()
    # 63 of every 64 blocks freed: ~157 MB of holes. At least 100 MiB must go back.
    assert before - after > 100 * 1024, (before, after)
    assert len(survivors) == 625


def test_trims_every_period_on_a_worker_thread() -> None:
    threads: list[int] = []
    observed: list[float] = []
    ticks = iter([10.0, 10.25, 20.0, 20.5])

    def trim() -> bool:
        threads.append(threading.get_ident())
        return True

    async def run() -> HeapTrimmer:
        twice = asyncio.Event()

        def observe(seconds: float) -> None:
            observed.append(seconds)
            if len(observed) == 2:
                twice.set()

        trimmer = HeapTrimmer(trim, 0.01, observe, clock=lambda: next(ticks))
        trimmer.start()
        await asyncio.wait_for(twice.wait(), 5)
        await trimmer.stop()
        return trimmer

    trimmer = asyncio.run(run())
    assert trimmer.trims == 2
    assert observed == [0.25, 0.5]  # the clock's differences, per call
    assert threading.get_ident() not in threads  # never on the event loop's thread


def test_a_failing_trim_is_logged_and_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    def trim() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("no")
        return False

    async def run() -> HeapTrimmer:
        trimmed = asyncio.Event()
        trimmer = HeapTrimmer(trim, 0.01, lambda _: trimmed.set())
        trimmer.start()
        await asyncio.wait_for(trimmed.wait(), 5)
        await trimmer.stop()
        return trimmer

    trimmer = asyncio.run(run())
    assert calls == 2  # the failure, then the next period's trim
    assert trimmer.trims == 1
    assert "heap trim failed" in caplog.text


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        HeapTrimmer(lambda: True, 0)


def test_the_period_setting() -> None:
    assert Settings.from_env({}).heap_trim_period == 60.0
    assert Settings.from_env({"TALLY_HEAP_TRIM_PERIOD": "0"}).heap_trim_period == 0.0
    with pytest.raises(SettingsError, match="TALLY_HEAP_TRIM_PERIOD='-5'"):
        Settings.from_env({"TALLY_HEAP_TRIM_PERIOD": "-5"})


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_freezing_keeps_what_lives_out_of_collections_and_collects_garbage_first() -> None:
    kept = _Node()
    kept.other = _Node()
    kept.other.other = kept  # a cycle that stays alive
    garbage = _Node()
    garbage.other = garbage  # a cycle nothing refers to: the collector's to free
    gone = weakref.ref(garbage)
    del garbage
    before = gc.get_freeze_count()
    try:
        frozen = freeze_long_lived()
        assert gone() is None  # collected, not frozen for good
        assert frozen == gc.get_freeze_count() > before
        # Frozen: no generation the collector walks holds the live cycle any more.
        assert not any(o is kept for o in gc.get_objects())
    finally:
        gc.unfreeze()


def test_the_collector_is_off_in_the_block_and_back_after_it_even_on_error() -> None:
    seen: list[bool] = []

    def failing_list() -> None:
        with collector_paused():
            seen.append(gc.isenabled())
            raise RuntimeError("a LIST failed")

    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="a LIST failed"):
        failing_list()
    assert [False] == seen
    assert gc.isenabled()


def test_a_collector_turned_off_outside_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_full_collections_are_considered_rarely_and_the_young_generations_stay() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # CPython's defaults
        full_collections_rarely()
        assert (700, 10, 100) == gc.get_threshold()
        assert FULL_COLLECTION_EVERY == 100
        gc.set_threshold(5000, 20, 10)
        full_collections_rarely()
        assert (5000, 20, FULL_COLLECTION_EVERY) == gc.get_threshold()
    finally:
        gc.set_threshold(*before)
