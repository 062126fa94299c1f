"""An open loop of requests: sent at scheduled times (Poisson arrivals), whatever the answers do.

A closed loop (``_common.closed_loop``) sends a client's next request only once the previous one
is answered, so when the server stalls the clients stop sending, and the requests that would have
arrived during the stall are never measured: coordinated omission. Here every request has a
scheduled send time fixed in advance and its latency is measured from that time, so a stall
shows in every request scheduled during it, including the wait for a connection or for the
sending loop itself, as users arriving independently would see it.

Pure asyncio and the standard library (the requests are whatever ``send`` does), so that the
schedule and the measurement are unit-tested without a cluster.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field


def poisson_offsets(rate: float, count: int, rng: random.Random) -> list[float]:
    """Send times of ``count`` requests arriving as a Poisson process of ``rate`` per second,
    in seconds from the loop's start: independent exponential gaps of mean ``1 / rate``."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, not {rate}")
    offsets: list[float] = []
    now = 0.0
    for _ in range(count):
        now += rng.expovariate(rate)
        offsets.append(now)
    return offsets


def split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` nearly equal whole parts, the larger ones first."""
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


@dataclass
class OpenLoop:
    """What :func:`open_loop` saw; times in seconds."""

    latencies: list[float] = field(default_factory=list)
    """From each admitted request's scheduled send time to its answer."""
    send_lags: list[float] = field(default_factory=list)
    """From each request's scheduled send time to when ``send`` was called: how far the
    sending side fell behind its schedule (already inside ``latencies``)."""
    refused: int = 0
    wall_s: float = 0.0
    """From the loop's start to the last answer."""


async def open_loop(
    offsets: Sequence[float],
    send: Callable[[int], Awaitable[bool]],
    *,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> OpenLoop:
    """Call ``send(i)`` at ``offsets[i]`` seconds after the start, each in a task of its own
    (never waiting for earlier answers); ``send`` returns whether the request was admitted.

    The latency of an admitted request is its answer's time minus its *scheduled* time.
    ``clock`` and ``sleep`` are injectable for tests (virtual time).
    """
    result = OpenLoop()
    started = clock()

    async def one(index: int, scheduled: float) -> None:
        result.send_lags.append(clock() - scheduled)
        if await send(index):
            result.latencies.append(clock() - scheduled)
        else:
            result.refused += 1

    async with asyncio.TaskGroup() as group:
        for index, offset in enumerate(offsets):
            scheduled = started + offset
            delay = scheduled - clock()
            if delay > 0:
                await sleep(delay)
            group.create_task(one(index, scheduled))
    result.wall_s = clock() - started
    return result
