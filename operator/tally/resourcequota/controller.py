"""The ResourceQuota controller: keeps every quota's ``status.hard`` and ``status.used`` true.

A port of upstream ``pkg/controller/resourcequota/resource_quota_controller.go`` in the
sample-controller shape: event handlers only work out keys and enqueue them; workers take keys
off two rate-limited work queues and run :meth:`ResourceQuotaController.sync_resource_quota`,
which reads only from the caches and writes status last, through the status subresource, with
the resourceVersion it read (compare and swap: a 409 is an error and the key is retried).

Why two queues: a quota whose spec declares something its status does not show yet (new,
``spec.hard`` changed, or a tracked name without usage) blocks admission — upstream's admission
forbids with "status unknown" until usage is known — so it goes to the *missing-usage* queue,
served by its own workers, instead of waiting behind routine recalculations.

Why spec changes enqueue and status changes do not: this controller writes status itself;
reacting to its own writes would loop. A status edited by someone else is corrected at the next
full resync (every 5 minutes by default), as upstream does.

Replenishment: deletions of tracked objects, and the updates an evaluator says can lower usage
(``requires_replenishment``), enqueue every quota of the namespace whose ``status.hard`` names
something that evaluator measures; which change calls :meth:`replenish` how is decided in
:mod:`tally.resourcequota.replenishment`.

Charges admission wrote for objects the caches do not show yet (:mod:`tally.charges`) hold
usage up: a sync lowers a value no further than the caches plus those pending charges. A
charge whose object never comes is released after its timeout, and the ledger enqueues its
quota then. A sync of a quota whose status admission is writing at that moment waits for the
write to end (the ledger enqueues it again): the status it would read may or may not contain
the charge being written.

Left out here: watching (the Kopf wiring feeds :meth:`add_quota`, :meth:`replenish` … from
caches it owns) and the API client (a :class:`QuotaStatusWriter` is passed in).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from tally.charges import ChargeLedger, FirstSyncs, hold_pending
from tally.charges.ledger import DEFAULT_TIMEOUT_S
from tally.evaluators.base import GroupResource, ObjectError, ScopeError, quota_scopes
from tally.evaluators.registry import Registry, UsageError, calculate_usage
from tally.machinery.cache import Store
from tally.machinery.errors import Conflict
from tally.quota import resources as quota
from tally.quota.identity import QuotaKey, format_key, quota_key
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceListError, parse_resource_list
from tally.workqueue import (
    DEFAULT_STOP_TIMEOUT,
    MetricsProvider,
    RateLimitingQueue,
    SpreadResync,
    WorkerPool,
    default_controller_rate_limiter,
)

logger = logging.getLogger(__name__)

Obj = Mapping[str, Any]
DEFAULT_RESYNC_PERIOD_S: Final = 300.0
"""Upstream ``--resource-quota-sync-period`` default: the bound on how long a status edited by
someone else, or a usage change no event reported, stays wrong."""
DEFAULT_WORKERS: Final = 5
"""Upstream ``--concurrent-resource-quota-syncs`` default, per queue."""
DEFAULT_MISSING_USAGE_WORKERS: Final = 20
"""Workers of the queue of quotas without usage (every quota at a cold start, and new ones).
Upstream's five are enough where a sync is a few microseconds of Go between writes; here each
worker's sync waits its turn on an event loop that at start-up is replaying Kopf's listing of
every object, so a cold start waits on how many syncs are in flight. bench/scale.py, 30 000
pods and 3 000 quotas, every quota correct after 74 s with 5 workers, 38.5 s with 20, 35.6 s
with 50."""

PRIMARY_QUEUE: Final = "resourcequota_primary"
PRIORITY_QUEUE: Final = "resourcequota_priority"


class QuotaStatusWriter(Protocol):
    """Writes a quota's status through the status subresource (``UpdateStatus``)."""

    async def update_status(self, quota_obj: Obj, status: Mapping[str, Mapping[str, str]]) -> None:
        """PUT ``quota_obj`` (with its resourceVersion) carrying ``status``.

        Raises :class:`Conflict` on 409; other failures raise whatever the client raises.
        """
        ...


class SyncObserver(Protocol):
    """What the controller reports as it works (implemented by :mod:`tally.app.metrics`)."""

    def quota_synced(
        self, key: QuotaKey, hard: Mapping[str, Quantity], used: Mapping[str, Quantity]
    ) -> None:
        """A quota's status now is (or was already) ``hard`` / ``used``."""
        ...

    def quota_deleted(self, key: QuotaKey) -> None: ...

    def sync_finished(self, duration: float, error: Exception | None) -> None: ...


def _resource_list(raw: object, field: str) -> dict[str, Quantity] | None:
    """A parsed resource list, or None for a missing (nil) one; upstream keeps nil apart."""
    if raw is None:
        return None
    return parse_resource_list(raw, field)


