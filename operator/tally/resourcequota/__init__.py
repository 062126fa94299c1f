"""The ResourceQuota usage controller (upstream ``pkg/controller/resourcequota``).

Owns :mod:`~tally.resourcequota.controller` (queues, workers, ``sync_resource_quota``, the
resync), :mod:`~tally.resourcequota.replenishment` (which cache changes recalculate which
quotas: the handlers of upstream's ``resource_quota_monitor.go``),
:mod:`~tally.resourcequota.routing` (what one ResourceQuota change means to each part that
follows quotas), :mod:`~tally.resourcequota.monitor` (upstream's ``QuotaMonitor``: the
``count/<r>.<g>`` kinds quotas name, each watched with its own reflector),
:mod:`~tally.resourcequota.discovery` (whether the API serves such a kind and quota can count
it) and :mod:`~tally.resourcequota.reporting` (why a named kind is not counted, told once per
quota). The controller, the replenishment rules and the reporting are pure; the monitor and
discovery talk to the API through :mod:`tally.kube`. Never imports :mod:`tally.podset`.
"""
