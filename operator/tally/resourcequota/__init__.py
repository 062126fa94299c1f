"""The ResourceQuota usage controller (upstream ``pkg/controller/resourcequota``).

Owns :mod:`~tally.resourcequota.controller` (queues, workers, ``sync_resource_quota``, the
resync), :mod:`~tally.resourcequota.replenishment` (which cache changes recalculate which
quotas; upstream's ``resource_quota_monitor.go``) and :mod:`~tally.resourcequota.discovery`
(the ``count/<r>.<g>`` kinds quotas name: discovered, watched with their own reflectors,
reported when they cannot be counted). The controller and the replenishment rules are pure;
discovery talks to the API through :mod:`tally.kube`. Never imports :mod:`tally.podset`.
"""
