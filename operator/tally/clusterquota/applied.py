"""AppliedClusterQuotas: each ClusterQuota as the people of a namespace it selects may read it.

A ClusterQuota is cluster-scoped, and its status names every selected namespace with its usage,
so a team member who may read only their own namespace can neither read it nor be allowed to.
In each namespace a ClusterQuota selects, tally keeps one ``AppliedClusterQuota``
(``appliedclusterquotas.tally.dev``, namespaced, named as the ClusterQuota) that carries what
binds that namespace and nothing of any other: the ClusterQuota's ``spec.quota`` (hard, scopes),
the total used over all its namespaces, this namespace's own share, what remains, the most used
resource, and whether usage was computed (status and reason, not the message, which may name
an object elsewhere). Never the selector (its label values can name other teams) nor another
namespace's name, share or count. The built-in ``view`` role reads them (the manifests'
aggregated ClusterRole); nobody but tally writes them.

Objects tally writes, rather than an API tally would serve through the aggregation layer: they
stay readable (as last written) while tally is down, where an aggregated API would be
unavailable and, with it, its group's discovery, so that no namespace anywhere in the cluster
finishes its deletion until it is back (the namespace controller will not finalize one while
any group's discovery fails; measured by ``bench/applied.py``); ``get``, ``-w``, ``-o yaml``,
table columns and RBAC then come from the API server as for any kind. Their cost is writes: each
charge moves the total every applied object shows. :class:`AppliedQuotaController` bounds it:
one object is written at most once per ``min_interval`` (a burst of charges is one write per
object per interval, showing the latest total), all of them at most ``qps`` per second, and a
write happens only when what the object shows changed. A namespace whose own share moved is
written first: refreshes that carry only a new total have a queue and workers of their own, so
under a burst over many namespaces a namespace's own charge does not wait behind the others'
totals.

An owner reference to the ClusterQuota lets the garbage collector remove its applied objects
when it is deleted, tally running or not; a namespace's are deleted with it.

Pure apart from the writer it is given: plain JSON in and out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

from tally.clusterquota import quota as cluster
from tally.machinery.cache import Change, ChangeKind, Store
from tally.machinery.errors import Conflict, NotFound
from tally.quota import resources
from tally.quota.quantity import ZERO
from tally.workqueue import (
    DEFAULT_STOP_TIMEOUT,
    MetricsProvider,
    RateLimitingQueue,
    SpreadResync,
    WorkerPool,
    default_controller_rate_limiter,
)
from tally.workqueue.tokenbucket import TokenBucket

logger = logging.getLogger(__name__)

Obj = Mapping[str, Any]

GROUP: Final = "tally.dev"
VERSION: Final = "v1alpha1"
KIND: Final = "AppliedClusterQuota"
PLURAL: Final = "appliedclusterquotas"
OWNER_KIND: Final = "ClusterQuota"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "tally"}

QUEUE: Final = "appliedclusterquota"
BACKGROUND_QUEUE: Final = "appliedclusterquota-total"
BUSY_RETRY_S: Final = 0.1
DEFAULT_WORKERS: Final = 2
DEFAULT_MIN_INTERVAL_S: Final = 1.0
DEFAULT_QPS: Final = 50.0
DEFAULT_RESYNC_PERIOD_S: Final = 300.0


def applied_status(
    cq: Obj, namespace: str, index: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What the AppliedClusterQuota of ``cq`` in ``namespace`` shows: ``total`` (hard and used,
    as the ClusterQuota's status has them), ``namespace.used`` (this namespace's share of every
    name the total carries, zero where it uses none), ``remaining`` (hard less the total used,
    never below zero), ``mostUsed``, and the ``UsageComputed`` condition without its message;
    the share and what remains also as one line each (``usedSummary``, ``remainingSummary``:
    ``name: value`` pairs as ``kubectl get quota`` prints them), for the printer columns, which
    would otherwise print a map as JSON. Before the ClusterQuota's first status: its hard
    limits only. ``index``: ``cluster.namespace_index(cq)``, when the caller keeps it for
    the many namespaces of one ClusterQuota version."""
    hard = cluster.status_total(cq, "hard")
    if hard is None:
        try:
            hard = cluster.hard(cq)
        except cluster.InvalidClusterQuota:
            hard = {}
    used = cluster.status_total(cq, "used")
    status: dict[str, Any] = {"total": {"hard": resources.to_strings(hard)}}
    if used is None:
        return status
    share = cluster.share_in(index if index is not None else cluster.namespace_index(cq), namespace)
    status["total"]["used"] = resources.to_strings(used)
    here = {name: share.get(name, ZERO) for name in used}
    status["namespace"] = {"used": resources.to_strings(here), "usedSummary": _summary(here)}
    remaining = {name: max(limit - used.get(name, ZERO), ZERO) for name, limit in hard.items()}
    status["remaining"] = resources.to_strings(remaining)
    status["remainingSummary"] = _summary(remaining)
    status["mostUsed"] = cluster.most_used(hard, used)
    computed = cluster.condition(cq, cluster.USAGE_COMPUTED)
    if computed is not None:
        status["conditions"] = [
            {key: computed[key] for key in ("type", "status", "reason", "lastTransitionTime")
             if key in computed}
        ]  # fmt: skip
    return status


