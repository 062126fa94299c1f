"""Quantities and resource lists: the arithmetic every quota decision is made of.

Owns :mod:`~tally.quota.quantity` (``resource.Quantity``: parse, compare, add, format exactly
as upstream) and :mod:`~tally.quota.resources` (upstream's ``quota/v1/resources.go``: add,
subtract, mask, less-than-or-equal over ``{name: Quantity}``) and :mod:`~tally.quota.identity`
(what names a quota: the running total a decision changes, the share a charge or sync
belongs to, the ClusterQuota kind). Bottom layer: pure, imports
nothing of tally.
"""
