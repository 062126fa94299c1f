"""Which cache changes make the quota controller recalculate which quotas, for every kind.

Upstream's ``resource_quota_monitor.go`` owns the same rules: deletions, and the updates the
kind's evaluator says can lower usage (``requires_replenishment``), replenish every quota of
the namespace that tracks something the evaluator measures. A creation concerns only quotas
whose status admission could not read yet, or every quota while tally's webhook rules do not
charge creations of the kind in that namespace (``creations_charged`` false: before
registration, with the webhook off, a ``count/`` rule just added, a namespace the webhook
exempts), because then nothing charged it.

Each object a change shows is also offered to the charge ledger (:mod:`tally.charges`), which
confirms admission's charge for it: from then on the cache counts the object.

One handler per kind, for the core kinds' informers and the dynamic ``count/`` kinds'
reflectors alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tally.charges import ChargeLedger, ObjectRef
from tally.evaluators.base import Evaluator, GroupResource
from tally.machinery.cache import Change, ChangeKind, Store


class Replenish(Protocol):
    """The quota controller's :meth:`~tally.resourcequota.controller.ResourceQuotaController.
    replenish`."""

    def __call__(
        self, group_resource: GroupResource, namespace: str, *, unsynced_only: bool = False
    ) -> None: ...


def replenisher(
    replenish: Replenish,
    gr: GroupResource,
    evaluator: Evaluator | None,
    store: Store[Any],
    *,
    creations_charged: Callable[[GroupResource, str], bool],
    charges: ChargeLedger | None = None,
) -> Callable[[Change[Any]], None]:
    """The handler of ``gr``'s cache changes (``store`` is the cache it watches).

    Handlers run after the store changed, so the entry read for the ledger is the object's
    current uid and resourceVersion.
    """

    def on_change(change: Change[Any]) -> None:
        namespace = change.namespace
        if change.kind is ChangeKind.DELETED:
            replenish(gr, namespace)
            return
        if charges is not None:
            ref = ObjectRef(gr, namespace, change.name)
            if charges.expects(ref):
                entry = store.entry(namespace, change.name)
                if entry is not None:
                    charges.observed(ref, entry.uid, entry.resource_version)
        if change.kind is ChangeKind.ADDED:
            replenish(gr, namespace, unsynced_only=creations_charged(gr, namespace))
        elif (
            evaluator is not None
            and change.old is not None
            and change.new is not None
            and evaluator.requires_replenishment(change.old, change.new)
        ):
            replenish(gr, namespace)

    return on_change
