"""Everything that talks to the API server: the adapters below the controllers.

Owns :mod:`~tally.kube.rest` (the API client, raw JSON requests, paged LISTs),
:mod:`~tally.kube.reflector` (list-and-watch for kinds Kopf does not feed),
:mod:`~tally.kube.lease_lock` (the leader election's Lease), :mod:`~tally.kube.events`
(Warning Events about an object, one POST each) and
:mod:`~tally.kube.quota_accessor` (quota status reads and compare-and-swap writes, the
updated-quotas LRU), :mod:`~tally.kube.informers` (every tracked kind's informer and LIST) and
:mod:`~tally.kube.charge_verifier` (whether a charge's object was stored, asked with a LIST by
name). Implements the small
protocols the controllers declare; may import only the pure core (:mod:`tally.machinery`,
:mod:`tally.quota`, :mod:`tally.charges`, …), never a controller.
"""
