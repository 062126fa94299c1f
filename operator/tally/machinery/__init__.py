"""Pure ports of client-go and apimachinery: the pieces controllers are built from.

Owns :mod:`~tally.machinery.cache` (stores of projections, the synced point, recent writes),
:mod:`~tally.machinery.informers` (a store kept true from events and LISTs),
:mod:`~tally.machinery.eventtypes` (the core/v1 Event and its wire form),
:mod:`~tally.machinery.correlator` (client-go's event correlator: aggregation, counting, spam
filter), :mod:`~tally.machinery.broadcaster` (client-go's event recorder and the loop that
writes its Events to a sink), :mod:`~tally.machinery.leaderelection` (client-go's leader
elector over a lock protocol),
:mod:`~tally.machinery.selectors` (label selectors), :mod:`~tally.machinery.validation`
(apimachinery's name validation and ``field.Error`` wording, the one check of a DNS-1123 or
qualified name) and :mod:`~tally.machinery.errors` (apimachinery's conflict). Pure core,
just above the bottom: imports no Kopf, no API client, no HTTP library, and of tally only its
siblings and :mod:`tally.workqueue` (whose clock, token bucket and watched tasks it shares);
everything runs with plain data and an injectable clock.
"""
