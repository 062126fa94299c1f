"""``start_watched``: a task whose unexpected end is logged, and whose expected end is not.

Modelled on Kopf's ``create_guarded_task`` (``kopf/_cogs/aiokits/aiotasks.py``): a failure is
always logged with its traceback; an end or a cancellation only when the owner is not
stopping and the caller named it unexpected. Each case runs one task to its end on the real
loop (no sleeping) and counts the records. Not covered: the sites that use the helper, whose
own tests check their wording (``test_runner.py``'s "crashed" and "exited although ...").
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tally.workqueue import tasks

pytestmark = pytest.mark.unit

LOGGER = logging.getLogger("tests.watched")


class Boom(RuntimeError):
    pass


async def _raises() -> None:
    raise Boom("boom")


async def _returns() -> None:
    pass


async def _runs_until_cancelled() -> None:
    await asyncio.Event().wait()


@dataclasses.dataclass(frozen=True)
class Case:
    body: Callable[[], Coroutine[Any, Any, None]]
    cancel: bool = False
    stopping: bool = False
    ended: str | None = "%(task)s ended"
    cancelled: str | None = "%(task)s cancelled"
    expected: tuple[str, ...] = ()
    """The messages logged, in order."""


CASES = [
    pytest.param(Case(_raises, expected=("watched failed: Boom('boom')",)), id="raises"),
    pytest.param(
        Case(_raises, stopping=True, expected=("watched failed: Boom('boom')",)),
        id="raises-while-stopping-is-still-logged",
    ),
    pytest.param(Case(_returns, expected=("watched ended",)), id="ends-early"),
    pytest.param(Case(_returns, stopping=True), id="ends-while-stopping"),
    pytest.param(Case(_returns, ended=None), id="ends-and-may"),
    pytest.param(
        Case(_runs_until_cancelled, cancel=True, expected=("watched cancelled",)),
        id="cancelled-early",
    ),
    pytest.param(Case(_runs_until_cancelled, cancel=True, stopping=True), id="cancelled-stopping"),
    pytest.param(
        Case(_runs_until_cancelled, cancel=True, cancelled=None), id="cancelled-and-may-be"
    ),
]


@pytest.mark.parametrize("case", CASES)
async def test_what_is_logged_when_a_task_ends(
    case: Case, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER.name):
        task = tasks.start_watched(
            case.body(),
            name="watched",
            logger=LOGGER,
            level=logging.ERROR,
            ended=case.ended,
            cancelled=case.cancelled,
            stopping=lambda: case.stopping,
        )
        await asyncio.sleep(0)  # let it start
        if case.cancel:
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)  # done-callbacks run one loop iteration later
    records = [r for r in caplog.records if r.name == LOGGER.name]
    assert list(case.expected) == [record.getMessage() for record in records]
    assert all(logging.ERROR == record.levelno for record in records)
    for record in records:
        if "failed" in record.getMessage():
            assert record.exc_info is not None
            assert isinstance(record.exc_info[1], Boom)


async def test_defaults_critical_with_the_callers_fields(caplog: pytest.LogCaptureFixture) -> None:
    """CRITICAL by default; ``context`` fields beside ``task`` and ``error``; the task is named."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER.name):
        task = tasks.start_watched(
            _raises(),
            name="reflector-pods",
            logger=LOGGER,
            died="%(kind)s: %(task)s died: %(error)s",
            context={"kind": "pods"},
        )
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    assert "reflector-pods" == task.get_name()
    records = [r for r in caplog.records if r.name == LOGGER.name]
    assert [(logging.CRITICAL, "pods: reflector-pods died: boom")] == [
        (record.levelno, record.getMessage()) for record in records
    ]


async def test_a_stop_flag_set_later_is_read_when_the_task_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``stopping`` is asked at the end, not at the start: an owner that starts stopping after
    starting the task sees no alarm for the cancellation it then makes."""
    stopping = False
    with caplog.at_level(logging.DEBUG, logger=LOGGER.name):
        task = tasks.start_watched(
            _runs_until_cancelled(),
            name="worker",
            logger=LOGGER,
            cancelled="%(task)s cancelled",
            stopping=lambda: stopping,
        )
        await asyncio.sleep(0)
        stopping = True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    assert [] == [r.getMessage() for r in caplog.records if r.name == LOGGER.name]


async def test_cancel_and_wait_ends_a_running_task_without_raising() -> None:
    await tasks.cancel_and_wait(None)
    task = asyncio.create_task(_runs_until_cancelled())
    await asyncio.sleep(0)
    await tasks.cancel_and_wait(task)
    assert task.cancelled()


async def test_cancel_and_wait_re_raises_what_killed_a_dead_task() -> None:
    # Why the stops that must go on past a dead task call it only while the task is not done.
    task = asyncio.create_task(_raises())
    await asyncio.gather(task, return_exceptions=True)
    with pytest.raises(Boom):
        await tasks.cancel_and_wait(task)
