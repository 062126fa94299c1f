"""Rate limiters: how long an item should wait before it is retried (client-go
``default_rate_limiters.go``).

This module owns the :class:`RateLimiter` protocol (``when``, ``forget``, ``num_requeues``)
and its implementations, which combine:

* :class:`ItemExponentialFailureRateLimiter`: per item, ``base * 2**failures``, capped at a
  maximum. Failures count up on every ``when`` until ``forget``.
* :class:`BucketRateLimiter`: one token bucket shared by all items (``golang.org/x/time/rate``
  ``Limiter.Reserve``, the :class:`~tally.workqueue.tokenbucket.TokenBucket`), which bounds the
  overall retry rate.
* :class:`ItemFastSlowRateLimiter`: a few quick retries per item, then slow ones.
* :class:`MaxOfRateLimiter`: the worst (longest) answer of several limiters.

:func:`default_controller_rate_limiter` is client-go's ``DefaultTypedControllerRateLimiter``.

Durations are ``float`` seconds. The limiters are plain synchronous objects for one event
loop; client-go guards each with a mutex, which a single loop does not need.

Left out: ``WithMaxWaitRateLimiter`` and the typed/untyped constructor pairs.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from tally.workqueue import clock as clocks
from tally.workqueue import tokenbucket

T = TypeVar("T", bound=Hashable)
T_contra = TypeVar("T_contra", bound=Hashable, contravariant=True)


class RateLimiter(Protocol[T_contra]):
    """Decides how long an item waits before it is added again."""

    def when(self, item: T_contra) -> float:
        """How many seconds ``item`` should wait now; calling this counts one more failure."""

    def forget(self, item: T_contra) -> None:
        """Stop tracking ``item``: it succeeded, or it is given up on. Either way, forget."""

    def num_requeues(self, item: T_contra) -> int:
        """How many failures ``item`` has had since it was last forgotten."""


class ItemExponentialFailureRateLimiter(Generic[T]):
    """``base_delay * 2**failures`` per item, never more than ``max_delay``.

    Giving up after too many failures, and expiring old failures, are up to the caller
    (client-go says the same). Call ``forget`` once an item succeeds, or its counter stays
    forever.
    """

    def __init__(self, base_delay: float, max_delay: float) -> None:
        self._base_delay = base_delay
        self._max_delay = max_delay
        #: Failures per item since its last ``forget``; an absent item has none.
        self._failures: dict[T, int] = {}

    def when(self, item: T) -> float:
        exponent = self._failures.get(item, 0)
        self._failures[item] = exponent + 1
        # client-go caps the float back-off before converting it to a 64-bit Duration; a
        # Python float instead overflows with an error past about 2**1023, so catch that.
        try:
            backoff = math.ldexp(self._base_delay, exponent)
        except OverflowError:
            return self._max_delay
        return min(backoff, self._max_delay)

    def num_requeues(self, item: T) -> int:
        return self._failures.get(item, 0)

    def forget(self, item: T) -> None:
        self._failures.pop(item, None)


class ItemFastSlowRateLimiter(Generic[T]):
    """``fast_delay`` for an item's first ``max_fast_attempts`` failures, ``slow_delay`` after."""

    def __init__(self, fast_delay: float, slow_delay: float, max_fast_attempts: int) -> None:
        self._fast_delay = fast_delay
        self._slow_delay = slow_delay
        self._max_fast_attempts = max_fast_attempts
        #: Failures per item since its last ``forget``.
        self._failures: dict[T, int] = {}

    def when(self, item: T) -> float:
        failures = self._failures.get(item, 0) + 1
        self._failures[item] = failures
        return self._fast_delay if failures <= self._max_fast_attempts else self._slow_delay

    def num_requeues(self, item: T) -> int:
        return self._failures.get(item, 0)

    def forget(self, item: T) -> None:
        self._failures.pop(item, None)


class BucketRateLimiter(Generic[T]):
    """A token bucket shared by all items: ``qps`` tokens a second, at most ``burst`` saved.

    Each ``when`` takes one token, borrowing it from the future if the bucket is empty, and
    returns how long until that token exists (``rate.Limiter.Reserve().Delay()``, by
    :meth:`tally.workqueue.tokenbucket.TokenBucket.reserve`). The bucket starts full. It tracks
    no items, so ``num_requeues`` is always 0 and ``forget`` does nothing.
    """

    def __init__(self, qps: float, burst: int, *, clock: clocks.Clock | None = None) -> None:
        if qps <= 0 or burst <= 0:
            raise ValueError(f"qps and burst must be positive, got qps={qps} burst={burst}")
        self._bucket = tokenbucket.TokenBucket(qps, burst, clock=clock)

    def when(self, item: T) -> float:
        return self._bucket.reserve()

    def num_requeues(self, item: T) -> int:
        return 0

    def forget(self, item: T) -> None:
        pass


class MaxOfRateLimiter(Generic[T]):
    """Asks every limiter and answers with the longest delay and the highest requeue count.

    As client-go warns: combined with a token bucket, the burst can appear exceeded when some
    items were separately delayed for longer.
    """

    def __init__(self, *limiters: RateLimiter[T]) -> None:
        self._limiters = limiters

    def when(self, item: T) -> float:
        # Every limiter is asked (not short-circuited): each must count the failure.
        return max((limiter.when(item) for limiter in self._limiters), default=0.0)

    def num_requeues(self, item: T) -> int:
        return max((limiter.num_requeues(item) for limiter in self._limiters), default=0)

    def forget(self, item: T) -> None:
        for limiter in self._limiters:
            limiter.forget(item)


#: Per-item exponential back-off of the default controller limiter: 5 ms doubling per failure.
DEFAULT_BASE_DELAY = 0.005
#: ... capped at 1000 s (about 17 minutes), reached after 18 failures.
DEFAULT_MAX_DELAY = 1000.0
#: Overall retry rate of the default controller limiter, across all items: 10 per second...
DEFAULT_QPS = 10.0
#: ... with bursts of up to 100. This bounds retries only; first adds are never limited.
DEFAULT_BURST = 100


def default_controller_rate_limiter(
    *, clock: clocks.Clock | None = None
) -> MaxOfRateLimiter[Hashable]:
    """client-go's default: per item, exponential 5 ms to 1000 s; overall, a 10 qps bucket with
    a burst of 100. An item waits for whichever is longer. ``clock`` feeds the bucket (tests)."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(DEFAULT_BASE_DELAY, DEFAULT_MAX_DELAY),
        BucketRateLimiter(DEFAULT_QPS, DEFAULT_BURST, clock=clock),
    )


if TYPE_CHECKING:
    # Compile-time checks that each limiter satisfies the protocol, like client-go's
    # `var _ RateLimiter = &ItemExponentialFailureRateLimiter{}`.
    _exponential: RateLimiter[str] = ItemExponentialFailureRateLimiter[str](1.0, 2.0)
    _fast_slow: RateLimiter[str] = ItemFastSlowRateLimiter[str](1.0, 2.0, 3)
    _bucket: RateLimiter[str] = BucketRateLimiter[str](1.0, 1)
    _max_of: RateLimiter[str] = MaxOfRateLimiter[str]()
