"""Rate limiters: exact delay sequences, requeue counts, ``forget``, overflow.

Ported from client-go ``util/workqueue/default_rate_limiters_test.go``. A limiter carries state
from call to call, so each case is a script of steps run against one limiter; the case id and
the comment above it name the upstream test. The token bucket and the default controller
limiter, which client-go does not test directly, get scripts derived from
``golang.org/x/time/rate``'s ``Reserve`` on a fake clock. Not covered: the queue side
(``test_rate_limiting.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence

import pytest

from tally.workqueue import clock as clocks
from tally.workqueue import limiters

pytestmark = pytest.mark.unit

MS = 0.001
MINUTE = 60.0
HOUR = 3600.0


@dataclasses.dataclass(frozen=True)
class When:
    """``when(item)`` returns ``expected`` seconds."""

    item: Hashable
    expected: float


@dataclasses.dataclass(frozen=True)
class Repeat:
    """``when(item)`` is called ``times`` times; the answers do not matter."""

    item: Hashable
    times: int


@dataclasses.dataclass(frozen=True)
class NumRequeues:
    """``num_requeues(item)`` returns ``expected``."""

    item: Hashable
    expected: int


@dataclasses.dataclass(frozen=True)
class Forget:
    """``forget(item)``."""

    item: Hashable


@dataclasses.dataclass(frozen=True)
class Step:
    """The fake clock moves ``seconds`` forward."""

    seconds: float


Script = Sequence[When | Repeat | NumRequeues | Forget | Step]
Factory = Callable[[clocks.Clock], limiters.RateLimiter[Hashable]]


def _exponential(base: float, maximum: float) -> Factory:
    return lambda _: limiters.ItemExponentialFailureRateLimiter(base, maximum)


def _fast_slow(fast: float, slow: float, attempts: int) -> Factory:
    return lambda _: limiters.ItemFastSlowRateLimiter(fast, slow, attempts)


def _max_of_fast_slow_and_exponential(_: clocks.Clock) -> limiters.RateLimiter[Hashable]:
    return limiters.MaxOfRateLimiter(
        limiters.ItemFastSlowRateLimiter(5 * MS, 3.0, 3),
        limiters.ItemExponentialFailureRateLimiter(1 * MS, 1.0),
    )


def _bucket(qps: float, burst: int) -> Factory:
    return lambda clock: limiters.BucketRateLimiter(qps, burst, clock=clock)


def _default(clock: clocks.Clock) -> limiters.RateLimiter[Hashable]:
    return limiters.default_controller_rate_limiter(clock=clock)


CASES = [
    # client-go: TestItemExponentialFailureRateLimiter
    pytest.param(
        _exponential(1 * MS, 1.0),
        [
            When("one", 1 * MS),
            When("one", 2 * MS),
            When("one", 4 * MS),
            When("one", 8 * MS),
            When("one", 16 * MS),
            NumRequeues("one", 5),
            When("two", 1 * MS),
            When("two", 2 * MS),
            NumRequeues("two", 2),
            Forget("one"),
            NumRequeues("one", 0),
            When("one", 1 * MS),
        ],
        id="TestItemExponentialFailureRateLimiter",
    ),
    # client-go: TestItemExponentialFailureRateLimiterOverFlow (first limiter)
    pytest.param(
        _exponential(1 * MS, 1000.0),
        [
            Repeat("one", 5),
            When("one", 32 * MS),
            Repeat("overflow1", 1000),
            When("overflow1", 1000.0),
        ],
        id="TestItemExponentialFailureRateLimiterOverFlow-ms",
    ),
    # client-go: TestItemExponentialFailureRateLimiterOverFlow (second limiter)
    pytest.param(
        _exponential(1 * MINUTE, 1000 * HOUR),
        [
            Repeat("two", 2),
            When("two", 4 * MINUTE),
            Repeat("overflow2", 1000),
            When("overflow2", 1000 * HOUR),
        ],
        id="TestItemExponentialFailureRateLimiterOverFlow-minutes",
    ),
    # tally-only: far past client-go's 1000 failures, where a Python float would overflow.
    pytest.param(
        _exponential(1 * MS, 1000.0),
        [Repeat("one", 5000), When("one", 1000.0), NumRequeues("one", 5001)],
        id="exponential-float-overflow-capped",
    ),
    # client-go: TestItemFastSlowRateLimiter
    pytest.param(
        _fast_slow(5 * MS, 10.0, 3),
        [
            When("one", 5 * MS),
            When("one", 5 * MS),
            When("one", 5 * MS),
            When("one", 10.0),
            When("one", 10.0),
            NumRequeues("one", 5),
            When("two", 5 * MS),
            When("two", 5 * MS),
            NumRequeues("two", 2),
            Forget("one"),
            NumRequeues("one", 0),
            When("one", 5 * MS),
        ],
        id="TestItemFastSlowRateLimiter",
    ),
    # client-go: TestMaxOfRateLimiter
    pytest.param(
        _max_of_fast_slow_and_exponential,
        [
            When("one", 5 * MS),
            When("one", 5 * MS),
            When("one", 5 * MS),
            When("one", 3.0),
            When("one", 3.0),
            NumRequeues("one", 5),
            When("two", 5 * MS),
            When("two", 5 * MS),
            NumRequeues("two", 2),
            Forget("one"),
            NumRequeues("one", 0),
            When("one", 5 * MS),
        ],
        id="TestMaxOfRateLimiter",
    ),
    # x/time/rate Reserve: a full bucket of 2 at 10 qps; the third token is borrowed 0.1 s
    # ahead, the fourth 0.2 s; after 0.5 s the debt (2 tokens) is repaid and 3 more have
    # accrued, capped at the burst of 2.
    pytest.param(
        _bucket(10, 2),
        [
            When("a", 0.0),
            When("b", 0.0),
            When("c", 0.1),
            When("a", 0.2),
            NumRequeues("a", 0),
            Step(0.5),
            When("a", 0.0),
            When("a", 0.0),
            When("a", 0.1),
        ],
        id="bucket-burst-then-borrow",
    ),
    # client-go DefaultTypedControllerRateLimiter, per item: 5 ms doubling, 5 requeues,
    # forget resets, capped at 1000 s (the bucket is refilled between failures).
    pytest.param(
        _default,
        [
            When("one", 5 * MS),
            Step(1),
            When("one", 10 * MS),
            Step(1),
            When("one", 20 * MS),
            Step(1),
            When("one", 40 * MS),
            Step(1),
            When("one", 80 * MS),
            NumRequeues("one", 5),
            Forget("one"),
            NumRequeues("one", 0),
            When("one", 5 * MS),
            Step(100),
            Repeat("two", 30),
            Step(100),
            When("two", 1000.0),
        ],
        id="default-per-item-exponential",
    ),
]


# client-go DefaultTypedControllerRateLimiter, overall: 100 retries of different items pass
# with the per-item 5 ms, then the 10 qps bucket spaces them 0.1 s apart.
def _default_bucket_script() -> Script:
    script: list[When | Repeat | NumRequeues | Forget | Step] = [
        When(f"item-{i}", 5 * MS) for i in range(100)
    ]
    script += [When("item-100", 0.1), When("item-101", 0.2), Step(0.2), When("item-102", 0.1)]
    return script


CASES.append(pytest.param(_default, _default_bucket_script(), id="default-overall-bucket"))


@pytest.mark.parametrize(("factory", "script"), CASES)
def test_rate_limiter_script(factory: Factory, script: Script) -> None:
    clock = clocks.FakeClock()
    limiter = factory(clock)
    for number, step in enumerate(script):
        match step:
            case When(item, expected):
                assert expected == limiter.when(item), f"step {number}: {step}"
            case Repeat(item, times):
                for _ in range(times):
                    limiter.when(item)
            case NumRequeues(item, expected):
                assert expected == limiter.num_requeues(item), f"step {number}: {step}"
            case Forget(item):
                limiter.forget(item)
            case Step(seconds):
                clock.step(seconds)


@pytest.mark.parametrize(
    ("qps", "burst"),
    [pytest.param(0, 1, id="zero-qps"), pytest.param(1, 0, id="zero-burst")],
)
def test_bucket_rejects_non_positive_settings(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        limiters.BucketRateLimiter(qps, burst, clock=clocks.FakeClock())
