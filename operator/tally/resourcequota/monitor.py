"""Dynamic kinds: watch every resource that quotas count by ``count/<resource>.<group>``, or
measure through a registered evaluator of a kind not watched elsewhere (resource claims);
upstream's ``QuotaMonitor`` (``resource_quota_monitor.go``: ``SyncMonitors``, ``StartMonitors``,
``IsSynced``).

Upstream's quota controller re-runs API discovery every 30 s (``--resource-quota-sync-period``'s
sibling, the discovery period in ``resource_quota_controller.go`` ``Sync``) and starts a
monitor for every resource that supports create, list, watch and delete, so that
``count/<crd plural>.<group>`` starts being counted within about 30 s of the CRD appearing.

:class:`DynamicKinds` does the same for the resources that some quota actually names (upstream
watches every quotable resource in the cluster; tally watches only what is counted, which is
most often nothing — a deliberate difference, for memory). Every ``period`` seconds, and soon
after :meth:`DynamicKinds.poke` (call it when quotas change), it:

1. computes the group/resources named as ``count/<r>[.<g>]`` in any quota's ``spec.hard`` or
   ``status.hard``, or by a name a registered evaluator of an unwatched kind measures
   (``gold.deviceclass.resource.k8s.io/devices``; :func:`named_resources`), minus the kinds
   already watched elsewhere (a constructor argument: the core kinds Kopf feeds) and upstream's
   ignored resources;
2. resolves each new one through discovery
   (:class:`tally.resourcequota.discovery.Discovery`): it must exist, be namespaced, and
   support list, watch, create and delete;
3. starts a :class:`~tally.kube.reflector.Reflector` for it, whose informer replenishes quotas on
   deletes; once the first LIST reconciled the store, registers an
   :class:`~tally.evaluators.generic.ObjectCountEvaluator` in the :class:`Registry`, adds the
   store to the controller's ``stores`` and calls ``on_kind_synced(gr)`` (the caller enqueues
   the quotas naming it, as upstream's resync does). Registering only after the first LIST
   keeps the controller from writing a usage of 0 computed from an empty store;
4. stops, unregisters and forgets kinds no quota names any more, and — on the periodic pass,
   or at once when a reflector gets 403/404 — kinds that disappeared (CRD deleted) or became
   forbidden.

A named resource that is missing, forbidden or not quotable is *reported*, never fatal
(:class:`tally.resourcequota.reporting.ProblemReporter`: a log line per resource, a Warning
Event per quota naming it). Problems are retried every period, so a CRD created after its
quota is picked up within one period.

A poke (a quota added, deleted, or naming other resources) recomputes only the set of names
and talks to discovery only when that set gained a resource. Transient discovery failures (5xx,
connection) change nothing and are retried at the next period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import (
    Callable,
    Collection,
    Iterable,
    Mapping,
    MutableMapping,
)
from dataclasses import dataclass
from typing import Any, Final

from kubernetes_asyncio import client

from tally.charges import ChargeLedger
from tally.evaluators.base import Evaluator, GroupResource
from tally.evaluators.generic import ObjectCountEvaluator
from tally.evaluators.registry import Registry, kinds_named
from tally.kube import rest
from tally.kube.events import WarningRecorder
from tally.kube.reflector import KubeListWatch, Reflector, StatusError
from tally.machinery.cache import Store
from tally.quota.resources import hard_names
from tally.resourcequota.discovery import (
    DiscoveredResource,
    Discovery,
    DiscoveryError,
    Fetch,
    problem_for_failure,
)
from tally.resourcequota.replenishment import Replenish, replenisher
from tally.resourcequota.reporting import (
    EVENT_COMPONENT,
    REASON_FAILED_LIST,
    EventRecorder,
    Problem,
    ProblemReporter,
)
from tally.workqueue import start_watched
from tally.workqueue.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

Obj = Mapping[str, Any]


DISCOVERY_PERIOD_S: Final = 30.0
"""Upstream's quota controller re-discovers resources every 30 s: the longest a CRD created
after its quota waits to be counted, and a deleted one to be reported."""
POKE_DEBOUNCE_S: Final = 0.1
"""Quota events come in bursts (the controller writes many statuses at once); one pass each."""


# -- pure: which resources quotas name


def named_resources(
    quotas: Iterable[Obj],
    *,
    exclude: Collection[GroupResource] = (),
    is_ignored: Callable[[GroupResource], bool] = lambda gr: False,
    evaluators: Iterable[Evaluator] = (),
) -> dict[GroupResource, list[Obj]]:
    """Group/resources named by any quota's ``spec.hard`` or ``status.hard``, each with the
    quotas naming it (in the order given), minus ``exclude`` and ignored ones.

    A quota names a resource by ``count/<r>[.<g>]``, or by any name that one of ``evaluators``
    (the registered ones) measures: ``gold.deviceclass.resource.k8s.io/devices`` names
    ``resourceclaims.resource.k8s.io``, whose evaluator needs its claims watched.

    ``status.hard`` counts too: a quota whose spec dropped a name still shows it in status until
    the controller's next write, and upstream keeps monitoring what status names.
    """
    registered = list(evaluators)

    def named_by(sections: tuple[tuple[str, ...] | None, ...]) -> tuple[GroupResource, ...]:
        named = kinds_named(
            sections, registered, keep=lambda gr: gr not in exclude and not is_ignored(gr)
        )
        return tuple(sorted(named))

    # Quotas mostly share their names (a template per team, per tier): each set of names is
    # looked up once. A pass follows every burst of quota writes that changes names, and one
    # over 3 000 quotas took 0.14 s of the event loop name by name.
    by_names: dict[tuple[tuple[str, ...] | None, ...], tuple[GroupResource, ...]] = {}
    found: dict[GroupResource, list[Obj]] = {}
    for quota_obj in quotas:
        sections = hard_names(quota_obj)
        named = by_names.get(sections)
        if named is None:
            named = by_names[sections] = named_by(sections)
        for gr in named:
            found.setdefault(gr, []).append(quota_obj)
    return found


# -- the manager


@dataclass
class _Kind:
    """One dynamically watched resource."""

    resource: DiscoveredResource
    reflector: Reflector
    evaluator: Evaluator
    owns_evaluator: bool
    """False when the registry already had an evaluator for the resource (PodSet's, …): it is
    used, never removed."""
    registered: bool = False
    """The first LIST is done; evaluator and store are visible to the controller."""
    failure: Problem | None = None
    """Set by the reflector's fatal callback; the next pass drops the kind."""
    trouble: Problem | None = None
    """Set while the reflector's LISTs keep failing (it retries): reported, never dropped."""


class DynamicKinds:
    """Discovers, watches and counts the ``count/`` resources quotas name (see module doc).

    The lead wiring builds it with the registry, a quota source, the controller's ``stores``
    dict (mutated in place: kinds are added after their first LIST and removed when dropped),
    the group/resources already watched elsewhere, and the controller's ``replenish``.
    """

    def __init__(
        self,
        api: client.ApiClient,
        registry: Registry,
        quotas: Callable[[], Iterable[Obj]],
        stores: MutableMapping[GroupResource, Store[Any]],
        *,
        watched: Collection[GroupResource],
        replenish: Replenish,
        creations_charged: Callable[[GroupResource, str], bool] = lambda _gr, _ns: False,
        charges: ChargeLedger | None = None,
        on_kind_synced: Callable[[GroupResource], None] | None = None,
        period: float = DISCOVERY_PERIOD_S,
        recorder: EventRecorder | None = None,
        fetch: Fetch | None = None,
        reflector_factory: Callable[..., Reflector] | None = None,
        may_report: Callable[[], bool] = lambda: True,
        watch_api: client.ApiClient | None = None,
    ) -> None:
        """``may_report``: whether Events may be posted now. With leader election only the
        leader posts them (every replica watches and logs); a replica that becomes leader
        posts what is still untold at its next pass (poke it). ``watch_api`` (default:
        ``api``): the reflectors' client, whose connections no request limit may hold back
        (a watch keeps its connection for minutes)."""
        self._api = api
        self._watch_api = watch_api or api
        self.registry = registry
        self._quotas = quotas
        self.stores = stores
        self.watched = frozenset(watched)
        """Kinds fed elsewhere (Kopf): never started here even when a quota counts them."""
        self._replenish = replenish
        self._creations_charged = creations_charged
        self._charges = charges
        self._on_kind_synced = on_kind_synced
        self.period = period
        self._fetch: Fetch = fetch or self._get_json
        self._reflector_factory = reflector_factory or Reflector
        self._kinds: dict[GroupResource, _Kind] = {}
        """Invariant: a kind is in ``stores`` and (if owned) in the registry only while it is
        here with ``registered`` set."""
        self.problems: dict[GroupResource, Problem] = {}
        """Named resources that are not counted, and why (as of the last pass)."""
        self._failures: dict[GroupResource, Problem] = {}
        """Kinds whose reflector gave up (403/404) and has not synced since. Discovery may
        still list them (RBAC forbids the watch, not discovery): they are retried every period
        but stay reported until a LIST succeeds."""
        self._reports = ProblemReporter(
            recorder
            or WarningRecorder(
                api, kind="ResourceQuota", api_version="v1", component=EVENT_COMPONENT
            ),
            may_report,
        )
        self._named: frozenset[GroupResource] = frozenset()
        """The set of named resources at the last pass (a poke that leaves it alone is cheap)."""
        self._stale: set[GroupResource] = set()
        """Kinds to watch again with the registry's current evaluator (evaluator_changed)."""
        self._poked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- what callers read

    @property
    def active(self) -> frozenset[GroupResource]:
        """Kinds with a running reflector (registered or still listing)."""
        return frozenset(self._kinds)

    @property
    def running(self) -> bool:
        """The manager task is alive (it only ends on :meth:`stop`)."""
        return self._task is not None and not self._task.done()

    def reflector(self, gr: GroupResource) -> Reflector | None:
        kind = self._kinds.get(gr)
        return kind.reflector if kind is not None else None

    def version(self, gr: GroupResource) -> str | None:
        """The API version ``gr`` is watched at; None when it is not watched."""
        kind = self._kinds.get(gr)
        return kind.resource.version if kind is not None else None

    # -- lifecycle

    def start(self) -> None:
        """Run passes: one now, then every ``period`` seconds and after each :meth:`poke`."""
        if self._task is not None and not self._task.done():
            return
        self._task = start_watched(
            self._run(),
            name="dynamic-kinds",
            logger=logger,
            died="dynamic kinds: manager died; count/ kinds are no longer discovered",
            ended="dynamic kinds: manager ended unexpectedly",
        )

    def evaluator_changed(self, gr: GroupResource) -> None:
        """The registry's evaluator for ``gr`` was replaced or removed (a ClusterQuota's
        measures changed): its watch restarts at the next pass, so that its cache keeps what
        the current evaluator reads and its handlers ask the current evaluator."""
        self._stale.add(gr)
        self.poke()

    def poke(self) -> None:
        """Quotas changed: re-check which resources they name (debounced, non-blocking)."""
        self._poked.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            await cancel_and_wait(task)
        for gr in list(self._kinds):
            await self._drop(gr)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_full = loop.time()
        while True:
            full = loop.time() >= next_full
            if full:
                next_full = loop.time() + self.period
            try:
                await self.refresh(full=full)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("dynamic kinds: pass failed; retrying at the next one")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), max(0.0, next_full - loop.time()))
                await asyncio.sleep(POKE_DEBOUNCE_S)
            self._poked.clear()

    # -- one pass

    async def refresh(self, *, full: bool = True) -> None:
        """One pass (module docstring, steps 1-4). ``full`` re-checks every named resource
        through discovery; otherwise only new names are resolved."""
        wanted = named_resources(
            self._quotas(),
            exclude=self.watched,
            is_ignored=self.registry.is_ignored,
            evaluators=self.registry.list(),
        )
        named = frozenset(wanted)
        changed = named != self._named
        self._named = named

        # Kinds whose reflector gave up (403/404): drop now, report below.
        for gr, kind in list(self._kinds.items()):
            if kind.failure is not None:
                self.problems[gr] = self._failures[gr] = kind.failure
                await self._drop(gr)
        # Kinds whose evaluator changed: watched again below, with the current one.
        stale, self._stale = self._stale, set()
        for gr in sorted(stale):
            await self._drop(gr)
        # Kinds nobody counts any more.
        for gr in list(self._kinds):
            if gr not in wanted:
                logger.info("dynamic kinds: %s is no longer counted by any quota; unwatched", gr)
                await self._drop(gr)
        for problems in (self.problems, self._failures):
            for gr in list(problems):
                if gr not in wanted:
                    del problems[gr]

        if full:
            to_resolve = set(wanted)
        elif changed or stale:
            to_resolve = set(wanted) - set(self._kinds) - set(self.problems)
        else:
            to_resolve = set()
        if to_resolve:
            discovery = Discovery(self._fetch)
            for gr in sorted(to_resolve):
                try:
                    result = await discovery.resolve(gr)
                except DiscoveryError as error:
                    logger.warning("dynamic kinds: discovery of %s failed (%s); later", gr, error)
                    continue
                await self._apply(gr, result)

        # Kinds whose LISTs keep failing: still watched (retried), reported meanwhile.
        for gr, kind in self._kinds.items():
            if kind.trouble is not None:
                self.problems[gr] = kind.trouble
        self._reports.forget(self.problems, wanted)
        await self._reports.report(self.problems, wanted)

    async def _apply(self, gr: GroupResource, result: DiscoveredResource | Problem) -> None:
        kind = self._kinds.get(gr)
        if isinstance(result, Problem):
            self.problems[gr] = result
            if kind is not None:
                await self._drop(gr)
            return
        if gr not in self._failures:
            self.problems.pop(gr, None)
        if kind is not None and kind.resource.version == result.version:
            return
        if kind is not None:
            logger.info("dynamic kinds: %s moved to version %s", gr, result.version)
            await self._drop(gr)
        self._start_kind(result)

    def _start_kind(self, resource: DiscoveredResource) -> None:
        gr = resource.group_resource
        existing = self.registry.get(gr)
        evaluator: Evaluator = existing or ObjectCountEvaluator(gr)
        store: Store[Any] = Store(evaluator.project, name=str(gr))
        kind: _Kind | None = None

        def on_synced() -> None:
            assert kind is not None
            self._register(kind)

        def on_failure(error: StatusError) -> None:
            assert kind is not None
            kind.failure = problem_for_failure(gr, error)
            self.poke()

        def on_list_trouble(error: Exception | None) -> None:
            assert kind is not None
            if error is None:
                kind.trouble = None
                if self.problems.get(gr) is not None and self.problems[gr].reason == (
                    REASON_FAILED_LIST
                ):
                    del self.problems[gr]
            else:
                kind.trouble = Problem(REASON_FAILED_LIST, f"listing it fails: {error}")
            self.poke()

        reflector = self._reflector_factory(
            KubeListWatch(self._watch_api, resource.ref),
            store,
            name=str(gr),
            on_synced=on_synced,
            on_failure=on_failure,
            on_list_trouble=on_list_trouble,
        )
        reflector.informer.add_handler(
            replenisher(
                self._replenish,
                gr,
                evaluator,
                store,
                creations_charged=self._creations_charged,
                charges=self._charges,
            )
        )
        kind = _Kind(resource, reflector, evaluator, owns_evaluator=existing is None)
        self._kinds[gr] = kind
        logger.info("dynamic kinds: watching %s (version %s)", gr, resource.version)
        reflector.start()

    def _register(self, kind: _Kind) -> None:
        gr = kind.resource.group_resource
        if self._kinds.get(gr) is not kind:
            return  # dropped while listing
        if kind.owns_evaluator:
            self.registry.register(kind.evaluator)
        self.stores[gr] = kind.reflector.informer.store
        kind.registered = True
        self._failures.pop(gr, None)
        self.problems.pop(gr, None)
        logger.info("dynamic kinds: %s synced (%d objects)", gr, len(kind.reflector.informer.store))
        if self._on_kind_synced is not None:
            self._on_kind_synced(gr)

    async def _drop(self, gr: GroupResource) -> None:
        kind = self._kinds.pop(gr, None)
        if kind is None:
            return
        store = kind.reflector.informer.store
        if self.stores.get(gr) is store:
            del self.stores[gr]
        if kind.owns_evaluator and self.registry.get(gr) is kind.evaluator:
            self.registry.remove(gr)
        await kind.reflector.stop()

    async def _get_json(self, path: str) -> Obj:
        try:
            return await rest.get_json(self._api, path)
        except client.ApiException as error:
            raise StatusError(int(error.status or 0), str(error.reason or "")) from error