def _summary(values: resources.ResourceList) -> str:
    """``pods: 3, requests.cpu: 500m``: sorted by name, as ``kubectl get quota`` lists each
    resource in its columns."""
    return ", ".join(f"{name}: {values[name].canonical()}" for name in sorted(values))


def applied_object(
    cq: Obj, namespace: str, index: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The AppliedClusterQuota of ``cq`` in ``namespace``, as tally writes it (``index``: as
    :func:`applied_status`'s)."""
    metadata = cq.get("metadata") or {}
    name = cluster.name_of(cq)
    owner: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": OWNER_KIND,
        "name": name,
        "uid": str(metadata.get("uid") or ""),
        "controller": True,
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(MANAGED_BY),
            "ownerReferences": [owner],
        },
        "spec": {"quota": dict(cluster.spec_quota(cq))},
        "status": applied_status(cq, namespace, index),
    }


def shows_the_same(existing: Obj, desired: Obj) -> bool:
    """Whether ``existing`` already shows what ``desired`` would (spec, status, tally's label
    and owner reference): then nothing is written."""
    old, new = existing.get("metadata") or {}, desired.get("metadata") or {}
    labels = old.get("labels") or {}
    return (
        existing.get("spec") == desired.get("spec")
        and existing.get("status") == desired.get("status")
        and all(labels.get(k) == v for k, v in (new.get("labels") or {}).items())
        and old.get("ownerReferences") == new.get("ownerReferences")
    )


