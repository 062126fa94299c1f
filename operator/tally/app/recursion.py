"""The process's recursion limit, raised once at start-up so that tally reads and handles the
deepest objects the API server stores.

The API server stores a custom resource's free-form content (a PodSet's pod template, any
``x-kubernetes-preserve-unknown-fields``) nested up to 10 000 levels
(:data:`tally.webhook.server.MAX_OBJECT_DEPTH`). Python's default limit (1 000) fails on a
tenth of that wherever a nested object is parsed (Kopf's watch streams, tally's LISTs, the
webhook's reviews: C code that counts each level against the same limit on CPython 3.11),
compared, printed or copied. Raised here, in the wiring, before the first watch or LIST, rather
than per call: the limit is the process's.

Left out: threads. Nothing in tally handles objects off the event loop's thread, whose stack
(the main thread's, 8 MiB) the sizing below assumes.
"""

from __future__ import annotations

import sys
from typing import Final

RECURSION_LIMIT: Final = 25_000
"""Twice the deepest object (``copy.deepcopy`` takes two frames a level: the PodSet controller
copies a template), plus tally's own call depth (Kopf, aiohttp, asyncio: a few hundred frames)
with room to spare; and low enough that C code recursing once a level within it stays inside
the main thread's 8 MiB stack. Measured on CPython 3.11 with no limit: ``repr`` of nested dicts
crashes the process near 40 000 levels (~210 bytes of C stack a level), ``==`` near 43 000,
``json.loads`` near 65 000; 25 000 levels of the worst is 5.3 MB. A body nested deeper than the
limit allows is refused with a RecursionError caught as an error, never a crash.

CPython 3.12 and 3.13 bound C recursion by a fixed limit of their own instead: there, deep JSON
depends on that, not on this."""


def raise_recursion_limit() -> int:
    """Raise the recursion limit to :data:`RECURSION_LIMIT` (never lower it); the limit set."""
    limit = max(sys.getrecursionlimit(), RECURSION_LIMIT)
    sys.setrecursionlimit(limit)
    return limit
