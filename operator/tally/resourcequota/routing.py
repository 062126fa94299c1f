"""What one ResourceQuota change means to each part that follows quotas.

The informer reports a quota added, updated or deleted; the controller queues its sync, the
charge ledger and the accessor forget a deleted quota's holds and writes, a raise of
``status.used`` this process did not write is held as another replica's charge, the gauges
follow the status as written (admission's charges show at once, not at the next sync), quotas
that count quotas (``count/resourcequotas``) replenish, and a change of the names a quota
reads tells the webhook rules and the dynamic ``count/`` kinds to look again (not on a write
of usage alone: admission makes many).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from tally.charges import ChargeLedger
from tally.machinery.cache import Change, ChangeKind
from tally.quota.identity import QuotaKey, quota_key
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceListError, names_read, parse_resource_list
from tally.resourcequota.controller import ResourceQuotaController, SyncObserver, raised_usage

Obj = Mapping[str, Any]

HARD_AT: Final = ("status", "hard")
"""Where a ResourceQuota's status keeps the names it enforces."""


class OwnWrites(Protocol):
    """Tells this process's status writes from other replicas' (the quota accessor)."""

    def usage_raised(
        self, key: QuotaKey, resource_version: str, amount: dict[str, Quantity]
    ) -> None: ...

    def forget(self, key: QuotaKey) -> None: ...


class QuotaEvents:
    """Routes each ResourceQuota change (an informer handler)."""

    def __init__(
        self,
        controller: ResourceQuotaController,
        *,
        charges: ChargeLedger,
        writes: OwnWrites,
        observer: SyncObserver,
        enforcing: Callable[[], bool],
        replenish: Callable[[Change[Any]], None],
        names_changed: Callable[[], None],
    ) -> None:
        """``enforcing``: whether tally enforces ResourceQuotas (no gauges otherwise);
        ``replenish``: the quotas that count quotas; ``names_changed``: the names some quota
        reads may have changed."""
        self.controller = controller
        self.charges = charges
        self.writes = writes
        self.observer = observer
        self.enforcing = enforcing
        self.replenish = replenish
        self.names_changed = names_changed

    def __call__(self, change: Change[Any]) -> None:
        # Quota projections are the whole objects: never None for the side that exists.
        names_changed = True
        if change.kind is ChangeKind.DELETED:
            old = change.old or {}
            self.controller.delete_quota(old)
            self.charges.forget_quota(quota_key(old))
            self.writes.forget(quota_key(old))
            # Every replica exports the gauges but only the leader's controller syncs a
            # deleted quota: each replica drops its own series here.
            self.observer.quota_deleted(quota_key(old))
        elif change.kind is ChangeKind.ADDED:
            self.controller.add_quota(change.new or {})
        else:
            old, new = change.old or {}, change.new or {}
            self.controller.update_quota(old, new)
            # A raise this process did not write is another replica's charge: held.
            self.writes.usage_raised(
                quota_key(new),
                str((new.get("metadata") or {}).get("resourceVersion") or ""),
                raised_usage(old, new),
            )
            names_changed = names_read(old, HARD_AT) != names_read(new, HARD_AT)
        if change.new is not None and self.enforcing():
            self._report_status(change.new)
        self.replenish(change)
        if names_changed:
            self.names_changed()

    def _report_status(self, quota_obj: Obj) -> None:
        status = quota_obj.get("status") or {}
        try:
            hard = parse_resource_list(status.get("hard"), "status.hard")
            used = parse_resource_list(status.get("used"), "status.used")
        except ResourceListError:
            return  # the controller's next sync reports (and corrects) it
        self.observer.quota_synced(quota_key(quota_obj), hard, used)
