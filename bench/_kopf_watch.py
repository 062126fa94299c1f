"""A Kopf operator that only watches pods, for ``bench/admission.py --kopf-watch``: ``kopf run``
loads this file. It runs Kopf exactly as tally does (:func:`tally.app.kopf_settings.
configure_kopf`) with one async ``on.event`` handler on pods that does nothing, so its CPU per
pod create is what tally's pod watch costs before tally's own handling of the event: the part
of tally's CPU per create that the rule "tally watches through Kopf" keeps.
"""

from __future__ import annotations

from typing import Any

import kopf

from tally.app.heap import freeze_long_lived, full_collections_rarely
from tally.app.kopf_settings import configure_kopf
from tally.kube import rest


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    api = await rest.make_api_client(None)
    try:
        configure_kopf(settings, initial_streaming=await rest.serves_watch_list(api))
    finally:
        await api.close()
    # The same process tuning as tally's once its caches are synced: what start-up built is
    # kept out of the cyclic collector's walks, and full collections are rare.
    freeze_long_lived()
    full_collections_rarely()


@kopf.on.event("v1", "pods", id="cache-pods")
async def on_event(event: kopf.RawEvent, **_: Any) -> None:
    # What tally's feed receives (the event), handed to nothing.
    del event
