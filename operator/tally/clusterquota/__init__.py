"""ClusterQuota (``clusterquotas.tally.dev``): one quota over many namespaces.

Owns :mod:`~tally.clusterquota.quota` (reading a ClusterQuota, the ResourceQuota-shaped view
admission judges in each selected namespace, the status; pure),
:mod:`~tally.clusterquota.controller` (the usage controller: status from the caches, per
namespace and in total) and :mod:`~tally.clusterquota.admission` (what quota admission needs:
the views of the ClusterQuotas selecting a namespace, and the compare-and-swap write of a
charge). Shares the evaluators, caches, replenishment rules and charge ledger with the
ResourceQuota side; never imports :mod:`tally.podset`.
"""