def owned_by_a_cluster_quota(obj: Obj) -> str | None:
    """The name of the ClusterQuota ``obj``'s controller reference points at, if any: only
    such objects are tally's to delete."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("controller")
            and ref.get("kind") == OWNER_KIND
            and str(ref.get("apiVersion") or "").startswith(f"{GROUP}/")
        ):
            return str(ref.get("name") or "")
    return None


class AppliedQuotaWriter(Protocol):
    async def create(self, body: Obj) -> None:
        """POST ``body``; :class:`Conflict` when it exists already (the cache lags)."""
        ...

    async def replace(self, existing: Obj, body: Obj) -> None:
        """PUT ``body`` carrying ``existing``'s resourceVersion; :class:`Conflict` on 409,
        :class:`NotFound` when it is gone."""
        ...

    async def delete(self, existing: Obj) -> None:
        """DELETE ``existing`` (its uid as precondition); gone already is done."""
        ...


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


class AppliedQuotaController:
    """One AppliedClusterQuota per (ClusterQuota, selected namespace), kept as the ClusterQuota
    shows, and none elsewhere."""

    def __init__(
        self,
        cluster_quotas: Store[Obj],
        namespaces: Store[Obj],
        applied: Store[Obj],
        writer: AppliedQuotaWriter,
        selects: Callable[[Obj, str], bool],
        *,
        newest: Callable[[Obj], Obj] | None = None,
        workers: int = DEFAULT_WORKERS,
        min_interval: float = DEFAULT_MIN_INTERVAL_S,
        qps: float = DEFAULT_QPS,
        resync_period: float = DEFAULT_RESYNC_PERIOD_S,
        metrics_provider: MetricsProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
        manages: Callable[[str], bool] = lambda namespace: True,
    ) -> None:
        """``selects(cq, namespace)``: the ClusterQuota controller's selection (the same
        parsed selectors and namespace labels); ``newest``: the ClusterQuota writer's latest
        copy of a cached ClusterQuota (its status written before the watch shows it);
        ``min_interval``: seconds between two writes of one object; ``qps``: writes per second
        over all of them (0: unlimited); ``manages(namespace)``: whether tally watches the
        namespace (``TALLY_NAMESPACES``): it writes no object where it could not see it."""
        self.cluster_quotas = cluster_quotas
        self.namespaces = namespaces
        self.applied = applied
        """AppliedClusterQuota objects as the API has them, keyed (namespace, name)."""
        self.writer = writer
        self.selects = selects
        self.manages = manages
        self.newest = newest
        self._indexes: dict[str, tuple[tuple[str, str], dict[str, Any]]] = {}
        """ClusterQuota name -> (uid, resourceVersion) and its namespace index."""
        self.min_interval = min_interval
        self._limiter = TokenBucket(qps, max(1, int(qps))) if qps > 0 else None
        self._clock = clock
        self._written: dict[str, float] = {}
        """When each key was last written (entries leave with the object)."""
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(
            default_controller_rate_limiter(), name=QUEUE, metrics_provider=metrics_provider
        )
        self._pool = WorkerPool(
            self.queue, self._sync_key, workers=workers, name=QUEUE, expected=(Conflict,)
        )
        # Refreshes of objects whose namespace's own share did not change (only the total
        # moved): their own queue and workers, so that a burst of charges under a ClusterQuota
        # over many namespaces never makes a namespace's own charge wait behind a thousand
        # other namespaces' totals. Both pools take their tokens from the one bucket.
        self.background: RateLimitingQueue[str] = RateLimitingQueue(
            default_controller_rate_limiter(), name=BACKGROUND_QUEUE,
            metrics_provider=metrics_provider,
        )  # fmt: skip
        self._background_pool = WorkerPool(
            self.background, self._sync_background, workers=workers, name=BACKGROUND_QUEUE,
            expected=(Conflict,),
        )  # fmt: skip
        self._busy: set[str] = set()
        """Keys being synced: one key is never synced by both pools at once."""
        self._synced_since_move: dict[str, set[str]] = {}
        """By ClusterQuota whose every object has been queued: the namespaces whose object
        began a sync since its status last moved. (A follower's handlers queue too; its queue
        is worked once it leads, and a process that loses the lead exits.)"""
        self._resync = SpreadResync(
            self.resync_keys, self.queue.add, resync_period, name="appliedclusterquota-resync",
            logger=logger,
        )  # fmt: skip

    # -- event handlers: work out keys, enqueue

    def _enqueue(self, key: str, *, background: bool = False) -> None:
        """Now, or once ``min_interval`` has passed since the key's last write; on the
        background queue when only the total it shows moved."""
        queue = self.background if background else self.queue
        wait = self._written.get(key, -self.min_interval) + self.min_interval - self._clock()
        if wait > 0:
            queue.add_after(key, wait)
        else:
            queue.add(key)

    def on_cluster_quota(self, change: Change[Obj]) -> None:
        """Every namespace the ClusterQuota selects, and every one holding its applied object
        (a ClusterQuota that stops selecting a namespace leaves one to delete). A status
        write that moved only the total is a background refresh for the namespaces whose own
        share it left as it was.

        Once all of them were queued, a status write (the spec as it was) queues only the
        namespaces whose own share it changed and, as background refreshes, the objects whose
        sync began since the ClusterQuota's status last moved: every other one is still
        queued from then and reads the newest status when its turn comes. Each of admission's
        charges is such a write; queueing every selected namespace for each cost 70-110 ms at
        10 000."""
        name = change.name
        old, new = change.old, change.new
        status_only = (
            change.kind is ChangeKind.UPDATED
            and old is not None
            and new is not None
            and old.get("spec") == new.get("spec")
        )
        synced = self._synced_since_move.get(name)
        if status_only and synced is not None and old is not None and new is not None:
            self._requeue_moved(name, old, new, synced)
            return
        namespaces = set(self._holding(name))
        if new is None:
            self._indexes.pop(name, None)
            self._synced_since_move.pop(name, None)
        else:
            namespaces.update(ns for ns in self.namespaces.names_in("") if self.selects(new, ns))
            self._synced_since_move[name] = set()
        # Shares as written, unparsed: tally writes them canonically, and parsing every
        # namespace's twice per status write cost O(namespaces) parses on each charge.
        before = self._index_of(old) if status_only and old is not None else {}
        after = self._index_of(new) if status_only and new is not None else {}
        for namespace in namespaces:
            same_share = status_only and before.get(namespace) == after.get(namespace)
            self._enqueue(_key(namespace, name), background=same_share)

    def _requeue_moved(self, name: str, old: Obj, new: Obj, synced: set[str]) -> None:
        """A status write of ClusterQuota ``name``: the namespaces whose share it changed
        first, then those in ``synced`` (whose object read an older status)."""
        before, after = self._index_of(old), self._index_of(new)
        own = {namespace for namespace, share in after.items() if before.get(namespace) != share}
        own.update(namespace for namespace in before if namespace not in after)
        for namespace in own:
            self._enqueue(_key(namespace, name))
        for namespace in synced - own:
            self._enqueue(_key(namespace, name), background=True)
        synced.clear()

    def on_namespace(self, change: Change[Obj]) -> None:
        """A namespace appeared, was relabelled or went: its applied objects follow."""
        namespace = change.name
        names = set(self.applied.names_in(namespace))
        names.update(cluster.name_of(cq) for cq in self.cluster_quotas.in_namespace(""))
        for name in names:
            self._enqueue(_key(namespace, name))

    def on_applied(self, change: Change[Obj]) -> None:
        """An applied object changed or went (tally's own write, or someone else's): checked
        again, so that one edited or deleted by hand shows the ClusterQuota again. A deletion
        at once; a change as a background refresh, within the interval: most are the echoes of
        tally's own writes, and one that found the total moved again meanwhile must not jump
        ahead of a namespace's own charge."""
        key = _key(change.namespace, change.name)
        if change.kind is ChangeKind.DELETED:
            self._written.pop(key, None)
            self.queue.add(key)
        else:
            self._enqueue(key, background=True)

    def resync_keys(self) -> list[str]:
        """Every applied object there is or should be, sorted: the full resync hands them out
        in this order, spread over its period, so each comes at the same point of every
        round."""
        keys = {_key(ns, name) for ns, name in self._applied_keys()}
        namespaces = list(self.namespaces.names_in(""))
        for cq in self.cluster_quotas.in_namespace(""):
            name = cluster.name_of(cq)
            keys.update(_key(ns, name) for ns in namespaces if self.selects(cq, ns))
        return sorted(keys)

    def _applied_keys(self) -> list[tuple[str, str]]:
        return [
            (ns, name) for ns in self.applied.namespaces() for name in self.applied.names_in(ns)
        ]

    def _holding(self, name: str) -> list[str]:
        return [ns for ns, held in self._applied_keys() if held == name]

    # -- sync

    def desired(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The object that should be in ``namespace`` for the ClusterQuota ``name``; None when
        it does not exist or does not select the namespace (or the namespace is gone)."""
        cq = self.cluster_quotas.get("", name)
        if cq is None or self.namespaces.get("", namespace) is None or not self.manages(namespace):
            return None
        if self.newest is not None:
            cq = self.newest(cq)
        if not self.selects(cq, namespace):
            return None
        return applied_object(cq, namespace, self._index_of(cq))

    def _index_of(self, cq: Obj) -> Mapping[str, Any]:
        """``cq``'s namespace index, made once per version of it (uid and resourceVersion):
        every namespace it selects is synced against the same version."""
        metadata = cq.get("metadata") or {}
        version = (str(metadata.get("uid") or ""), str(metadata.get("resourceVersion") or ""))
        name = cluster.name_of(cq)
        kept = self._indexes.get(name)
        if kept is not None and version[1] and kept[0] == version:
            return kept[1]
        index = cluster.namespace_index(cq)
        self._indexes[name] = (version, index)
        return index

    async def _sync_key(self, key: str) -> None:
        await self._sync_once(key, self.queue)

    async def _sync_background(self, key: str) -> None:
        await self._sync_once(key, self.background)

    async def _sync_once(self, key: str, queue: RateLimitingQueue[str]) -> None:
        if key in self._busy:
            queue.add_after(key, BUSY_RETRY_S)  # the other pool has it: look again after
            return
        self._busy.add(key)
        namespace, _, name = key.partition("/")
        synced = self._synced_since_move.get(name)
        if synced is not None:
            synced.add(namespace)  # before it reads the ClusterQuota
        try:
            await self._sync(key)
        finally:
            self._busy.discard(key)

    async def _sync(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        existing = self.applied.get(namespace, name)
        desired = self.desired(namespace, name)
        if desired is None:
            if existing is not None and owned_by_a_cluster_quota(existing) is not None:
                await self._write(key, lambda: self.writer.delete(existing))
                self._written.pop(key, None)
            return
        if existing is None:
            await self._write(key, lambda: self.writer.create(desired))
        elif not shows_the_same(existing, desired):
            try:
                await self._write(key, lambda: self.writer.replace(existing, desired))
            except NotFound:
                self.queue.add(key)  # deleted meanwhile: created again at the next pass

    async def _write(self, key: str, write: Callable[[], Awaitable[None]]) -> None:
        if self._limiter is not None:
            await self._limiter.wait()
        self._written[key] = self._clock()
        await write()

    # -- running

    def start(self) -> None:
        self._pool.start()
        self._background_pool.start()
        self._resync.start()

    async def stop(self, grace_period: float = DEFAULT_STOP_TIMEOUT) -> None:
        await self._resync.stop()
        await self._pool.stop(grace_period=grace_period)
        await self._background_pool.stop(grace_period=grace_period)
