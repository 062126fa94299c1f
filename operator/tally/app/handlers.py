"""Kopf wiring: registers tally's handlers and translates Kopf's callbacks into calls on
:class:`tally.app.runtime.Runtime`. Nothing here decides anything about quota.

* ``@kopf.on.event`` on ResourceQuotas, every core quota-tracked kind, PodSets, ClusterQuotas
  and namespaces feeds the informers (``Runtime.on_event``). These handlers return None, so
  Kopf writes nothing onto objects tally does not own.
* Admission is not Kopf's: the runtime serves tally's webhooks from its own server
  (:mod:`tally.webhook.server`, which says why) once the caches are synced.
* Start-up raises the recursion limit (:mod:`tally.app.recursion`: the deepest objects the API
  server stores), connects the API client and starts the runtime: caches LISTed (the synced point),
  controller and admission workers running. When the runtime sees upstream's own quota system
  on (:mod:`tally.builtin_quota.decision`), it enforces ClusterQuotas only.
  Kopf starts its watches only after the start-up handlers finished, so no event is lost
  between the LIST and the watch (Kopf's own initial listing replays everything; replays are
  dropped by resourceVersion). Where the API server serves it, that listing is a watch
  streaming the initial state (:func:`tally.kube.rest.serves_watch_list` asks at start-up;
  :mod:`tally.app.kopf_settings` says why): a paged one outlasting etcd's compaction stops
  tally.
* With leader election on, a replica that loses the lease stops its controllers at once and
  then stops the process the way a SIGTERM does (Kopf's graceful stop: the watches end, then
  the cleanup handler stops the runtime, its webhook server first); in a pod the kubelet
  restarts it as a candidate.
* The liveness probe reports the API server version reached at start-up. It does no I/O: an API
  server outage must not make the kubelet restart tally, which would not help.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import kopf

from tally.app.kinds import (
    APPLIED_CLUSTER_QUOTAS,
    CLUSTER_QUOTAS,
    NAMESPACES,
    PODSETS,
    RESOURCE_QUOTAS,
    TRACKED_CORE_KINDS,
)
from tally.app.kopf_settings import LISTING_PAGE, configure_kopf
from tally.app.recursion import raise_recursion_limit
from tally.app.runtime import STOP_TIMEOUT_S, Runtime
from tally.app.settings import Settings, SettingsError
from tally.clusterquota import applied
from tally.evaluators.base import GroupResource
from tally.kube import cluster_quotas, rest
from tally.podset import client as podset_client

logger = logging.getLogger(__name__)


INITIAL_STREAMED = (
    "Kopf's initial listings and tally's own lists are streamed (the API server serves a "
    "watch's initial state)"
)
INITIAL_PAGED = (
    "the API server does not stream a watch's initial state (the WatchList feature is off, as "
    "by default in Kubernetes 1.33, or absent before 1.27): Kopf lists in pages of %d, and a "
    "listing that outlasts etcd's compaction (every 5 minutes by default) ends tally with 410 "
    "Gone (how many objects list within that depends on how busy the start is); turn WatchList "
    "on for large clusters"
)


STARTUP_RETRY_S = 2.0
"""Seconds before a failed start (the API server unreachable, a LIST refused) is tried again.
Kopf's default is 60: a replica restarted while the API server was down stayed unready for a
minute after it came back."""


@kopf.on.startup(backoff=STARTUP_RETRY_S)
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Before the first LIST, watch or review: the deepest objects the API server stores.
    raise_recursion_limit()
    try:
        config = Settings.from_env()
    except SettingsError as error:
        raise kopf.PermanentError(str(error)) from None
    api = await rest.make_api_client(config.api_connections)
    clients = [api]
    try:
        dedicated_api = await rest.make_api_client(None)
        clients.append(dedicated_api)
        watch_api = await rest.make_api_client(None)
        clients.append(watch_api)
        memo.apiserver_version = await rest.server_version(api)
        logger.info("connected to the API server, version %s", memo.apiserver_version)
        # Kopf starts its watches after the start-up handlers: its settings are read then.
        streamed = await rest.serves_watch_list(api)
        configure_kopf(settings, initial_streaming=streamed)
        if streamed:
            logger.info(INITIAL_STREAMED)
        else:
            logger.info(INITIAL_PAGED, LISTING_PAGE)
        runtime = Runtime(
            config,
            api,
            dedicated_api=dedicated_api,
            watch_api=watch_api,
            on_leadership_lost=_stop_this_process,
            streamed_lists=streamed,
        )
        await runtime.start()
    except BaseException:
        # Kopf tries again with fresh clients: ones left open per attempt would pile up
        # through a long outage.
        await asyncio.gather(*(opened.close() for opened in clients))
        raise
    memo.api = api
    memo.dedicated_api = dedicated_api
    memo.watch_api = watch_api
    memo.runtime = runtime


def _stop_this_process() -> None:
    """Leadership lost: stop the operator as a SIGTERM would. Kopf's signal handler turns it
    into its graceful stop (exit status 0); a pod's container is restarted either way."""
    os.kill(os.getpid(), signal.SIGTERM)


CUT_S = 2.0
"""Beyond the runtime's own stop bound (``STOP_TIMEOUT_S``): time for what it cuts to end."""


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    runtime = memo.get("runtime")
    if runtime is not None:
        # Never raises: Kopf would retry a failed clean-up a minute later instead of exiting.
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S + CUT_S):
                await runtime.stop()
        except TimeoutError:
            logger.warning(
                "stopping: not done within %g s; exiting without waiting any longer",
                STOP_TIMEOUT_S + CUT_S,
            )
        except Exception:
            logger.exception("stopping failed; exiting anyway")
    for name in ("api", "dedicated_api", "watch_api"):
        api = memo.get(name)
        if api is not None:
            await api.close()


def _feed(gr: GroupResource) -> Callable[..., Coroutine[Any, Any, None]]:
    # async, not a plain function: Kopf runs plain handlers in a thread pool, and the stores,
    # queues and timers they touch belong to the event loop.
    async def on_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        runtime = memo.get("runtime")
        if runtime is not None:
            runtime.on_event(gr, event["type"], event["object"])
        # Returns None: Kopf writes nothing onto the object.

    return on_event


for _gr in (RESOURCE_QUOTAS, *TRACKED_CORE_KINDS):
    kopf.on.event("v1", _gr.resource, id=f"cache-{_gr.resource}")(_feed(_gr))
kopf.on.event(PODSETS.group, podset_client.VERSION, PODSETS.resource, id="cache-podsets")(
    _feed(PODSETS)
)
kopf.on.event(
    CLUSTER_QUOTAS.group, cluster_quotas.VERSION, CLUSTER_QUOTAS.resource, id="cache-clusterquotas"
)(_feed(CLUSTER_QUOTAS))
kopf.on.event(
    APPLIED_CLUSTER_QUOTAS.group, applied.VERSION, APPLIED_CLUSTER_QUOTAS.resource,
    id="cache-appliedclusterquotas",
)(_feed(APPLIED_CLUSTER_QUOTAS))  # fmt: skip
kopf.on.event("v1", NAMESPACES.resource, id="cache-namespaces")(_feed(NAMESPACES))


@kopf.on.probe(id="apiserver")
def apiserver_version(memo: kopf.Memo, **_: Any) -> str:
    return str(memo.get("apiserver_version", ""))
