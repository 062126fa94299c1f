"""The PodSet controller's client-side token bucket (``tally.workqueue.TokenBucket``, built by
``tally.podset.client.token_bucket``), driven by a fake clock: nothing sleeps for real."""

from __future__ import annotations

import asyncio

import pytest

from tally.app.settings import Settings
from tally.podset.client import token_bucket
from tally.workqueue import FakeClock, TokenBucket


class Sleeper:
    """Records each requested sleep instead of sleeping (the clock moves only by ``step``)."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.sleeps.append(delay)


async def test_burst_passes_at_once_then_qps_spaces_the_rest() -> None:
    clock = FakeClock()
    sleeper = Sleeper()
    bucket = TokenBucket(20, 30, clock=clock, sleep=sleeper)
    for _ in range(30):
        await bucket.wait()
    assert sleeper.sleeps == []  # the bucket starts full
    for _ in range(3):
        await bucket.wait()
    # Borrowed from the future: the 31st token exists after 1/20 s, the 32nd after 2/20 s ...
    assert sleeper.sleeps == pytest.approx([0.05, 0.10, 0.15])


async def test_tokens_refill_at_qps_up_to_burst() -> None:
    clock = FakeClock()
    sleeper = Sleeper()
    bucket = TokenBucket(10, 5, clock=clock, sleep=sleeper)
    for _ in range(5):
        await bucket.wait()
    clock.step(0.3)  # three tokens back
    for _ in range(3):
        await bucket.wait()
    assert sleeper.sleeps == []
    await bucket.wait()
    assert sleeper.sleeps == pytest.approx([0.1])
    clock.step(100)  # a long quiet spell refills to burst, not beyond
    sleeper.sleeps.clear()
    for _ in range(6):
        await bucket.wait()
    # After the 0.1 s debt is repaid the bucket holds 5: the 6th waits one token's time.
    assert sleeper.sleeps == pytest.approx([0.1])


async def test_concurrent_waiters_are_spaced_by_one_token_each() -> None:
    clock = FakeClock()
    sleeper = Sleeper()
    bucket = TokenBucket(4, 1, clock=clock, sleep=sleeper)
    await asyncio.gather(*(bucket.wait() for _ in range(5)))
    assert sorted(sleeper.sleeps) == pytest.approx([0.25, 0.5, 0.75, 1.0])


async def test_real_sleep_is_the_default() -> None:
    bucket = TokenBucket(1000, 1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(11):
        await bucket.wait()
    assert loop.time() - started >= 0.009  # ten waits of 1 ms each


def test_settings_choose_the_limiter() -> None:
    assert token_bucket(0, 30) is None  # 0 qps: unlimited, whatever the burst
    limited = token_bucket(20, 30)
    assert limited is not None
    assert (limited.qps, limited.burst) == (20, 30)
    one_second = token_bucket(2.5, 0)
    assert one_second is not None
    assert one_second.burst == 3
    settings = Settings.from_env({"TALLY_PODSET_QPS": "20", "TALLY_PODSET_BURST": "30"})
    assert (settings.podset_qps, settings.podset_burst) == (20.0, 30)
    assert (Settings().podset_qps, Settings().podset_burst) == (0.0, 0)
