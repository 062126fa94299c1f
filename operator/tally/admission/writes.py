"""A pass's status writes: every changed quota at once with compare and swap, what they came to
(:class:`WriteResult`), and the fresh read of those that lost.

:class:`QuotaWriter` is phase 4 of :meth:`~tally.admission.evaluator.QuotaEvaluator.check_quotas`
and the refresh of its phase 5. A write carries the resourceVersion that was read, so a quota
changed meanwhile fails it (a :class:`~tally.admission.accessor.Conflict`, the API server's
409); a ClusterQuota's view is written with each namespace's share of the charges, less what
the overcharge memory took out of the status it was judged by.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from tally.admission.accessor import Conflict, NotFound, QuotaAccessor
from tally.admission.attributes import resource_version
from tally.admission.checks import Quota
from tally.admission.errors import CONFLICT, AdmissionDenied, unknown_error
from tally.admission.metrics import AdmissionMetrics
from tally.admission.overcharges import Overcharges
from tally.admission.waiters import Waiter
from tally.machinery.errors import TooLarge
from tally.quota import resources
from tally.quota.identity import (
    QuotaIdentity,
    is_cluster_quota,
    quota_identity,
    quota_name,
    quota_uid,
)
from tally.quota.quantity import Quantity

__all__ = ["CONFLICT_BACKOFF_MAX_S", "CONFLICT_BACKOFF_S", "QuotaWriter", "WriteResult"]

logger = logging.getLogger(__name__)

CONFLICT_BACKOFF_S: Final = 0.005
"""The first retry after a lost compare-and-swap waits up to this long (uniformly at random),
each further retry up to twice as long, capped at :data:`CONFLICT_BACKOFF_MAX_S`: replicas
whose passes collided then write at different moments."""
CONFLICT_BACKOFF_MAX_S: Final = 0.1


def conflict_message(name: str, resource: str = "resourcequotas") -> str:
    """The API server's 409 text for a status write that lost its compare-and-swap."""
    return (
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )


@dataclass(frozen=True)
class WriteResult:
    """What writing a pass's changed quotas came to, by quota identity."""

    stored: Mapping[QuotaIdentity, str]
    """The resourceVersion each quota that was written now has."""
    failed: frozenset[QuotaIdentity]
    """The quotas whose write failed."""
    lost: frozenset[QuotaIdentity]
    """Those among :attr:`failed` whose write lost its compare-and-swap (409)."""
    error: AdmissionDenied | None
    """The last failure (None: every write landed)."""
    gone: frozenset[tuple[QuotaIdentity, str]] = frozenset()
    """Those among :attr:`failed` that were deleted since they were read (404), with the uid
    of the copy written: a retry skips them, though the cache may still hold them (a quota
    re-created under the same name is another uid, and judged)."""
    too_large: frozenset[QuotaIdentity] = frozenset()
    """Those among :attr:`failed` whose status the API server refused for its size: a retry
    would write the same status again, or a larger one."""


class QuotaWriter:
    """Writes the statuses a pass changed, and reads back those whose write lost."""

    def __init__(
        self, accessor: QuotaAccessor, overcharges: Overcharges, metrics: AdmissionMetrics
    ) -> None:
        self._accessor = accessor
        self._overcharges = overcharges
        self._metrics = metrics

    async def write(self, changed: Sequence[Quota], pending: Sequence[Waiter]) -> WriteResult:
        """Write the ``changed`` quotas at once, charging what ``pending`` waiters charge."""
        results = await asyncio.gather(
            *(self._update(quota, pending) for quota in changed), return_exceptions=True
        )
        stored: dict[QuotaIdentity, str] = {}
        failed: set[QuotaIdentity] = set()
        lost: set[QuotaIdentity] = set()
        gone: set[tuple[QuotaIdentity, str]] = set()
        too_large: set[QuotaIdentity] = set()
        error: AdmissionDenied | None = None
        for quota, outcome in zip(changed, results, strict=True):
            identity = quota_identity(quota)
            if not isinstance(outcome, BaseException):
                stored[identity] = resource_version(outcome)
                continue
            name = quota_name(quota)
            if isinstance(outcome, Conflict):
                self._metrics.write_conflicted()
                lost.add(identity)
                error = AdmissionDenied(CONFLICT, conflict_message(name, _resource_of(quota)))
            elif isinstance(outcome, NotFound):
                gone.add((identity, quota_uid(quota)))
                error = unknown_error(str(outcome))
            elif isinstance(outcome, TooLarge):
                logger.warning("quota admission: %s", outcome)
                too_large.add(identity)
                error = unknown_error(str(outcome))
            elif isinstance(outcome, AdmissionDenied):
                error = outcome
            elif isinstance(outcome, Exception):
                logger.warning("quota admission: writing quota %s failed: %r", name, outcome)
                error = unknown_error(str(outcome) or type(outcome).__name__)
            else:
                raise outcome  # CancelledError and friends
            failed.add(identity)
        return WriteResult(
            stored, frozenset(failed), frozenset(lost), error, frozenset(gone), frozenset(too_large)
        )

    async def refresh(self, quotas: Sequence[Quota], attempt: int) -> None:
        """Before retry ``attempt`` (1, 2, …): pause at random, then fetch ``quotas``, whose
        write lost its compare-and-swap, from the API (a failed fetch leaves the cached copy)."""
        pause = min(CONFLICT_BACKOFF_MAX_S, CONFLICT_BACKOFF_S * 2 ** (attempt - 1))
        await asyncio.sleep(random.uniform(0, pause))
        results = await asyncio.gather(
            *(self._accessor.refresh(q) for q in quotas), return_exceptions=True
        )
        for quota, outcome in zip(quotas, results, strict=True):
            if isinstance(outcome, Exception):
                logger.warning(
                    "quota admission: reading quota %s after a conflict failed: %s",
                    quota_name(quota), outcome,
                )  # fmt: skip
            elif isinstance(outcome, BaseException):
                raise outcome

    async def _update(self, quota: Quota, pending: Sequence[Waiter]) -> Quota:
        """Write one changed quota; a ClusterQuota's view with each namespace's share."""
        if not is_cluster_quota(quota):
            return await self._accessor.update_quota_status(quota)
        shares: dict[str, dict[str, Quantity]] = {}
        for waiter in pending:
            for charged, amount in waiter.charging:
                if charged is quota and amount:
                    shares[waiter.namespace] = resources.add(
                        shares.get(waiter.namespace, {}), amount
                    )
        return await self._accessor.update_quota_status(
            quota,
            charged_by_namespace=shares,
            given_back_by_namespace=self._overcharges.given_back(quota),
        )


def _resource_of(quota: Quota) -> str:
    return "clusterquotas.tally.dev" if is_cluster_quota(quota) else "resourcequotas"
