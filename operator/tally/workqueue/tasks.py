"""Background tasks that cannot die unnoticed: :func:`start_watched`.

This module owns the one way tally starts a long-running asyncio task: with a done-callback
that logs the task's end when the end is a surprise. Kopf supervises its own handlers but not
the tasks they start, and asyncio only mentions a task's exception when the task is
garbage-collected, if ever; so a reflector, a worker or a leader-election loop that died
would otherwise die silently. Kopf's ``aiotasks.create_guarded_task`` is the model: log a
failure, and complain when a task meant to run until it is stopped finishes.

How a task may end, and what is logged (every message at ``level``, CRITICAL by default):

* by an exception: always ``died``, with the traceback;
* by returning: ``ended``, if given and the owner is not ``stopping()``; a task that may
  return (one registration, one debounced refresh) passes no ``ended``;
* by cancellation: ``cancelled``, if given and the owner is not ``stopping()``; an owner
  that cancels its task only on stop passes no ``cancelled``.

Messages are ``%``-style with named fields, formatted by :mod:`logging` only when emitted:
``%(task)s`` is the task's name, ``%(error)r`` the exception (``None`` when the task
returned), and ``context`` adds the caller's own fields. Each caller keeps its own wording,
which operators (and e2e tests) search logs for.

The caller keeps the returned task (asyncio holds only a weak reference to it) and stops it.
Left out: restarting a task that died (a dead task is a bug to see in the logs, not to paper
over), and stopping tasks (each owner knows its own order).

Here, in the bottom layer, because every layer starts such tasks; it needs nothing but asyncio
and logging.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]

DIED = "%(task)s failed: %(error)r"
"""The default message for a task that raised."""


def _never() -> bool:
    return False


def start_watched(
    coro: Coroutine[Any, Any, T],
    *,
    name: str,
    logger: Logger,
    died: str = DIED,
    ended: str | None = None,
    cancelled: str | None = None,
    stopping: Callable[[], bool] = _never,
    level: int = logging.CRITICAL,
    context: Mapping[str, object] | None = None,
) -> asyncio.Task[T]:
    """Start ``coro`` as a task named ``name`` on the running loop, and log its end through
    ``logger`` when it is unexpected (see the module docstring); returns the task."""
    fields = dict(context or {})

    def log_end(task: asyncio.Task[T]) -> None:
        if task.cancelled():
            if cancelled is not None and not stopping():
                logger.log(level, cancelled, {**fields, "task": task.get_name(), "error": None})
            return
        error = task.exception()
        if error is not None:
            logger.log(
                level, died, {**fields, "task": task.get_name(), "error": error}, exc_info=error
            )
        elif ended is not None and not stopping():
            logger.log(level, ended, {**fields, "task": task.get_name(), "error": None})

    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(log_end)
    return task


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (nothing when None) and wait until it has ended; its cancellation is
    not re-raised here, so that the caller's stop goes on. A task that already died re-raises
    its exception here: a stop that must go on past a dead task calls this only while the task
    is not ``done()``."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
