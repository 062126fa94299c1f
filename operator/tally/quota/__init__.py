"""Quantities and resource lists: the arithmetic every quota decision is made of.

Owns :mod:`~tally.quota.quantity` (``resource.Quantity``: parse, compare, add, format exactly
as upstream) and :mod:`~tally.quota.resources` (upstream's ``quota/v1/resources.go``: add,
subtract, mask, less-than-or-equal over ``{name: Quantity}``). Bottom layer: pure, imports
nothing of tally.
"""