def _semantic_equal(a: Mapping[str, Quantity] | None, b: Mapping[str, Quantity] | None) -> bool:
    """``apiequality.Semantic.DeepEqual`` on two resource lists: same keys, equal quantities.

    Semantic equality treats a nil and an empty map as equal (apimachinery's forked
    ``DeepEqual``: "An empty slice *is* equal to a nil slice for our purposes; same for maps"),
    so ``None`` counts as ``{}`` here. Callers that must tell a missing list apart (the sync's
    "first sync is dirty" rule) test ``is None`` themselves, as upstream tests ``== nil``.
    """
    return quota.equals(a or {}, b or {})


class ResourceQuotaController:
    """Upstream's ``resourcequota.Controller``, driven by tally's caches."""

    def __init__(
        self,
        registry: Registry,
        quotas: Store[Obj],
        stores: Mapping[GroupResource, Store[Any]],
        writer: QuotaStatusWriter,
        *,
        workers: int = DEFAULT_WORKERS,
        missing_usage_workers: int = DEFAULT_MISSING_USAGE_WORKERS,
        resync_period: float = DEFAULT_RESYNC_PERIOD_S,
        metrics_provider: MetricsProvider | None = None,
        observer: SyncObserver | None = None,
        charges: ChargeLedger | None = None,
        newest: Callable[[Obj], Obj] | None = None,
    ) -> None:
        self.registry = registry
        """Evaluators for every watched kind; ``calculate_usage`` uses exactly these."""
        self.quotas = quotas
        """ResourceQuota objects (whole: they are few and small)."""
        self.stores = stores
        """Projections of every tracked kind, by group/resource. May gain kinds at run time
        (``count/`` on a custom resource); the mapping is read at every sync."""
        self.writer = writer
        self.workers = workers
        self.resync_period = resync_period
        self.observer = observer
        """Told about every sync (metrics); never decides anything."""
        self.newest = newest
        """The newest copy of a quota this process knows (its own last write may be newer than
        the cache); syncs compare with and write over that copy."""
        self.charges = charges
        """Admission's charges whose objects the caches have not shown yet: a sync never
        lowers usage below what they hold (see :func:`tally.charges.hold_pending`)."""
        self.first_syncs: FirstSyncs[QuotaKey] = FirstSyncs(
            charges.timeout if charges is not None else DEFAULT_TIMEOUT_S
        )
        """Quotas whose first status was just written (see :meth:`replenish`)."""
        self.queue: RateLimitingQueue[QuotaKey] = RateLimitingQueue(
            default_controller_rate_limiter(), name=PRIMARY_QUEUE, metrics_provider=metrics_provider
        )
        self.missing_usage_queue: RateLimitingQueue[QuotaKey] = RateLimitingQueue(
            default_controller_rate_limiter(),
            name=PRIORITY_QUEUE,
            metrics_provider=metrics_provider,
        )
        self._pools = [
            WorkerPool(
                self.queue,
                self._sync_key,
                workers=workers,
                name=PRIMARY_QUEUE,
                expected=(Conflict,),
            ),
            WorkerPool(
                self.missing_usage_queue,
                self._sync_key,
                workers=missing_usage_workers,
                name=PRIORITY_QUEUE,
                expected=(Conflict,),
            ),
        ]
        self._resync = SpreadResync(
            self.resync_keys, self._enqueue, resync_period, name="resourcequota-resync",
            logger=logger,
        )  # fmt: skip

    # -- event handlers: work out keys, enqueue, nothing else

    def add_quota(self, quota_obj: Obj) -> None:
        """A quota appeared (or changed ``spec.hard``): prioritise it if status lags spec."""
        key = quota_key(quota_obj)
        try:
            spec_hard = _resource_list((quota_obj.get("spec") or {}).get("hard"), "spec.hard")
            status = quota_obj.get("status") or {}
            status_hard = _resource_list(status.get("hard"), "status.hard")
            status_used = _resource_list(status.get("used"), "status.used") or {}
        except ResourceListError:
            # The sync reports it; a broken quota is no reason to jump the queue.
            self.queue.add(key)
            return
        # A declared intent that status does not capture yet.
        if not _semantic_equal(spec_hard, status_hard):
            self.missing_usage_queue.add(key)
            return
        # A tracked constraint without usage: admission refuses everything it covers until
        # this controller fills it in.
        for name in status_hard or {}:
            if name not in status_used and any(
                evaluator.matching_resources([name]) for evaluator in self.registry.list()
            ):
                self.missing_usage_queue.add(key)
                return
        self.queue.add(key)

    def update_quota(self, old: Obj, new: Obj) -> None:
        """Only a change of ``spec.hard`` matters; status changes are our own writes."""
        try:
            old_hard = parse_resource_list((old.get("spec") or {}).get("hard"), "spec.hard")
            new_hard = parse_resource_list((new.get("spec") or {}).get("hard"), "spec.hard")
        except ResourceListError:
            self.add_quota(new)
            return
        if quota.equals(old_hard, new_hard):
            return
        self.add_quota(new)

    def delete_quota(self, quota_obj: Obj) -> None:
        # The sync finds nothing and does nothing; enqueued anyway, like upstream, so that
        # anything keyed by the quota (metrics) is cleared by the same path.
        self.queue.add(quota_key(quota_obj))

    def _enqueue(self, key: QuotaKey) -> None:
        """Recalculate ``key`` on the primary queue, unless it waits on the missing-usage queue:
        that sync has not started, so it counts the change that called this too. Upstream
        queues it on both: at start-up (every quota without usage, every kind listed) that was
        2.4 syncs per quota (``bench/scale.py``, 10 000 pods), and one now."""
        if not self.missing_usage_queue.waiting(key):
            self.queue.add(key)

    def replenish(
        self, group_resource: GroupResource, namespace: str, *, unsynced_only: bool = False
    ) -> None:
        """Usage of ``group_resource`` in ``namespace`` may have changed: recalculate the
        quotas there that track something its evaluator measures (upstream ``replenishQuota``).

        Upstream matches on the cached ``status.hard`` and leaves a quota without one to its
        own first sync. That sync may be running already, having counted the namespace before
        this change reached the cache, with its status write still on the way: the change
        would then be lost until the next full resync (seen with ``make run``: the example
        PodSet's first pods, created while the quota's first status write was in flight,
        stayed uncounted). So the newest copy this process knows is read, as syncs read it,
        and a quota without ``status.hard`` matches on ``spec.hard``: the queue runs an
        in-flight key again after it finishes.

        ``unsynced_only``: only quotas without ``status.hard``, or whose first status, or a
        status with other hard names, was written within the charge confirmation timeout
        (:class:`~tally.charges.FirstSyncs`), for a creation admission charged. Admission skips
        a quota whose status is not known yet (upstream too), so a create admitted then is
        charged to nobody; that quota's first sync counts it only if the object reached the
        cache first. Likewise a name just added to ``hard``: admission charged it only to
        creates judged after the status naming it.
        """
        evaluator = self.registry.get(group_resource)
        if evaluator is None:
            return
        for cached in self.quotas.in_namespace(namespace):
            quota_obj = cached if self.newest is None else self.newest(cached)
            status_hard = (quota_obj.get("status") or {}).get("hard")
            if unsynced_only and status_hard and not self.first_syncs.recent(quota_key(quota_obj)):
                continue
            hard = status_hard or ((quota_obj.get("spec") or {}).get("hard") or {})
            if isinstance(hard, Mapping) and evaluator.matching_resources(list(hard)):
                self._enqueue(quota_key(quota_obj))

    def enqueue_naming(self, gr: GroupResource) -> None:
        """``gr``'s cache is ready: every quota whose spec or status names it is synced."""
        for namespace in self.quotas.namespaces():
            for quota_obj in self.quotas.in_namespace(namespace):
                if any(
                    self.registry.names(gr, (quota_obj.get(section) or {}).get("hard"))
                    for section in ("spec", "status")
                ):
                    self._enqueue(quota_key(quota_obj))

    def resync_keys(self) -> list[QuotaKey]:
        """Every quota, in the order the full resync hands them out (spread over its period:
        :class:`~tally.workqueue.SpreadResync`)."""
        return [
            quota_key(quota_obj)
            for namespace in self.quotas.namespaces()
            for quota_obj in self.quotas.in_namespace(namespace)
        ]

    def unfinished(self) -> int:
        """Quotas queued or being synced, on both queues (retries waiting out their back-off
        not counted)."""
        return self.queue.unfinished() + self.missing_usage_queue.unfinished()

    # -- sync

    async def _sync_key(self, key: QuotaKey) -> None:
        if self.charges is not None and self.charges.defer_sync(key):
            return  # admission is writing this status: the ledger enqueues it when it is done
        cached = self.quotas.get(*key)
        quota_obj = cached if cached is None or self.newest is None else self.newest(cached)
        if quota_obj is None:
            # Deleted: nothing to write.
            if self.observer is not None:
                self.observer.quota_deleted(key)
            return
        started = time.monotonic()
        try:
            await self.sync_resource_quota(quota_obj)
        except Exception as error:
            if self.observer is not None:
                self.observer.sync_finished(time.monotonic() - started, error)
            raise
        if self.observer is not None:
            self.observer.sync_finished(time.monotonic() - started, None)

    def calculate(self, quota_obj: Obj) -> tuple[dict[str, Quantity], dict[str, Quantity]]:
        """(hard, used) as the next status write would carry them (``syncResourceQuota``).

        Raises :class:`UsageError` with the partial result when an evaluator failed.
        """
        namespace = quota_key(quota_obj).namespace
        spec = quota_obj.get("spec") or {}
        hard = parse_resource_list(spec.get("hard"), "spec.hard")
        status = quota_obj.get("status") or {}
        used = dict(parse_resource_list(status.get("used"), "status.used"))
        objects = {gr: store.in_namespace(namespace) for gr, store in self.stores.items()}
        error: UsageError | None = None
        try:
            new_usage = calculate_usage(objects, hard, quota_scopes(quota_obj), self.registry)
        except UsageError as failed:
            # Keep going with what the other evaluators computed; report the error after.
            error, new_usage = failed, failed.usage
        # A registered evaluator whose kind has no store yet (resource claims, watched by the
        # dynamic kinds, before their first LIST) has measured nothing: its names keep their
        # last observation rather than a 0 computed from no objects.
        for evaluator in self.registry.list():
            if evaluator.group_resource not in self.stores:
                for name in evaluator.matching_resources(hard):
                    new_usage.pop(name, None)
        # Values the evaluators could not compute keep their last observation.
        used.update(new_usage)
        used = quota.mask(used, hard)
        if error is not None:
            raise UsageError(used, error.errors)
        return hard, used

    async def sync_resource_quota(self, quota_obj: Obj) -> None:
        """Recalculate one quota and write its status if anything changed numerically."""
        started = time.monotonic()
        status = quota_obj.get("status") or {}
        try:
            status_hard = _resource_list(status.get("hard"), "status.hard")
            status_used = _resource_list(status.get("used"), "status.used")
            errors: list[Exception] = []
            try:
                hard, used = self.calculate(quota_obj)
            except UsageError as failed:
                errors.extend(failed.errors)
                hard = parse_resource_list((quota_obj.get("spec") or {}).get("hard"), "spec.hard")
                used = dict(failed.usage)
        except (ResourceListError, ScopeError, ObjectError) as invalid:
            # The API server validates quotas, so this is a quota we cannot read: retrying
            # will not help, and the rate limiter keeps it from spinning.
            raise InvalidQuota(f"{format_key(quota_key(quota_obj))}: {invalid}") from invalid

        if self.charges is not None and status_used is not None:
            used = hold_pending(used, status_used, self.charges.held(quota_key(quota_obj)))
        dirty = not _semantic_equal(hard, status_hard) or status_hard is None or status_used is None
        dirty = dirty or not quota.equals(used, status_used or {})
        if dirty:
            await self.writer.update_status(
                quota_obj, {"hard": quota.to_strings(hard), "used": quota.to_strings(used)}
            )
            if status_hard is None or set(status_hard) != set(hard):
                # Admission charges the names in status.hard: a create it judged by the old
                # names and the caches show only after this write is not in it.
                self.first_syncs.wrote_first(quota_key(quota_obj))
        logger.debug(
            "synced quota %s/%s in %.1f ms (written: %s)",
            *quota_key(quota_obj),
            (time.monotonic() - started) * 1000,
            dirty,
        )
        if self.observer is not None:
            self.observer.quota_synced(quota_key(quota_obj), hard, used)
        if errors:
            raise UsageError(used, errors)

    # -- running

    def start(self) -> None:
        """Start the workers and the resync loop; the caches must be synced already."""
        for pool in self._pools:
            pool.start()
        self._resync.start()

    async def stop(self, grace_period: float = DEFAULT_STOP_TIMEOUT) -> None:
        """Stop the resync loop and the workers; syncs still running after ``grace_period``
        seconds are cancelled (0: at once, when leadership is lost)."""
        await self._resync.stop()
        await asyncio.gather(*(pool.stop(grace_period=grace_period) for pool in self._pools))


class InvalidQuota(ValueError):
    """A quota whose spec or status cannot be parsed."""


def raised_usage(old: Obj, new: Obj) -> dict[str, Quantity]:
    """What a quota update raised in ``status.used``, per name both versions carry.

    That is what a reservation by admission looks like on the quota's watch, whichever
    replica's admission made it; with several replicas the leader's controller must not lower a
    charge another replica made a moment ago (it holds it: :meth:`ChargeLedger.hold
    <tally.charges.ChargeLedger.hold>`). A name new in ``used`` is the controller's first
    calculation, not a charge.
    """
    try:
        before = parse_resource_list((old.get("status") or {}).get("used"), "status.used")
        after = parse_resource_list((new.get("status") or {}).get("used"), "status.used")
    except ResourceListError:
        return {}
    return {
        name: value - before[name]
        for name, value in after.items()
        if name in before and value > before[name]
    }
