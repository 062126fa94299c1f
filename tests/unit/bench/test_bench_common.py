"""bench/_common.py's closed loop and background task, on plain coroutines (no plane)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from kubernetes_asyncio import client

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

# bench/ is put on sys.path above, as the benchmarks run.
import _common  # noqa: E402

pytestmark = pytest.mark.unit


async def test_a_closed_loop_sends_each_request_once_and_records_refusals() -> None:
    sent: list[int] = []

    async def send(index: int) -> None:
        sent.append(index)
        await asyncio.sleep(0)
        if index == 3:
            raise client.ApiException(status=403, reason="Forbidden")

    loop = await _common.closed_loop(10, 4, send)

    assert list(range(10)) == sorted(sent)
    assert 9 == len(loop.latencies)
    assert ["403: None"] == loop.refusals  # no body: the message is the body, None
    assert loop.wall_s >= 0


async def test_a_background_task_runs_until_stopped() -> None:
    class Ticks(_common.Background):
        def __init__(self) -> None:
            super().__init__()
            self.ticks = 0

        async def _run(self) -> None:
            while True:
                self.ticks += 1
                await asyncio.sleep(0)

    ticks = Ticks()
    ticks.start()
    for _ in range(3):
        await asyncio.sleep(0)
    await ticks.stop()
    seen = ticks.ticks
    await asyncio.sleep(0)
    assert seen >= 1
    assert seen == ticks.ticks  # stopped: no tick since
    assert ticks.task is not None
    assert ticks.task.cancelled()
