"""Telling this process's status writes from other replicas' on the quota watch.

With leader election, every replica's admission raises ``status.used`` (its charges), while
only the leader's controller recalculates. A raise the leader did not write is another
replica's charge whose object has not reached the leader's caches yet: it is held in the
charge ledger, or the next recalculation would erase it and admit past the limit. A write's
resourceVersion is known only when its PUT returns, and its watch event may come first: raises
seen while a PUT of that quota is in flight wait until it returns, then are classified in
order. Each map is emptied as events pass (up to the event's resourceVersion) and dropped with
its quota (:meth:`OwnWrites.forget`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tally.charges.ledger import Charge, ChargeLedger
from tally.quota.identity import QuotaKey
from tally.quota.quantity import Quantity

Obj = Mapping[str, Any]


def _version(quota: Obj) -> int | None:
    try:
        return int((quota.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return None


class OwnWrites:
    """Status writes in flight and done, by quota; raises others wrote, held as charges."""

    def __init__(self, charges: ChargeLedger | None = None) -> None:
        """``charges``: where raises this process did not write are held; None ignores them.
        Pass one only when other replicas' admission may charge the same quotas (leader
        election): with a single replica, a raise it did not write is someone editing the
        status, which the next recalculation corrects at once, as upstream's controller does."""
        self._charges = charges
        self._writing: dict[QuotaKey, int] = {}
        self._written: dict[QuotaKey, set[int]] = {}
        self._unsure: dict[QuotaKey, list[tuple[int, list[Charge]]]] = {}

    def writing(self, key: QuotaKey) -> None:
        """A status write of ``key`` (a ResourceQuota's, or ``("", "clusterquota:<name>")``
        for a ClusterQuota's) starts: its watch events wait until :meth:`wrote`."""
        self._writing[key] = self._writing.get(key, 0) + 1

    def wrote(self, key: QuotaKey, stored: Obj | None) -> None:
        """The write :meth:`writing` announced returned ``stored`` (None: it failed)."""
        if key not in self._writing:
            return  # the quota was deleted (forget) while the PUT was in flight
        left = self._writing[key] - 1
        if left:
            self._writing[key] = left
        else:
            self._writing.pop(key, None)
        version = _version(stored) if stored is not None else None
        if version is not None:
            self._written.setdefault(key, set()).add(version)
        if not left:
            for seen, held in self._unsure.pop(key, []):
                self._classify(key, seen, held)

    def usage_raised(
        self, key: QuotaKey, resource_version: str, amount: dict[str, Quantity]
    ) -> None:
        """A quota event at ``resource_version`` (``amount``: what it raised in ``status.used``,
        ``raised_usage``; may be empty). A raise another
        replica's admission made is held in the charge ledger: the leader's controller must not
        erase it before that replica's object reaches these caches."""
        self.raised(key, resource_version, {key: amount} if amount else {})

    def raised(
        self,
        key: QuotaKey,
        resource_version: str,
        amounts: Mapping[QuotaKey, dict[str, Quantity]],
    ) -> None:
        """A status event of ``key`` at ``resource_version`` raised ``amounts`` (by the ledger
        key each is held under: a ClusterQuota's raise is held per namespace share); held when
        this process did not write it (:meth:`usage_raised`)."""
        try:
            version = int(resource_version)
        except ValueError:
            return
        held = self._hold(amounts)
        if self._writing.get(key):
            # Every event waits, raise or not: they must be classified in order, or a later
            # event's pruning would forget an earlier own write still waiting here. Its raise
            # is held meanwhile (a recalculation now must not erase another replica's charge)
            # and withdrawn if the write turns out to be ours.
            self._unsure.setdefault(key, []).append((version, held))
            return
        self._classify(key, version, held)

    def _hold(self, amounts: Mapping[QuotaKey, dict[str, Quantity]]) -> list[Charge]:
        if self._charges is None:
            return []
        holds = [self._charges.hold(hold_key, amount) for hold_key, amount in amounts.items()]
        return [charge for charge in holds if charge is not None]

    def _classify(self, key: QuotaKey, version: int, held: list[Charge]) -> None:
        written = self._written.get(key)
        ours = written is not None and version in written
        if written is not None:
            # Events come in resourceVersion order: writes up to this one are seen or lost.
            written.difference_update([v for v in written if v <= version])
            if not written:
                del self._written[key]
        if ours and self._charges is not None:
            for charge in held:
                self._charges.withdraw(charge)

    def forget(self, key: QuotaKey) -> None:
        """The quota was deleted: nothing of it is kept here."""
        self._writing.pop(key, None)
        self._written.pop(key, None)
        self._unsure.pop(key, None)
