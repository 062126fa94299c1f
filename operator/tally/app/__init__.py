"""The Kopf wiring and the composition root: the top layer, and the only package that imports
``kopf``.

Owns :mod:`~tally.app.handlers` (Kopf's ``on.event`` feeds, start-up and clean-up, the liveness
probe), :mod:`~tally.app.runtime` (builds and owns everything one process runs, in start order),
:mod:`~tally.app.quota_system` (the quota side built and wired: charges, usage controllers,
admission, the dynamic kinds), :mod:`~tally.app.serving` (the webhooks' certificate, server and
registration), :mod:`~tally.app.leading` (what runs once, and the Lease), :mod:`~tally.app.kinds`
(the kinds tally follows), :mod:`~tally.app.settings` (``TALLY_*`` environment variables, validated
once), :mod:`~tally.app.metrics` (the Prometheus registry and ``/metrics``), :mod:`~tally.app.heap`
(freed heap memory returned to the operating system), :mod:`~tally.app.recursion` (the recursion
limit deep objects need) and :mod:`~tally.app.kopf_settings` (how Kopf is set to run: watching
only). Decides nothing about quota: it wires the packages below it, which it may all import.
"""
