"""The process's heap: the cyclic collector kept off what lives for good, and freed memory
returned to the operating system every so often.

**The collector.** CPython's full collections walk every object the collector tracks. Most of
tally's are there for the process's life (modules, classes, Kopf's machinery, the caches filled
at start-up), and a pod watch's stream of short-lived JSON keeps triggering collections: under
250 pod status updates/s a full collection took about 0.19 s of the event loop and came every
5-6 s, a pause that every review and event in flight waits out. :func:`freeze_long_lived` moves
what is alive once the caches are synced into the permanent generation (``gc.freeze``), after
one full collection (so no garbage is frozen with it); later full collections walk only what
came after. Before that, while the start-up's LISTs fill the caches, the collector is off
(:func:`collector_paused`). The runtime freezes once more when Kopf's first listings have
arrived: what Kopf keeps per object then lives as long as the object.

**Full collections, rarely.** Kopf wraps every watch event's object in views that refer to each
other, so each event leaves a cycle holding the object's whole JSON, which only the collector
frees. Most die young, in the collections of the youngest generations; those still in flight
when one runs are moved on to the oldest, and with CPython's default (a full collection
considered every 10 of the middle generation's) full collections came so often that they were
the largest part of a listing's replay: a Kopf pod watch doing nothing else, 60 000 pods, spent
34.5-35.3 s of CPU with 56-57 full collections, 21.8 s with one considered every 100 of them (5
full collections), its peak resident memory 187-189 MiB against 200 MiB
(:func:`full_collections_rarely`). CPython still holds a full collection back until what came
to the oldest generation since the last one is a quarter of what that one left there.

**Freed memory.**

Why: CPython hands every allocation above 512 bytes (watch events' JSON, object bodies, TLS
records) to the C library's ``malloc``. glibc keeps what is freed in its heap for reuse and
gives the pages back only from the top of the heap, so a long-running tally's resident memory
follows the high-water mark of its churn plus the holes between live blocks, not what it holds.
Measured in a 20-minute soak without faults (``bench/soak.py --faults none``): resident memory
rose 2.2-3.5 MiB per 10 minutes while the traced Python heap stayed within 1 MiB, and one
``malloc_trim(0)`` gave 27 MiB back. ``malloc_trim`` releases every free page of every arena
(``madvise``), which is what this runs periodically.

The call runs on a worker thread: ctypes releases the GIL for it, so the event loop keeps
serving reviews and events while glibc walks its arenas (a ``malloc`` on the loop waits only
for the arena being trimmed). Where the C library has no ``malloc_trim`` (musl, macOS) nothing
runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import time
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block (the start-up's LISTs), back as it was after.

    Filling the caches allocates millions of objects that all stay alive, and each LIST page's
    decoded JSON lives a while before refcounting frees it: the collector's full collections
    kept walking the growing heap, and at 150 000 pods they were more than half of the CPU the
    LISTs took (a replay of 300 pages of kwok-run pods into projections: 32.5 s of CPU with
    the collector, 13.5 s without). Nothing in those pages forms a cycle; what little cyclic
    garbage the block leaves, the collection :func:`freeze_long_lived` starts with takes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def freeze_long_lived() -> int:
    """Collect once, then keep every object alive now out of later collections; how many
    objects are frozen in all (a second call adds what came since)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


FULL_COLLECTION_EVERY = 100
"""Collections of the middle generation per full collection considered (CPython's default:
10)."""


def full_collections_rarely() -> None:
    """Consider a full collection only every :data:`FULL_COLLECTION_EVERY` collections of the
    middle generation; the younger generations' thresholds stay as they are."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


def glibc_malloc_trim() -> Callable[[], bool] | None:
    """glibc's ``malloc_trim(0)`` as a function (True when it released memory), or None where
    the C library has none."""
    try:
        # The symbols the interpreter itself is linked with: the C library's, without a
        # search of the library path.
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: bool(trim(0))


class HeapTrimmer:
    """Calls ``trim`` every ``period`` seconds on a worker thread until stopped; reports each
    call's duration to ``observe``."""

    def __init__(
        self,
        trim: Callable[[], bool],
        period: float,
        observe: Callable[[float], None] = lambda seconds: None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if period <= 0:
            raise ValueError(f"the period must be positive, not {period}")
        self._trim = trim
        self._period = period
        self._observe = observe
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self.trims = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="heap-trim")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            await self.trim_once()

    async def trim_once(self) -> None:
        started = self._clock()
        try:
            released = await asyncio.to_thread(self._trim)
        except Exception:
            # Memory not given back is no reason to stop trying, nor to stop the operator.
            logger.exception("heap trim failed")
            return
        seconds = self._clock() - started
        self.trims += 1
        self._observe(seconds)
        logger.debug("heap trimmed in %.1f ms (released: %s)", seconds * 1000, released)


def heap_trimmer(period: float, observe: Callable[[float], None]) -> HeapTrimmer | None:
    """A trimmer every ``period`` seconds (0: none), where glibc's ``malloc_trim`` exists."""
    trim = glibc_malloc_trim() if period else None
    return HeapTrimmer(trim, period, observe) if trim is not None else None
