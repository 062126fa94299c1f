"""The overcharge memory: charges this process wrote into quotas' statuses for requests it then
refused, and the statuses judged without them.

A quota whose status holds such a charge is judged without it by the evaluator's next passes
for as long as its status is the version that write stored: the recalculation that gives the
charge back takes a moment, and the next request of the namespace would otherwise be refused
against usage that no object makes up. :class:`Overcharges` says why that is exact;
:class:`~tally.admission.evaluator.QuotaEvaluator` adds to it when a pass ends and reads through
it (:meth:`Overcharges.without`, :meth:`Overcharges.given_back`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from tally.admission.attributes import resource_version
from tally.admission.checks import Quota
from tally.quota import resources
from tally.quota.identity import QuotaIdentity, quota_identity
from tally.quota.quantity import Quantity

__all__ = ["OVERCHARGE_MEMORY_S", "Overcharges"]

OVERCHARGE_MEMORY_S: Final = 60.0
"""How long a charge written for a request that was then refused is remembered for the
version of its quota that holds it: far longer than the recalculation that replaces that
version takes, short enough that the memory stays small."""


@dataclass
class _Overcharge:
    version: str
    """The quota's ``metadata.resourceVersion`` whose ``status.used`` holds ``amounts``."""
    amounts: dict[str, Quantity]
    since: float
    by_namespace: dict[str, dict[str, Quantity]] = field(default_factory=dict)
    """``amounts`` by the namespace of the requests they were charged for: a ClusterQuota's
    status keeps each namespace's share."""


class Overcharges:
    """Charges this process wrote into quotas' statuses for requests it then refused.

    A pass writes every changed quota at once; when one write is lost and the retry refuses a
    request, that request's charge is already in the other quotas' statuses until the
    recalculation the ledger asks for lands. Judging the next requests against such a status,
    minus those charges, is exact as long as the status read is the very version the write
    stored (``metadata.resourceVersion``): a write that follows carries that version, so if
    anyone changed the quota meanwhile it fails its compare-and-swap and is judged again
    against the newer status, which this never touches.

    A ClusterQuota's view is judged the same way; its status also keeps each namespace's
    share, which a lower total alone would contradict, so the write that follows lowers the
    shares by the same charges (:meth:`given_back`).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_quota: dict[QuotaIdentity, _Overcharge] = {}

    def __len__(self) -> int:
        return len(self._by_quota)

    def add(
        self,
        identity: QuotaIdentity,
        version: str,
        amounts: Mapping[str, Quantity],
        namespace: str = "",
    ) -> None:
        """``amounts`` in the status ``version`` of quota ``identity``, charged for a request
        of ``namespace``, charged nothing real."""
        if not version:
            return
        now = self._clock()
        self._forget_before(now - OVERCHARGE_MEMORY_S)
        known = self._by_quota.get(identity)
        if known is None or known.version != version:
            known = self._by_quota[identity] = _Overcharge(version, {}, now)
        known.amounts = resources.add(known.amounts, amounts)
        known.by_namespace[namespace] = resources.add(
            known.by_namespace.get(namespace, {}), amounts
        )

    def given_back(self, quota: Quota) -> dict[str, dict[str, Quantity]]:
        """By namespace, what :meth:`without` took out of ``quota``'s status (nothing unless
        ``quota`` is the version that holds it)."""
        known = self._by_quota.get(quota_identity(quota))
        if known is None or resource_version(quota) != known.version:
            return {}
        return {namespace: dict(amounts) for namespace, amounts in known.by_namespace.items()}

    def without(self, quotas: list[Quota]) -> list[Quota]:
        """``quotas``, each whose status is a version holding overcharges without them."""
        if not self._by_quota:
            return quotas
        self._forget_before(self._clock() - OVERCHARGE_MEMORY_S)
        return [self._less(quota) for quota in quotas]

    def _less(self, quota: Quota) -> Quota:
        known = self._by_quota.get(quota_identity(quota))
        if known is None or resource_version(quota) != known.version:
            return quota
        status = quota.get("status")
        if not isinstance(status, Mapping):
            return quota
        try:
            used = resources.parse_resource_list(status.get("used"), "status.used")
        except resources.ResourceListError:
            return quota  # the checks refuse it in their own words
        less = resources.subtract_non_negative(used, resources.mask(known.amounts, used))
        return {**quota, "status": {**status, "used": resources.to_strings(less)}}

    def _forget_before(self, moment: float) -> None:
        for identity in [i for i, o in self._by_quota.items() if o.since < moment]:
            del self._by_quota[identity]
