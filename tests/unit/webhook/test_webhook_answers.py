"""tally.webhook.answers: a retried review gets the first judgement; answers are kept for a
window, at most so many, and a judgement that failed is not kept."""

from __future__ import annotations

import asyncio

import pytest

from tally.webhook.answers import Answers, review_key

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _answer(value: str) -> str:
    return value


def test_a_key_is_the_webhook_and_the_bodys_digest() -> None:
    body = b'{"request": {"uid": "u-1"}}'
    assert review_key("quota", body) == review_key("quota", bytearray(body))
    assert review_key("quota", body) != review_key("validate-podsets", body)
    assert review_key("quota", body) != review_key("quota", body.replace(b"u-1", b"u-2"))


async def test_an_answer_is_found_until_the_window_ends() -> None:
    clock = Clock()
    answers: Answers[str] = Answers(window=30.0, max_answers=10, clock=clock)
    assert "allowed" == await answers.judge("k", _answer("allowed"))
    clock.now += 29.9
    found = answers.find("k")
    assert found is not None
    assert "allowed" == await found
    clock.now += 0.1
    assert answers.find("k") is None
    assert 0 == len(answers)


async def test_a_judgement_in_progress_is_shared() -> None:
    answers: Answers[str] = Answers(window=30.0, max_answers=10, clock=Clock())
    release = asyncio.Event()
    calls = []

    async def judge() -> str:
        calls.append(1)
        await release.wait()
        return "refused"

    first = answers.judge("k", judge())
    second = answers.find("k")
    assert second is first
    release.set()
    assert ("refused", "refused") == (await first, await second)
    assert [1] == calls


async def test_the_oldest_answers_go_first_past_the_most_kept() -> None:
    clock = Clock()
    answers: Answers[str] = Answers(window=30.0, max_answers=2, clock=clock)
    for key in ("a", "b", "c"):
        await answers.judge(key, _answer(key))
        clock.now += 1
    assert answers.find("a") is None
    assert ["b", "c"] == [await f for f in (answers.find("b"), answers.find("c")) if f]


async def test_a_judgement_in_progress_is_never_dropped() -> None:
    answers: Answers[str] = Answers(window=30.0, max_answers=1, clock=Clock())
    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        return "slow"

    slow_one = answers.judge("slow", slow())
    await answers.judge("a", _answer("a"))
    await answers.judge("b", _answer("b"))
    assert answers.find("slow") is slow_one
    release.set()
    assert "slow" == await slow_one


async def test_a_failed_judgement_is_not_kept() -> None:
    answers: Answers[str] = Answers(window=30.0, max_answers=10, clock=Clock())

    async def broken() -> str:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await answers.judge("k", broken())
    assert answers.find("k") is None


async def test_a_waiter_that_stops_waiting_does_not_stop_the_judgement() -> None:
    # The API server's first attempt ends (its connection reset) while tally judges; the
    # retry must still get that judgement, not start another.
    answers: Answers[str] = Answers(window=30.0, max_answers=10, clock=Clock())
    release = asyncio.Event()

    async def judge() -> str:
        await release.wait()
        return "allowed"

    waiter = asyncio.ensure_future(asyncio.shield(answers.judge("k", judge())))
    await asyncio.sleep(0)
    waiter.cancel()
    retry = answers.find("k")
    assert retry is not None
    release.set()
    assert "allowed" == await retry
