"""tally.app.readiness: ready only once the loop has been prompt for a window since the webhook
began to serve; latched; bounded by the timeout; unready when stopping; the endpoint's answers."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import aiohttp
import pytest

from tally.app.readiness import Readiness, ReadinessEndpoint, sample_loop_lag

pytestmark = pytest.mark.unit


def gate(max_lag: float = 0.1, window: float = 5.0, timeout: float = 60.0) -> Readiness:
    return Readiness(max_lag=max_lag, window=window, timeout=timeout)


def test_not_ready_before_the_webhook_serves_however_prompt_the_loop() -> None:
    readiness = gate()
    for tick in range(100):
        readiness.observe(0.001, now=tick * 0.1)
    ready, why = readiness.check(10.0)
    assert not ready
    assert "caches are not synced" in why


def test_ready_once_prompt_for_the_window_since_serving() -> None:
    readiness = gate()
    readiness.serving(100.0)
    readiness.observe(0.01, now=104.9)
    assert not readiness.check(104.9)[0]
    readiness.observe(0.01, now=105.0)
    assert readiness.check(105.0) == (True, "ok")


def test_a_late_timer_restarts_the_window() -> None:
    readiness = gate()
    readiness.serving(100.0)
    readiness.observe(0.5, now=103.0)  # the listing's replay: 0.5 s late
    readiness.observe(0.01, now=107.0)
    ready, why = readiness.check(107.0)
    assert not ready
    assert "0.500 s late 4.0 s ago" in why
    # 5 s after the late one, with only prompt samples since:
    readiness.observe(0.02, now=108.0)
    assert readiness.check(108.0) == (True, "ok")


def test_a_lag_equal_to_the_bound_counts_as_prompt() -> None:
    readiness = gate(max_lag=0.1)
    readiness.serving(0.0)
    readiness.observe(0.1, now=4.0)
    assert readiness.check(5.0)[0]


def test_latched_once_ready() -> None:
    readiness = gate()
    readiness.serving(0.0)
    assert readiness.check(5.0)[0]
    readiness.observe(3.0, now=6.0)  # a burst after the start does not pull the endpoint
    assert readiness.check(6.0) == (True, "ok")


def test_ready_at_the_timeout_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    readiness = gate(window=5.0, timeout=20.0)
    readiness.serving(0.0)
    for second in range(20):
        readiness.observe(0.3, now=float(second))
    assert not readiness.check(19.9)[0]
    with caplog.at_level(logging.WARNING, logger="tally.app.readiness"):
        assert readiness.check(20.0) == (True, "ok")
    assert "ready without a prompt event loop" in caplog.text
    assert "0.300 s late" in caplog.text


def test_start_up_work_pending_holds_readiness_and_the_window_starts_after_it() -> None:
    pending: list[str] = ["the start-up re-list of pods is scheduled or under way"]
    readiness = Readiness(max_lag=0.1, window=5.0, timeout=60.0,
                          pending=lambda: pending[0] if pending else None)  # fmt: skip
    readiness.serving(0.0)
    readiness.observe(0.01, now=20.0)  # prompt all along, but the re-list is still to come
    assert readiness.check(20.0) == (
        False,
        "starting: the start-up re-list of pods is scheduled or under way",
    )
    pending.clear()
    readiness.observe(0.01, now=24.9)  # 4.9 s after the last check that found it pending
    ready, why = readiness.check(24.9)
    assert not ready
    assert "starting: the webhook serves since 24.9 s" in why
    assert readiness.check(25.0) == (True, "ok")


def test_ready_at_the_timeout_even_with_start_up_work_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    readiness = Readiness(max_lag=0.1, window=5.0, timeout=20.0,
                          pending=lambda: "the start-up re-list of pods is under way")  # fmt: skip
    readiness.serving(0.0)
    assert not readiness.check(19.9)[0]
    with caplog.at_level(logging.WARNING, logger="tally.app.readiness"):
        assert readiness.check(20.0) == (True, "ok")
    assert "ready with start-up work still pending" in caplog.text
    assert "the start-up re-list of pods is under way" in caplog.text


def test_start_up_work_that_moves_on_is_waited_for_past_the_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Kopf's listing of 150 000 pods arrives for minutes: each check finds less to come.
    left = [100]
    readiness = Readiness(
        max_lag=0.1, window=5.0, timeout=20.0,
        pending=lambda: f"{left[0]} pods to come" if left[0] else None,
    )  # fmt: skip
    readiness.serving(0.0)
    for second in range(0, 60, 10):
        left[0] -= 10
        assert readiness.check(float(second)) == (False, f"starting: {left[0]} pods to come")
    # Stuck at 40 from 50 s on: ready the timeout after the last progress, not before.
    assert not readiness.check(69.9)[0]
    with caplog.at_level(logging.WARNING, logger="tally.app.readiness"):
        assert readiness.check(70.0) == (True, "ok")
    assert "made no progress for 20 s" in caplog.text
    assert "40 pods to come" in caplog.text


def test_the_loop_lag_timeout_counts_from_the_end_of_the_start_up_work() -> None:
    pending = ["the start-up re-list of pods is under way"]
    readiness = Readiness(max_lag=0.1, window=5.0, timeout=20.0,
                          pending=lambda: pending[0] if pending else None)  # fmt: skip
    readiness.serving(0.0)
    readiness.check(15.0)
    pending.clear()
    for second in range(15, 35):
        readiness.observe(0.3, now=float(second))  # late all along
    assert not readiness.check(34.9)[0]  # 20 s after the work was last found pending, not 0
    assert readiness.check(35.0) == (True, "ok")


def test_stopping_is_unready_even_when_ready() -> None:
    readiness = gate()
    readiness.serving(0.0)
    assert readiness.check(5.0)[0]
    readiness.stopping()
    assert readiness.check(6.0) == (False, "stopping")


def test_every_lag_is_reported() -> None:
    seen: list[float] = []
    readiness = Readiness(max_lag=0.1, window=1.0, timeout=2.0, on_lag=seen.append)
    readiness.observe(0.02, now=1.0)
    readiness.observe(0.3, now=2.0)
    assert [0.02, 0.3] == seen


def test_window_longer_than_the_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="at most the timeout"):
        Readiness(max_lag=0.1, window=10.0, timeout=5.0)


async def test_the_sampler_sees_a_blocked_loop() -> None:
    lags: list[float] = []
    sampler = asyncio.create_task(sample_loop_lag(lambda lag, _: lags.append(lag), 0.01))
    await asyncio.sleep(0.05)
    time.sleep(0.2)  # noqa: ASYNC251  (the point: the loop blocked, the wake-up ~0.2 s late)
    await asyncio.sleep(0.05)
    sampler.cancel()
    assert max(lags) >= 0.15


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_the_endpoint_answers_503_then_200_then_503_when_stopping() -> None:
    readiness = Readiness(max_lag=1.0, window=0.3, timeout=10.0)
    endpoint = ReadinessEndpoint(readiness)
    port = _free_port()
    await endpoint.start("127.0.0.1", port)
    url = f"http://127.0.0.1:{port}/readyz"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as response:
                assert 503 == response.status
                assert "not synced" in await response.text()
            readiness.serving(asyncio.get_running_loop().time())
            await asyncio.sleep(0.5)  # the sampler's prompt samples pass the 0.3 s window
            async with session.get(url) as response:
                assert (200, "ok\n") == (response.status, await response.text())
            readiness.stopping()
            async with session.get(url) as response:
                assert 503 == response.status
    finally:
        await endpoint.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


async def test_port_zero_samples_without_serving() -> None:
    seen: list[float] = []
    readiness = Readiness(max_lag=1.0, window=1.0, timeout=2.0, on_lag=seen.append)
    endpoint = ReadinessEndpoint(readiness)
    await endpoint.start("127.0.0.1", 0)
    await asyncio.sleep(0.25)
    await endpoint.stop()
    assert len(seen) >= 1
