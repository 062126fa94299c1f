"""What one ClusterQuota change means to each part that follows ClusterQuotas.

Beside the controller's own handling (:meth:`ClusterQuotaController.on_cluster_quota`): a raise
of a namespace's share this process did not write is held as another replica's charge, as for
ResourceQuotas; the gauges follow the status as written; a change of spec re-reads the
measures (not a status write: admission makes many); a change of the names the ClusterQuota
reads tells the webhook rules and the dynamic ``count/`` kinds to look again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from tally.clusterquota.controller import ClusterQuotaController, SyncObserver
from tally.clusterquota.quota import raised_shares
from tally.machinery.cache import Change, ChangeKind
from tally.quota.identity import QuotaKey, cluster_quota_key
from tally.quota.quantity import Quantity
from tally.quota.resources import names_read

HARD_AT: Final = ("status", "total", "hard")
"""Where a ClusterQuota's status keeps the names it enforces."""


class OwnWrites(Protocol):
    """Tells this process's status writes from other replicas' (the quota accessor)."""

    def raised(
        self,
        key: QuotaKey,
        resource_version: str,
        amounts: Mapping[QuotaKey, dict[str, Quantity]],
    ) -> None: ...

    def forget(self, key: QuotaKey) -> None: ...


class ClusterQuotaEvents:
    """Routes each ClusterQuota change (an informer handler)."""

    def __init__(
        self,
        controller: ClusterQuotaController,
        *,
        writes: OwnWrites,
        observer: SyncObserver,
        measures_changed: Callable[[], None],
        names_changed: Callable[[], None],
    ) -> None:
        self.controller = controller
        self.writes = writes
        self.observer = observer
        self.measures_changed = measures_changed
        self.names_changed = names_changed

    def __call__(self, change: Change[Any]) -> None:
        whole = cluster_quota_key("", change.name)
        if change.kind is ChangeKind.UPDATED and change.old is not None and change.new is not None:
            self.writes.raised(
                whole,
                str((change.new.get("metadata") or {}).get("resourceVersion") or ""),
                {
                    cluster_quota_key(namespace, change.name): amount
                    for namespace, amount in raised_shares(change.old, change.new).items()
                },
            )
        elif change.kind is ChangeKind.DELETED:
            self.writes.forget(whole)
        if change.new is not None and change.new.get("status"):
            # A status that does not parse is the controller's to rewrite at its next sync.
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                self.observer.cluster_quota_synced(change.name, change.new["status"])
        old, new = change.old or {}, change.new or {}
        if old.get("spec") != new.get("spec"):
            self.measures_changed()
        self.controller.on_cluster_quota(change)
        if change.kind is not ChangeKind.UPDATED or names_read(old, HARD_AT) != names_read(
            new, HARD_AT
        ):
            self.names_changed()
