"""Why a quota's ``count/`` resource is not counted, and telling it: the problems and their
reasons (the Event reasons), and the rule that each is told once.

:class:`Problem` is what discovery (:mod:`tally.resourcequota.discovery`) and the kinds'
reflectors (:mod:`tally.resourcequota.monitor`) find wrong with a named resource: missing,
forbidden, not quotable, or failing to list. :class:`ProblemReporter` tells it, never fatally:
a WARNING log line once per resource and problem, and a Warning Event (reason
:data:`REASON_UNKNOWN_RESOURCE`, :data:`REASON_FORBIDDEN`, :data:`REASON_UNSUPPORTED` or
:data:`REASON_FAILED_LIST`) on each quota naming it, once per quota and problem (with leader
election, Events by the leader only: every replica watches the same kinds, so that admission
and a takeover find them synced). A problem solved, or no longer named, is told again if it
comes back.

Its own module because upstream has no counterpart (its quota controller only logs), and
because it is pure: the Events go through an :class:`EventRecorder` protocol
(``tally.kube.events.WarningRecorder`` in production), so the once-only rule is tested with
plain data.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from tally.evaluators.base import GroupResource

logger = logging.getLogger(__name__)

Obj = Mapping[str, Any]

REASON_UNKNOWN_RESOURCE: Final = "UnknownResource"
"""A quota counts a resource the API server does not serve (no such group, version or
resource; a deleted CRD)."""
REASON_FORBIDDEN: Final = "Forbidden"
"""tally may not discover, list or watch the resource (RBAC)."""
REASON_UNSUPPORTED: Final = "UnsupportedResource"
"""The resource exists but cannot be counted: cluster-scoped, or lacking a required verb."""
REASON_FAILED_LIST: Final = "FailedList"
"""The API server keeps failing to list the resource (its conversion webhook is down, its
aggregated API server is gone): retried, and reported until a LIST succeeds. Only the quotas
naming it wait; every other quota is counted as usual."""
EVENT_COMPONENT: Final = "tally"


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a named resource is not counted."""

    reason: str
    """One of the ``REASON_*`` constants (the Event reason)."""
    message: str


class EventRecorder(Protocol):
    """Tells a quota's readers why something it names is not counted."""

    async def warn(self, quota_obj: Obj, reason: str, message: str) -> None: ...


class ProblemReporter:
    """Tells each problem once per resource (a log line) and once per quota naming it (a
    Warning Event), remembering what it told.

    ``may_report``: whether Events may be posted now (with leader election, only by the
    leader; what is left untold is told at the first pass that may).
    """

    def __init__(self, recorder: EventRecorder, may_report: Callable[[], bool]) -> None:
        self._recorder = recorder
        self._may_report = may_report
        self.logged: dict[GroupResource, Problem] = {}
        self.told: set[tuple[str, GroupResource, str]] = set()
        """(quota uid or namespace/name, resource, reason)."""

    async def report(
        self,
        problems: Mapping[GroupResource, Problem],
        wanted: Mapping[GroupResource, Sequence[Obj]],
    ) -> None:
        """Log each of ``problems`` not yet logged, and tell each quota in ``wanted`` naming it
        what it has not been told yet."""
        for gr, problem in sorted(problems.items()):
            logged = self.logged.get(gr)
            if logged is None or logged.reason != problem.reason:
                self.logged[gr] = problem
                logger.warning(
                    "dynamic kinds: %s is not counted (%s): %s; quotas naming it: %s",
                    gr, problem.reason, problem.message,
                    ", ".join(_quota_name(q) for q in wanted.get(gr, ())),
                )  # fmt: skip
            if not self._may_report():
                continue  # not the leader: untold, so told once this replica leads
            for quota_obj in wanted.get(gr, ()):
                key = (_quota_identity(quota_obj), gr, problem.reason)
                if key in self.told:
                    continue
                try:
                    await self._recorder.warn(
                        quota_obj,
                        problem.reason,
                        f"usage of {gr} is not tracked: {problem.message}",
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    logger.warning(
                        "dynamic kinds: could not record an event on %s: %s",
                        _quota_name(quota_obj), error,
                    )  # fmt: skip
                    continue
                self.told.add(key)

    def forget(
        self,
        problems: Mapping[GroupResource, Problem],
        wanted: Mapping[GroupResource, Sequence[Obj]],
    ) -> None:
        """A problem solved, or no longer named, may be reported again if it comes back."""
        for gr in list(self.logged):
            if gr not in problems:
                del self.logged[gr]
        current = {
            (_quota_identity(q), gr, problem.reason)
            for gr, problem in problems.items()
            for q in wanted.get(gr, ())
        }
        self.told &= current


def _quota_name(quota_obj: Obj) -> str:
    metadata = quota_obj.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


def _quota_identity(quota_obj: Obj) -> str:
    metadata = quota_obj.get("metadata") or {}
    return str(metadata.get("uid") or _quota_name(quota_obj))
