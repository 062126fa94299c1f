"""Charges quota admission wrote into quotas' ``status.used`` that the caches have not confirmed.

Upstream's ResourceQuota plugin runs last in the API server's admission chain, so a request it
charges is stored unless etcd fails. tally's webhook is one validating webhook among several,
called in parallel: after tally charged a request, another webhook (or the API server itself)
may still refuse it, and the charge would stay in ``status.used`` until some recalculation. This
package keeps, per charge, what was charged to which quota, until either

* the object shows up in tally's caches (*confirmed*: from then on the caches count it), or
* the confirmation timeout passes (*released*: the quotas it charged are recalculated from the
  caches at once, and the charge no longer holds their usage up), once the API, asked whether
  the object was stored, says it was not, or cannot say (:mod:`tally.charges.verification`).

Until then a pending charge *holds* its quotas' usage: a recalculation may not lower a value
below what the caches count plus the pending charges (see
:meth:`~tally.resourcequota.controller.ResourceQuotaController.sync_resource_quota`). While
admission's write of a quota's status is in flight, that quota's recalculation waits for it
(:meth:`ChargeLedger.defer_sync`).

Owns: :class:`ChargeLedger` and its expiry loop, what the API's answer about a charge's object
means (:mod:`~tally.charges.verification`), :class:`FirstSyncs` (quotas whose first
status was just written, which creations admitted before it may still reach; on
:class:`RecentKeys`, which ClusterQuotas' changed selections use too) and
:mod:`~tally.charges.own_writes` (this process's status writes told from other replicas',
whose raises are held as their charges). Imports only the
pure core (resource lists, group/resources); admission records charges, the informers' handlers
confirm them, the quota controller reads what they hold and the verifier
(:mod:`tally.kube.charge_verifier`) answers the ledger's questions, each through this package.
"""

from tally.charges.first_syncs import FirstSyncs, RecentKeys
from tally.charges.ledger import (
    Charge,
    ChargeLedger,
    ChargeMetrics,
    NoopChargeMetrics,
    ObjectRef,
    ReleaseReason,
    Verify,
    hold_pending,
)
from tally.charges.verification import Answer, Listed, ObjectVersion, Unanswered, Unasked

__all__ = [
    "Answer",
    "Charge",
    "ChargeLedger",
    "ChargeMetrics",
    "FirstSyncs",
    "Listed",
    "NoopChargeMetrics",
    "ObjectRef",
    "ObjectVersion",
    "RecentKeys",
    "ReleaseReason",
    "Unanswered",
    "Unasked",
    "Verify",
    "hold_pending",
]
