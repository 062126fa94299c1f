"""Kopf wiring: registers tally's handlers and owns the process-wide resources they share.

Handlers here only translate Kopf's callbacks into calls on plain objects; nothing in this
module decides anything about quota or PodSets.

Start-up connects tally's own API client and records the server version; the liveness probe
reports it, so "live" means "started and reached the API server once". The probe does no I/O:
an API server outage must not make the kubelet restart tally, which would not help.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from tally import kube

logger = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # One replica, no Kopf peering: peering is not leader election (no lease, no fencing).
    settings.peering.standalone = True
    # Kopf's own per-handler events would be posted onto objects tally does not own.
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330

    memo.api = await kube.make_api_client()
    memo.apiserver_version = await kube.server_version(memo.api)
    logger.info("connected to the API server, version %s", memo.apiserver_version)


@kopf.on.cleanup()
async def close_client(memo: kopf.Memo, **_: Any) -> None:
    api = memo.get("api")
    if api is not None:
        await api.close()


@kopf.on.probe(id="apiserver")
def apiserver_version(memo: kopf.Memo, **_: Any) -> str:
    return str(memo.get("apiserver_version", ""))
