"""Kopf wiring: registers tally's handlers and owns the process-wide objects they share.

Handlers here only translate Kopf's callbacks into calls on plain objects; nothing in this
module decides anything about quota or PodSets.

* ``@kopf.on.event`` on ResourceQuotas and every core quota-tracked kind feeds the informers
  (tally never writes onto these objects: event handlers that return None write nothing).
* Start-up connects tally's API client, LISTs every tracked kind (the caches' synced point),
  then starts the ResourceQuota controller's workers. Kopf starts its watches only after the
  start-up handlers finished, so no event is lost between the LIST and the watch: Kopf's own
  initial listing replays everything, and the replays are dropped by resourceVersion.
* The liveness probe reports the API server version reached at start-up. It does no I/O: an API
  server outage must not make the kubelet restart tally, which would not help.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final

import kopf

from tally import kube
from tally.cache import Change, Store
from tally.evaluators.base import GroupResource
from tally.evaluators.registry import new_registry
from tally.informers import Informer
from tally.metrics import Metrics
from tally.quota_accessor import KubeQuotaAccessor
from tally.resourcequota.controller import ResourceQuotaController
from tally.settings import Settings

logger = logging.getLogger(__name__)

RESOURCE_QUOTAS: Final = GroupResource("", "resourcequotas")
TRACKED_CORE_KINDS: Final = (
    GroupResource("", "pods"),
    GroupResource("", "services"),
    GroupResource("", "persistentvolumeclaims"),
    GroupResource("", "configmaps"),
    GroupResource("", "secrets"),
    GroupResource("", "replicationcontrollers"),
)


def _keep_whole(obj: Any) -> Any:
    """Quotas are few and small; the controller needs their spec and status as read."""
    return obj


def _lister(api: Any, gr: GroupResource) -> Callable[[], Any]:
    async def list_kind() -> list[dict[str, Any]]:
        return await kube.list_objects(api, gr.group, "v1", gr.resource)

    return list_kind


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # One replica, no Kopf peering: peering is not leader election (no lease, no fencing).
    settings.peering.standalone = True
    # Kopf's own per-handler events would be posted onto objects tally does not own.
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Kopf logs every handler run at INFO; for a cache fed by every pod event that is noise
    # (and cost). Failures still log at ERROR.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    config = Settings.from_env()
    api = await kube.make_api_client()
    memo.api = api
    memo.apiserver_version = await kube.server_version(api)
    logger.info("connected to the API server, version %s", memo.apiserver_version)

    metrics = Metrics()
    memo.metrics = metrics
    if config.metrics_port:
        memo.metrics_runner = await metrics.serve(config.metrics_addr, config.metrics_port)

    registry = new_registry()
    informers: dict[GroupResource, Informer[Any]] = {}
    for gr in (RESOURCE_QUOTAS, *TRACKED_CORE_KINDS):
        evaluator = registry.get(gr)
        project = evaluator.project if evaluator is not None and gr != RESOURCE_QUOTAS else None
        store: Store[Any] = Store(project or _keep_whole, name=str(gr))
        informers[gr] = Informer(str(gr), store, _lister(api, gr))
    memo.informers = informers

    accessor = KubeQuotaAccessor(informers[RESOURCE_QUOTAS].store, api)
    controller = ResourceQuotaController(
        registry,
        informers[RESOURCE_QUOTAS].store,
        {gr: informers[gr].store for gr in TRACKED_CORE_KINDS},
        accessor,
        workers=config.workers,
        resync_period=config.resync_period,
        metrics_provider=metrics.workqueue,
        observer=metrics,
    )
    memo.quota_controller = controller

    def on_quota(change: Change[Any]) -> None:
        if change.old is None:
            controller.add_quota(change.new or {})
        elif change.new is None:
            controller.delete_quota(change.old)
        else:
            controller.update_quota(change.old, change.new)

    informers[RESOURCE_QUOTAS].add_handler(on_quota)
    for gr in TRACKED_CORE_KINDS:
        evaluator = registry.get(gr)

        def on_tracked(change: Change[Any], gr: GroupResource = gr, ev: Any = evaluator) -> None:
            # Creations are charged by admission; deletions and the updates the evaluator
            # names as usage-lowering trigger a recalculation (replenishment).
            if change.new is None or (
                change.old is not None and ev is not None
                and ev.requires_replenishment(change.old, change.new)
            ):  # fmt: skip
                controller.replenish(gr, change.namespace)

        informers[gr].add_handler(on_tracked)

    # The synced point: every kind listed once before any worker reads the caches.
    await asyncio.gather(*(informer.sync() for informer in informers.values()))
    controller.start()
    logger.info("caches synced (%s); quota controller started",
                ", ".join(f"{gr}={len(i.store)}" for gr, i in informers.items()))  # fmt: skip


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    controller = memo.get("quota_controller")
    if controller is not None:
        await controller.stop()
    for informer in (memo.get("informers") or {}).values():
        await informer.stop()
    runner = memo.get("metrics_runner")
    if runner is not None:
        await runner.cleanup()
    api = memo.get("api")
    if api is not None:
        await api.close()


def _feed(gr: GroupResource) -> Callable[..., Coroutine[Any, Any, None]]:
    # async, not a plain function: Kopf runs plain handlers in a thread pool, and the stores,
    # queues and timers they touch belong to the event loop.
    async def on_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        informer = (memo.get("informers") or {}).get(gr)
        if informer is not None:
            informer.on_event(event["type"], event["object"])
        # Returns None: Kopf writes nothing onto the object.

    return on_event


for _gr in (RESOURCE_QUOTAS, *TRACKED_CORE_KINDS):
    kopf.on.event("v1", _gr.resource, id=f"cache-{_gr.resource}")(_feed(_gr))


@kopf.on.probe(id="apiserver")
def apiserver_version(memo: kopf.Memo, **_: Any) -> str:
    return str(memo.get("apiserver_version", ""))
