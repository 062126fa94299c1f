"""Retried reviews answered once: the API server's second call with the same review gets the
first call's answer, and its objects are never judged, or charged, twice.

The API server sends a webhook call again, with the very same bytes, when it did not get the
answer: its client sends it again after a 429 or 5xx carrying ``Retry-After`` (client-go's
``rest.Request``, up to 10 times within the call's timeout), and a connection reset can end
one attempt after tally judged it. Quota admission charges what it allows, so judging the
second attempt would charge the same object twice.

A review is known by its webhook and a digest of its raw bytes, which hold its
``request.uid`` (:func:`review_key`). A uid alone is never trusted: anyone who reaches the port
can send a review with a uid it has seen, and such a review is judged on its own. One whose
bytes are the same as an answered one can only get the answer that one got, which the sender of
those bytes already had.

While the first is being judged, the second awaits the same judgement; once answered, the
answer is kept for ``window`` seconds, at most ``max_answers`` of them (the oldest go first).
Judgements in progress are never dropped: there are at most as many as reviews in flight.

Pure asyncio, no I/O: the clock is injected.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, NamedTuple, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ReviewKey(NamedTuple):
    webhook: str
    """The webhook id the review was sent to: the same review sent to two webhooks is judged
    by each."""
    digest: bytes
    """SHA-256 of the request body as received, ``request.uid`` included: two bodies with the
    same digest carry the same uid."""


def review_key(webhook: str, body: bytes | bytearray) -> ReviewKey:
    """Known before the body is parsed, so that a retry costs no parse."""
    return ReviewKey(webhook, hashlib.sha256(body).digest())


class _Answer(NamedTuple, Generic[T]):
    expires: float
    value: T


class Answers(Generic[T]):
    """Answers by :class:`ReviewKey`: in progress (awaitable) or given (kept a while)."""

    def __init__(
        self,
        *,
        window: float,
        max_answers: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.max_answers = max_answers
        self._clock = clock
        self._judging: dict[Hashable, asyncio.Future[T]] = {}
        # In the order they were given, so that the oldest is always first.
        self._given: collections.OrderedDict[Hashable, _Answer[T]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._judging) + len(self._given)

    def find(self, key: Hashable) -> asyncio.Future[T] | None:
        """The answer for ``key``, given or to come; None if it is unknown (or forgotten)."""
        self._forget_expired()
        judging = self._judging.get(key)
        if judging is not None:
            return judging
        given = self._given.get(key)
        if given is None:
            return None
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        done.set_result(given.value)
        return done

    def judge(self, key: Hashable, judgement: Awaitable[T]) -> asyncio.Future[T]:
        """Start ``judgement`` as the answer for ``key`` (which :meth:`find` did not know).

        The judgement runs in a task of its own: a caller that stops waiting (its connection
        closed under it) does not stop it, so that the retry which follows still gets it. Await
        the result through :func:`asyncio.shield`. An answer that failed is not kept: the next
        attempt is judged again.
        """
        task = asyncio.ensure_future(judgement)
        self._judging[key] = task
        task.add_done_callback(lambda done: self._given_or_failed(key, done))
        return task

    def _given_or_failed(self, key: Hashable, done: asyncio.Future[T]) -> None:
        del self._judging[key]
        if done.cancelled():
            return
        if done.exception() is not None:
            # Retrieved here so that asyncio does not report it again; every waiter gets it.
            logger.debug("judging %r failed: %r", key, done.exception())
            return
        if self.max_answers == 0:
            return
        self._given[key] = _Answer(self._clock() + self.window, done.result())
        self._forget_expired()

    def _forget_expired(self) -> None:
        now = self._clock()
        given = self._given
        while given and (
            len(given) > self.max_answers or next(iter(given.values())).expires <= now
        ):
            given.popitem(last=False)
