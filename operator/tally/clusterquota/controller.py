"""The ClusterQuota usage controller: keeps every ClusterQuota's status true.

The same shape as the ResourceQuota controller (:mod:`tally.resourcequota.controller`), over
the same caches and evaluators: event handlers only work out ClusterQuota names and enqueue
them; workers sync one ClusterQuota at a time: select the namespaces, calculate each one's usage
exactly as a ResourceQuota with the same spec in that namespace would have it, add them up, and
write the status last, compare-and-swap, only when it changed.

What enqueues a ClusterQuota:

* its creation, and a change of its spec (selector, hard, scopes);
* a namespace that starts or stops matching its selector (created, labels changed, deleted);
* replenishment in a namespace it selects, by the same rules as a ResourceQuota's
  (:mod:`tally.resourcequota.replenishment`): deletions, usage-lowering updates, creations
  admission did not charge, and every creation in a namespace whose selection by it changed
  within the charge confirmation timeout (admission may have judged that create by the old
  selection: charged to the ClusterQuotas the namespace left, to none of those it joined,
  and the sync the change started may have run before the object reached the caches);
* a released charge (:mod:`tally.charges`), and the full resync.

A sync calculates only the namespaces whose usage may have changed since this controller last
computed the ClusterQuota's status (replenishment, a released charge, a namespace whose
selection changed name them) and takes every other namespace's share from that status as
written: at ten thousand selected namespaces, calculating them all took about 1.5 s of the one
event loop, for each pod deleted anywhere. Every namespace is calculated at the first sync
(controllers run only in the leader, and a process that loses the lead exits: what a previous
leader calculated is never taken as written), after a change of spec, when a kind's cache
becomes ready, after a sync that found errors, and at the full resync, which so also corrects
a status someone else edited. A sync that wrote nothing (a lost compare-and-swap) leaves its
namespaces to the next.

When an evaluator fails on an object (a measure whose expression fails on it), the sync still
writes what it could compute, keeps the failed names' last values, and sets the status's
``UsageComputed`` condition to ``False`` with the error (which names the object); a Warning
Event on the ClusterQuota marks the moment it turned ``False``. The sync is then retried with
the controller's back-off, and the condition returns to ``True`` once the object is fixed or
gone.

Charges admission wrote for objects the caches do not show yet hold usage, per namespace, as
for a ResourceQuota (:func:`tally.charges.hold_pending`), and a sync waits while admission is
writing the ClusterQuota's status (:meth:`tally.charges.ChargeLedger.defer_sync`).

Left out: watching (the wiring feeds the handlers), the API client (a
:class:`ClusterQuotaStatusWriter` is passed in), validation (the webhook).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from tally.charges import ChargeLedger, FirstSyncs, RecentKeys, hold_pending
from tally.charges.ledger import DEFAULT_TIMEOUT_S
from tally.clusterquota import quota as cluster
from tally.clusterquota.measures import measure_specs
from tally.evaluators.base import GroupResource, quota_scopes
from tally.evaluators.registry import Registry, UsageError, calculate_usage
from tally.machinery.cache import Change, ChangeKind, Store
from tally.machinery.errors import Conflict, encoded_size
from tally.machinery.selectors import LabelSelector
from tally.quota import resources
from tally.quota.identity import cluster_quota_key
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

QUEUE: Final = "clusterquota"
DEFAULT_RESYNC_PERIOD_S: Final = 300.0
DEFAULT_WORKERS: Final = 5
FIRST_STATUS_WAIT_S: Final = 10.0
"""The longest a new ClusterQuota's first status waits for tally's webhook rules to cover what
it limits (they are applied within a few hundred milliseconds when the API is healthy)."""
FIRST_STATUS_RECHECK_S: Final = 0.1
STATUS_BYTES_WARNING: Final = 1 << 20
"""A status this large (bytes of JSON) is reported: a Warning Event on the ClusterQuota and a
warning in the log when it grows past it, ``tally_clusterquota_status_bytes`` always. The API
server refuses the whole object past etcd's request limit (1.5 MiB by default; 2 MiB for its
gRPC messages, 3 MiB for a request body), and then no status can be written, nor any charge:
every create the ClusterQuota covers fails. Each namespace that uses something is listed: 10 000
of them with five names is 1.3-1.9 MB."""
SIZE_EVERY_SYNC_BELOW: Final = 1000
SIZE_PERIOD_S: Final = 30.0
"""A status listing fewer namespaces than ``SIZE_EVERY_SYNC_BELOW`` is measured at every sync
(a few milliseconds at most); a longer one at most every ``SIZE_PERIOD_S``: measuring means
encoding it, 20-40 ms of the loop at 10 000 namespaces, beside a sync that already costs ten
times that. The size is read by an alert that waits ten minutes."""


class ClusterQuotaStatusWriter(Protocol):
    async def update_status(self, cq: Obj, status: Mapping[str, Any]) -> None:
        """PUT ``cq`` (with its resourceVersion) carrying ``status``; :class:`Conflict` on 409;
        a ClusterQuota deleted meanwhile is done."""
        ...


class WarningRecorder(Protocol):
    async def warn(self, obj: Obj, reason: str, message: str) -> None:
        """Record a Warning Event about ``obj``; may raise (the sync logs it and goes on)."""
        ...


class SyncObserver(Protocol):
    def cluster_quota_synced(self, name: str, status: Mapping[str, Any]) -> None: ...

    def cluster_quota_status_size(self, name: str, size: int) -> None:
        """The size in bytes of the status a sync is about to write."""
        ...

    def cluster_quota_deleted(self, name: str) -> None: ...


@dataclass(frozen=True)
class Calculation:
    """What the next status write of one ClusterQuota carries (:meth:`ClusterQuotaController.
    calculate`)."""

    hard: dict[str, Quantity]
    used: dict[str, dict[str, Quantity]]
    """Usage by selected namespace."""
    written: dict[str, Mapping[str, Any]]
    """The namespaces whose share was taken from the status, as it was written there."""
    errors: dict[str, list[Exception]]
    """Evaluator errors by namespace."""
    pending: list[str]
    """Hard names whose kind has no cache yet, or that no evaluator measures yet."""


class ClusterQuotaController:
    """Every ClusterQuota's ``status.total`` and ``status.namespaces``, from the caches."""

    def __init__(
        self,
        registry: Registry,
        cluster_quotas: Store[Obj],
        namespaces: Store[Obj],
        stores: Mapping[GroupResource, Store[Any]],
        writer: ClusterQuotaStatusWriter,
        *,
        workers: int = DEFAULT_WORKERS,
        resync_period: float = DEFAULT_RESYNC_PERIOD_S,
        charges: ChargeLedger | None = None,
        newest: Callable[[Obj], Obj] | None = None,
        metrics_provider: MetricsProvider | None = None,
        observer: SyncObserver | None = None,
        admission_ready: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        recorder: WarningRecorder | None = None,
        namespace_recorder: WarningRecorder | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``admission_ready``: whether the API server now sends tally's webhook every kind the
        ClusterQuotas name (the registrar's rules are current); a new ClusterQuota's first
        status waits for it, up to :data:`FIRST_STATUS_WAIT_S`. None: never waits.
        ``recorder``: where a ClusterQuota whose usage stopped being computed gets its Warning
        Event (None: none); ``namespace_recorder``: where each namespace whose objects it
        could not compute gets the same Event with that namespace's errors only, about the
        ClusterQuota's AppliedClusterQuota there (what the namespace's users read: the
        ClusterQuota's own Event, cluster-scoped, lands in ``default`` and names every
        namespace's objects); ``wall_clock``: the time conditions carry."""
        self.registry = registry
        self.recorder = recorder
        self.namespace_recorder = namespace_recorder
        self._wall_clock = wall_clock
        self.admission_ready = admission_ready
        self._clock = clock
        # ClusterQuotas whose first status waits for admission's rules, since when; an entry
        # leaves when the status is written or the ClusterQuota is deleted.
        self._first_status_waits: dict[str, float] = {}
        self.cluster_quotas = cluster_quotas
        """ClusterQuota objects, whole, keyed ``("", name)``."""
        self.namespaces = namespaces
        """Namespaces' labels (``namespace_labels`` projections), keyed ``("", name)``."""
        self.stores = stores
        """The tracked kinds' projections: the mapping the ResourceQuota controller reads."""
        self.writer = writer
        self.workers = workers
        self.resync_period = resync_period
        self.charges = charges
        self.first_syncs: FirstSyncs[str] = FirstSyncs(
            charges.timeout if charges is not None else DEFAULT_TIMEOUT_S, clock
        )
        """ClusterQuotas whose first status was just written (see :meth:`replenish`)."""
        self.selection_changes: RecentKeys[tuple[str, str]] = RecentKeys(
            self.first_syncs.window, clock
        )
        """(ClusterQuota, namespace) pairs whose selection changed lately, namespace ``""``
        for a changed selector or scopes (see :meth:`replenish`)."""
        self.newest = newest
        self.observer = observer
        self._large: set[str] = set()
        """ClusterQuotas whose last status was reported as large (:data:`STATUS_BYTES_WARNING`)."""
        self._sized: dict[str, float] = {}
        """When each ClusterQuota's status was last measured (:data:`SIZE_PERIOD_S`)."""
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(
            default_controller_rate_limiter(), name=QUEUE, metrics_provider=metrics_provider
        )
        self._pool = WorkerPool(
            self.queue, self._sync_key, workers=workers, name=QUEUE, expected=(Conflict,)
        )
        self._resync = SpreadResync(
            self.resync_keys, self._resync_one, resync_period, name="clusterquota-resync",
            logger=logger,
        )  # fmt: skip
        # Parsed selectors by ClusterQuota name, with the resourceVersion they were parsed at.
        # Entries leave with their ClusterQuota.
        self._selectors: dict[str, tuple[str, LabelSelector | None]] = {}
        # By ClusterQuota: the shares its last sync took as written, parsed, with their text
        # (the next sync parses only those whose text changed).
        self._parsed: dict[str, dict[str, tuple[Mapping[str, Any], dict[str, Quantity]]]] = {}
        # By ClusterQuota whose status a sync of this controller computed: the spec it was
        # computed for, and the namespaces whose usage may have changed since (the next sync
        # calculates those alone). A ClusterQuota not here has every namespace calculated.
        self._changed: dict[str, tuple[Any, set[str]]] = {}

    # -- reading the caches

    def _all(self) -> list[Obj]:
        return list(self.cluster_quotas.in_namespace(""))

    def selector_of(self, cq: Obj) -> LabelSelector | None:
        """The ClusterQuota's selector; None when it does not parse (it selects nothing)."""
        name = cluster.name_of(cq)
        version = str((cq.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._selectors.get(name)
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            parsed: LabelSelector | None = cluster.selector(cq)
        except cluster.InvalidClusterQuota:
            parsed = None
        self._selectors[name] = (version, parsed)
        return parsed

    def selects(self, cq: Obj, namespace: str) -> bool:
        chosen = self.selector_of(cq)
        labels = self.namespaces.get("", namespace)
        return chosen is not None and labels is not None and chosen.matches(labels)

    def selecting(self, namespace: str) -> list[Obj]:
        """The ClusterQuotas (newest copies) that select ``namespace``, by name."""
        found = [self._newest(cq) for cq in self._all() if self.selects(cq, namespace)]
        return sorted(found, key=cluster.name_of)

    def _newest(self, cq: Obj) -> Obj:
        return cq if self.newest is None else self.newest(cq)

    # -- event handlers: work out names, enqueue, nothing else

    def on_cluster_quota(self, change: Change[Obj]) -> None:
        if change.kind is ChangeKind.DELETED:
            self._selectors.pop(change.name, None)
            self._first_status_waits.pop(change.name, None)
            self._changed.pop(change.name, None)
            self._parsed.pop(change.name, None)
            self._large.discard(change.name)
            self._sized.pop(change.name, None)
            if self.observer is not None:
                self.observer.cluster_quota_deleted(change.name)
            if self.charges is not None:
                for namespace in self.namespaces.names_in(""):
                    self.charges.forget_quota(cluster_quota_key(namespace, change.name))
            return
        old_spec = (change.old or {}).get("spec")
        new_spec = (change.new or {}).get("spec")
        if change.kind is ChangeKind.UPDATED and old_spec == new_spec:
            return  # a status write: ours, or corrected at the next resync
        if change.kind is ChangeKind.UPDATED and _selection(old_spec) != _selection(new_spec):
            self.selection_changes.note((change.name, ""))
        self.queue.add(change.name)  # a new spec: every namespace (see _take_changed)

    def enqueue_naming(self, gr: GroupResource) -> None:
        """``gr``'s cache is ready: every ClusterQuota whose spec names it is synced."""
        for cq in self._all():
            if self.registry.names(gr, cluster.spec_quota(cq).get("hard")):
                self._changed.pop(cluster.name_of(cq), None)
                self.queue.add(cluster.name_of(cq))

    def on_namespace(self, change: Change[Obj]) -> None:
        """A namespace appeared, changed labels or went: re-sync the ClusterQuotas whose
        selection of it changes (a deleted namespace leaves the status)."""
        for cq in self._all():
            chosen = self.selector_of(cq)
            if chosen is None:
                continue
            before = change.old is not None and chosen.matches(change.old)
            after = change.new is not None and chosen.matches(change.new)
            if before != after:
                name = cluster.name_of(cq)
                self.selection_changes.note((name, change.name))
                self._changed_in(name, change.name)
                self.queue.add(name)

    def replenish(
        self, group_resource: GroupResource, namespace: str, *, unsynced_only: bool = False
    ) -> None:
        """Usage of ``group_resource`` in ``namespace`` may have changed (the ResourceQuota
        controller's ``replenish``, for the ClusterQuotas selecting the namespace).

        ``unsynced_only`` (a creation admission charges): only ClusterQuotas whose first status,
        or a status with other hard names, was just written, or whose selection of
        ``namespace`` (or scopes) just changed; admission charged the others. A ClusterQuota
        that just stopped selecting ``namespace`` is recalculated too: admission may have
        charged it by the old selection."""
        evaluator = self.registry.get(group_resource)
        if evaluator is None:
            return
        for cq in self._all():
            name = cluster.name_of(cq)
            reselected = self.selection_changes.recent(
                (name, namespace)
            ) or self.selection_changes.recent((name, ""))
            if not reselected and not self.selects(cq, namespace):
                continue
            current = self._newest(cq)
            status_hard = cluster.status_total(current, "hard")
            if (
                unsynced_only
                and status_hard is not None
                and not self.first_syncs.recent(name)
                and not reselected
            ):
                continue  # charged by admission, which judged by the selection we have
            names = list(status_hard or (cluster.spec_quota(current).get("hard") or {}))
            if evaluator.matching_resources(names):
                self._changed_in(name, namespace)
                self.queue.add(name)

    def recalculate(self, name: str, namespace: str) -> None:
        """Charges held on ``name``'s share in ``namespace`` were released, or a late object
        arrived (the charge ledger's ``recalculate``). ``namespace`` "" (the whole
        ClusterQuota's key): the sync the ledger deferred while admission wrote the status,
        which still has the namespaces it was to calculate."""
        if namespace:
            self._changed_in(name, namespace)
        self.queue.add(name)

    def _changed_in(self, name: str, namespace: str) -> None:
        """``namespace``'s usage under ``name`` may have changed: its next sync calculates
        it."""
        computed = self._changed.get(name)
        if computed is not None:
            computed[1].add(namespace)

    def _take_changed(self, name: str, cq: Obj) -> set[str] | None:
        """The namespaces the sync of ``cq`` calculates (None: all of them); changes noted
        from now on are the next sync's."""
        computed = self._changed.get(name)
        spec = cq.get("spec")
        self._changed[name] = (spec, set())
        if computed is None or computed[0] != spec:
            return None
        return computed[1]

    def _give_back(self, name: str, taken: set[str] | None) -> None:
        """The sync that took ``taken`` wrote nothing: the next one calculates them again."""
        if taken is None:
            self._changed.pop(name, None)
            return
        computed = self._changed.get(name)
        if computed is not None:
            computed[1].update(taken)

    def resync_keys(self) -> list[str]:
        """Every ClusterQuota, in the order the full resync hands them out."""
        return [cluster.name_of(cq) for cq in self._all()]

    def _resync_one(self, name: str) -> None:
        """The full resync: every namespace calculated again."""
        self._changed.pop(name, None)
        self.queue.add(name)

    def unfinished(self) -> int:
        """ClusterQuotas queued or being synced (retries waiting out their back-off not
        counted)."""
        return self.queue.unfinished()

    # -- sync

    async def _sync_key(self, name: str) -> None:
        if self.charges is not None and self.charges.defer_sync(cluster_quota_key("", name)):
            return  # admission is writing this status: the ledger enqueues it when it is done
        cached = self.cluster_quotas.get("", name)
        if cached is None:
            return
        await self.sync_cluster_quota(self._newest(cached))

    def calculate(self, cq: Obj, changed: Collection[str] | None = None) -> Calculation:
        """What the next status write carries; a name an evaluator failed on, or whose kind
        has no cache, keeps its last observation.

        ``changed``: the namespaces whose usage may have changed since ``cq``'s status was
        computed for its spec; every other selected namespace's share is taken as that status
        lists it (a namespace it does not list used nothing), unless it does not parse or has
        names outside ``hard``. None: every namespace is calculated.

        Raises :class:`cluster.InvalidClusterQuota` for a spec it cannot use.
        """
        name = cluster.name_of(cq)
        hard = cluster.hard(cq)
        chosen = cluster.selector(cq)
        try:
            scopes = quota_scopes({"spec": cluster.spec_quota(cq)})
        except ValueError as error:
            raise cluster.InvalidClusterQuota(str(error)) from None
        index = cluster.namespace_index(cq)
        unstored = [
            name
            for evaluator in self.registry.list()
            if evaluator.group_resource not in self.stores
            for name in evaluator.matching_resources(hard)
        ]
        errors: dict[str, list[Exception]] = {}
        used_by_namespace: dict[str, dict[str, Quantity]] = {}
        written: dict[str, Mapping[str, Any]] = {}
        parsed_before = self._parsed.pop(name, {}) if changed is not None else {}
        parsed: dict[str, tuple[Mapping[str, Any], dict[str, Quantity]]] = {}
        for namespace in self.namespaces.names_in(""):
            if not chosen.matches(self.namespaces.get("", namespace)):
                continue
            if changed is not None and namespace not in changed:
                share = _share_as_written(index, namespace, hard, parsed_before, parsed)
                if share is not None:
                    used_by_namespace[namespace] = share
                    if share:
                        written[namespace] = index[namespace]
                    continue
            objects = {gr: store.in_namespace(namespace) for gr, store in self.stores.items()}
            try:
                computed = calculate_usage(objects, hard, scopes, self.registry)
            except UsageError as failed:
                errors[namespace] = list(failed.errors)
                computed = dict(failed.usage)
            last = cluster.share_in(index, namespace)
            # A kind without a store yet keeps its last observation, as for ResourceQuotas.
            for unknown in unstored:
                computed.pop(unknown, None)
            used = resources.mask({**last, **computed}, hard)
            if self.charges is not None:
                used = hold_pending(
                    used, last, self.charges.held(cluster_quota_key(namespace, name))
                )
            used_by_namespace[namespace] = used
        # Names this ClusterQuota measures that no evaluator answers for yet (its kind is
        # being listed, or its evaluator replaced after a change of measures) were not
        # computed either.
        answered = set(self.measured(hard))
        unmeasured = [
            str(spec.get("name"))
            for spec in measure_specs(cq)
            if isinstance(spec, Mapping) and spec.get("name") in hard
            and spec.get("name") not in answered
        ]  # fmt: skip
        self._parsed[name] = parsed
        return Calculation(
            hard, used_by_namespace, written, errors, sorted({*unstored, *unmeasured})
        )

    def _may_write_first_status(self, name: str) -> bool:
        """A status with ``hard`` is what says a ClusterQuota is in force (admission judges by
        it, users read it so). Written while the API server does not yet send tally's webhook
        the kinds it limits, creations would pass unjudged: so the first one waits until the
        rules are current, or :data:`FIRST_STATUS_WAIT_S` passed (a registrar that cannot
        write them must not keep the usage unknown forever)."""
        if self.admission_ready is None or self.admission_ready():
            self._first_status_waits.pop(name, None)
            return True
        since = self._first_status_waits.setdefault(name, self._clock())
        if self._clock() - since < FIRST_STATUS_WAIT_S:
            return False
        self._first_status_waits.pop(name, None)
        logger.warning(
            "cluster quota %s: tally's webhook rules still do not cover what it limits after "
            "%.0f s; writing its first status anyway", name, FIRST_STATUS_WAIT_S,
        )  # fmt: skip
        return True

    def measured(self, hard: Mapping[str, Quantity]) -> list[str]:
        """The hard names some registered evaluator measures."""
        return sorted(
            {n for evaluator in self.registry.list() for n in evaluator.matching_resources(hard)}
        )

    async def sync_cluster_quota(self, cq: Obj) -> None:
        name = cluster.name_of(cq)
        first = cluster.status_total(cq, "hard") is None
        if first and not self._may_write_first_status(name):
            self.queue.add_after(name, FIRST_STATUS_RECHECK_S)
            return  # nothing computed: asked again shortly
        started = time.monotonic()
        taken = self._take_changed(name, cq)
        if first:
            taken = None
        try:
            calculation = self.calculate(cq, taken)
        except cluster.InvalidClusterQuota as invalid:
            # Refused by the webhook when written; one that got in anyway (webhook down) is
            # reported (its condition, its Event) and otherwise left alone: retrying will not
            # help.
            self._changed.pop(name, None)
            condition = cluster.invalid_spec(cq, str(invalid), self._now())
            await self._write_status(cq, {**(cq.get("status") or {}), "conditions": [condition]})
            raise InvalidClusterQuotaError(f"{name}: {invalid}") from invalid
        hard = calculation.hard
        errors = [error for found in calculation.errors.values() for error in found]
        computed = cluster.usage_computed(
            cq, [str(error) for error in errors], self._now(), calculation.pending
        )
        status = cluster.build_status(
            hard, calculation.used, self.measured(hard), [computed], calculation.written
        )
        written_names = set(cluster.status_total(cq, "hard") or {})
        await self._report_size(cq, status)
        try:
            wrote = await self._write_status(cq, status, calculation.errors)
        except BaseException:
            self._give_back(name, taken)
            raise
        if errors:
            # The namespaces that failed are calculated again at the retry; so are the others,
            # whose errors the condition would otherwise stop naming.
            self._changed.pop(name, None)
        if wrote and (first or written_names != set(hard)):
            # Admission charges the names in status.hard: a create it judged by the old ones
            # and the caches show only after this write is not in it.
            self.first_syncs.wrote_first(name)
        logger.debug("synced cluster quota %s in %.1f ms (%s)", name,
                     (time.monotonic() - started) * 1000,
                     "all namespaces" if taken is None else f"{len(taken)} changed")  # fmt: skip
        if self.observer is not None:
            self.observer.cluster_quota_synced(name, status)
        if errors:
            raise UsageError({}, errors)

    def _now(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._wall_clock()))

    async def _write_status(
        self,
        cq: Obj,
        status: Mapping[str, Any],
        errors_by_namespace: Mapping[str, list[Exception]] | None = None,
    ) -> bool:
        """Write ``status`` unless ``cq`` has it already (whether it wrote); a ``UsageComputed``
        condition that turns ``False`` gets its Warning Event once the write has landed, and
        each namespace in ``errors_by_namespace`` one of its own."""
        if status == cq.get("status"):
            return False
        await self.writer.update_status(cq, status)
        before = cluster.condition(cq, cluster.USAGE_COMPUTED)
        after = cluster.condition({"status": status}, cluster.USAGE_COMPUTED)
        turned = before is None or before.get("status") != "False"
        if after is not None and after.get("status") == "False" and turned:
            reason = str(after.get("reason"))
            await self._warn(cq, reason, str(after.get("message")))
            for namespace, errors in sorted((errors_by_namespace or {}).items()):
                await self._warn_namespace(cq, namespace, reason, errors)
        return True

    async def _report_size(self, cq: Obj, status: Mapping[str, Any]) -> None:
        """Report the size of ``status`` before it is written (a write too large fails), and
        warn when it grows past :data:`STATUS_BYTES_WARNING` (once, until it is smaller)."""
        name = cluster.name_of(cq)
        listed = len(status.get("namespaces") or [])
        now = self._clock()
        last = self._sized.get(name)
        if listed >= SIZE_EVERY_SYNC_BELOW and last is not None and now - last < SIZE_PERIOD_S:
            return
        self._sized[name] = now
        size = encoded_size(status)
        if self.observer is not None:
            self.observer.cluster_quota_status_size(name, size)
        if size < STATUS_BYTES_WARNING:
            self._large.discard(name)
            return
        if name in self._large:
            return
        self._large.add(name)
        message = (
            f"its status is {size} bytes, listing {listed} namespaces; the API server refuses an "
            "object past etcd's request limit (1.5 MiB by default), and then neither its usage "
            "nor any charge can be written: select fewer namespaces, or split it"
        )
        logger.warning("cluster quota %s: %s", name, message)
        await self._warn(cq, "StatusLarge", message)

    async def _warn_namespace(
        self, cq: Obj, namespace: str, reason: str, errors: list[Exception]
    ) -> None:
        if self.namespace_recorder is None:
            return
        name = cluster.name_of(cq)
        applied = {"metadata": {"name": name, "namespace": namespace}}
        message = f"cluster quota {name}: " + "; ".join(str(error) for error in errors)
        try:
            await self.namespace_recorder.warn(applied, reason, message)
        except Exception as error:
            logger.warning("cluster quota %s: recording a Warning Event in %s failed: %s",
                           name, namespace, error)  # fmt: skip

    async def _warn(self, cq: Obj, reason: str, message: str) -> None:
        if self.recorder is None:
            return
        try:
            await self.recorder.warn(cq, reason, message)
        except Exception as error:
            # The condition says it already; a lost Event must not fail the sync.
            logger.warning(
                "cluster quota %s: recording a Warning Event failed: %s", cluster.name_of(cq), error
            )

    # -- running

    def start(self) -> None:
        self._pool.start()
        self._resync.start()

    async def stop(self, grace_period: float = DEFAULT_STOP_TIMEOUT) -> None:
        await self._resync.stop()
        await self._pool.stop(grace_period=grace_period)


class InvalidClusterQuotaError(ValueError):
    """A ClusterQuota whose spec cannot be used (the sync reports it and goes on)."""


def _selection(spec: Any) -> Any:
    """What decides which objects admission charges to a ClusterQuota, besides its hard
    names: the namespaces it selects and its scopes."""
    if not isinstance(spec, Mapping):
        return None
    quota = spec.get("quota")
    scoped = (
        (quota.get("scopes"), quota.get("scopeSelector")) if isinstance(quota, Mapping) else None
    )
    return spec.get("namespaceSelector"), scoped


def _share_as_written(
    index: Mapping[str, Any],
    namespace: str,
    hard: Mapping[str, Quantity],
    parsed_before: Mapping[str, tuple[Mapping[str, Any], dict[str, Quantity]]],
    parsed: dict[str, tuple[Mapping[str, Any], dict[str, Quantity]]],
) -> dict[str, Quantity] | None:
    """``namespace``'s share from the status's :func:`cluster.namespace_index` (empty when
    it is not listed: it used nothing); None when it must be calculated: it does not parse,
    or names something ``hard`` does not. ``parsed_before``: shares the last sync parsed,
    with their text (one whose text is the same is not parsed again); what this one parsed
    goes into ``parsed``."""
    if namespace not in index:
        return {}
    written = index[namespace]
    before = parsed_before.get(namespace)
    if before is not None and before[0] == written:
        share = before[1]
    else:
        try:
            share = parse_resource_list(written, "status.namespaces[].used")
        except ResourceListError:
            return None
    if not share.keys() <= hard.keys():
        return None
    parsed[namespace] = (written, share)
    return share


def namespace_labels(obj: Obj) -> dict[str, str]:
    """The namespace store's projection: a namespace's labels (all its selection needs)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
