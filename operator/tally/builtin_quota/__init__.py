"""Whether the cluster's own quota system (upstream's ResourceQuota admission plugin and quota
controller) is on, and what tally does about it.

Owns :mod:`~tally.builtin_quota.probe` (the start-up probe: a quota in tally's own namespace,
what the API server and kube-controller-manager do with it) and
:mod:`~tally.builtin_quota.decision` (what the observations mean: refuse, warn or go on; pure).
May import the API adapters (:mod:`tally.kube`) and the pure core; the wiring
(:mod:`tally.app`) calls it.
"""
