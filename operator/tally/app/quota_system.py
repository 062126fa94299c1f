"""The quota side of one tally process, built and wired: what kube-controller-manager's
ResourceQuota controller and the API server's quota admission plugin are upstream, and tally's
ClusterQuotas beside them.

It builds the charge ledger and its verifier, the quota accessor (admission's reads and
compare-and-swap writes), both usage controllers, admission, the dynamic ``count/`` kinds and
the ClusterQuota measures, and wires each collaborator's callbacks at construction: the
informers' handlers (routing and replenishment), the ledger's recalculations, admission's
lanes. :class:`~tally.app.runtime.Runtime` starts and stops it with the rest of the process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from kubernetes_asyncio import client

from tally.admission.config import load_configuration
from tally.admission.evaluator import QuotaEvaluator
from tally.app.kinds import (
    APPLIED_CLUSTER_QUOTAS,
    CLUSTER_QUOTAS,
    NAMESPACES,
    OWN_KINDS,
    PODSETS,
    RESOURCE_QUOTAS,
    TRACKED_CORE_KINDS,
)
from tally.app.metrics import Metrics
from tally.app.serving import WebhookServing
from tally.app.settings import Settings
from tally.builtin_quota import decision as builtin_quota
from tally.builtin_quota import probe as builtin_quota_probe
from tally.charges import ChargeLedger
from tally.charges.own_writes import OwnWrites
from tally.clusterquota import applied
from tally.clusterquota import quota as cluster_quota
from tally.clusterquota.admission import ClusterQuotaBinding
from tally.clusterquota.applied import AppliedQuotaController
from tally.clusterquota.controller import ClusterQuotaController
from tally.clusterquota.measures import MeasureCatalog
from tally.clusterquota.routing import ClusterQuotaEvents
from tally.evaluators.base import GroupResource
from tally.evaluators.registry import Registry
from tally.kube import cluster_quotas
from tally.kube.applied_quotas import KubeAppliedQuotaWriter
from tally.kube.charge_verifier import KubeChargeVerifier
from tally.kube.cluster_quotas import KubeClusterQuotaWriter
from tally.kube.events import WarningRecorder
from tally.kube.informers import KubeInformers
from tally.kube.quota_accessor import KubeQuotaAccessor
from tally.machinery.cache import Change, Store
from tally.quota.identity import CLUSTER_QUOTA_KIND, QuotaKey, cluster_quota_of
from tally.resourcequota.controller import ResourceQuotaController
from tally.resourcequota.monitor import DynamicKinds
from tally.resourcequota.replenishment import replenisher
from tally.resourcequota.reporting import EVENT_COMPONENT
from tally.resourcequota.routing import QuotaEvents

logger = logging.getLogger(__name__)

CLUSTER_QUOTA_LANE: Final = "*clusterquotas"
"""Admission's lane for every namespace a ClusterQuota selects ("*": no namespace name)."""
ADMISSION_TIMEOUT_S: Final = 9.5
"""Under the webhook's 10 s ``timeoutSeconds``, so that the API server gets admission's answer
(upstream's words, 500) rather than giving up and applying the failure policy."""


class QuotaSystem:
    """Usage controllers, admission, charges and the dynamic kinds, over shared caches."""

    def __init__(
        self,
        settings: Settings,
        api: client.ApiClient,
        *,
        dedicated_api: client.ApiClient,
        watch_api: client.ApiClient,
        registry: Registry,
        metrics: Metrics,
        caches: KubeInformers,
        serving: WebhookServing,
        may_report: Callable[[], bool],
    ) -> None:
        """``api``/``dedicated_api``/``watch_api``: as :class:`~tally.app.runtime.Runtime`
        takes them; ``may_report``: whether this replica leads (posts the dynamic kinds'
        Events)."""
        self.registry = registry
        self.metrics = metrics
        self.caches = caches
        self.serving = serving
        informers = caches.informers
        # Creations there pass no tally webhook: their quotas are recalculated instead.
        self._exempt = frozenset(settings.webhook_exempt_namespaces)
        # ClusterQuota measures: compiled once, registered as the measured kinds' evaluators.
        # The kinds tally always watches keep compact projections, and resource claims have
        # their own evaluator: not measurable.
        self.measures = MeasureCatalog(
            unmeasurable={
                RESOURCE_QUOTAS, *TRACKED_CORE_KINDS, PODSETS, CLUSTER_QUOTAS, NAMESPACES,
                *(e.group_resource for e in registry.list()),
            }
        )  # fmt: skip
        self.quotas: Store[Any] = informers[RESOURCE_QUOTAS].store
        self.cluster_quotas: Store[Any] = informers[CLUSTER_QUOTAS].store
        # One mapping shared by the controller (read at every sync), the charge verifier and
        # the dynamic kinds (which add and remove the stores of count/ resources at run time).
        # Quotas count quotas too (``resourcequotas``, ``count/resourcequotas``).
        self.stores: dict[GroupResource, Store[Any]] = {
            gr: informers[gr].store for gr in (RESOURCE_QUOTAS, *TRACKED_CORE_KINDS, PODSETS)
        }
        # Asks the API, past a charge's deadline, whether its object was stored; on the
        # dedicated client, so that no question waits behind the controllers' requests.
        self.charge_verifier = KubeChargeVerifier(
            dedicated_api,
            timeout=settings.charge_confirm_timeout,
            version_of=self._served_version,
            stores=self.stores,
        )
        # Admission's charges until their objects reach the caches (confirmed) or the timeout
        # passes (released: the quotas are recalculated). Every replica keeps its own.
        self.charges = ChargeLedger(
            settings.charge_confirm_timeout,
            metrics=metrics,
            recalculate=self._recalculate,
            verify=self.charge_verifier.verify,
        )
        metrics.watch_charges(self.charges.oldest_age)
        # Other replicas' raises are held (with leader election) as their charges.
        self.own_writes = OwnWrites(self.charges if settings.leader_election else None)
        self.cluster_quota_writer = KubeClusterQuotaWriter(
            dedicated_api, tracker=self.own_writes, controller_api=api
        )
        self.cluster_controller = ClusterQuotaController(
            registry,
            self.cluster_quotas,
            informers[NAMESPACES].store,
            self.stores,
            self.cluster_quota_writer,
            workers=settings.workers,
            resync_period=settings.resync_period,
            charges=self.charges,
            newest=self.cluster_quota_writer.newest,
            metrics_provider=metrics.workqueue,
            observer=metrics,
            admission_ready=serving.rules_current,
            recorder=WarningRecorder(
                api,
                kind=CLUSTER_QUOTA_KIND,
                api_version=f"{cluster_quotas.GROUP}/{cluster_quotas.VERSION}",
                component=EVENT_COMPONENT,
            ),
            namespace_recorder=WarningRecorder(
                api,
                kind=applied.KIND,
                api_version=f"{applied.GROUP}/{applied.VERSION}",
                component=EVENT_COMPONENT,
            ),
        )
        # What the people of each selected namespace may read of a ClusterQuota.
        self.applied_controller = AppliedQuotaController(
            self.cluster_quotas,
            informers[NAMESPACES].store,
            informers[APPLIED_CLUSTER_QUOTAS].store,
            KubeAppliedQuotaWriter(api, applied.GROUP, applied.VERSION, applied.PLURAL),
            self.cluster_controller.selects,
            newest=self.cluster_quota_writer.newest,
            min_interval=settings.applied_quota_interval,
            qps=settings.applied_quota_qps,
            resync_period=settings.resync_period,
            metrics_provider=metrics.workqueue,
            manages=lambda namespace: (
                not settings.watched_namespaces or namespace in settings.watched_namespaces
            ),
        )
        self._applied_quotas = settings.applied_quotas
        self.accessor = KubeQuotaAccessor(
            self.quotas,
            dedicated_api,
            # Admission judges the ClusterQuotas selecting a namespace beside its own quotas.
            cluster_quotas=ClusterQuotaBinding(
                self.cluster_controller, self.cluster_quotas, self.cluster_quota_writer
            ),
            controller_api=api,
            writes=self.own_writes,
        )
        self.controller = ResourceQuotaController(
            registry,
            self.quotas,
            self.stores,
            self.accessor,
            workers=settings.workers,
            missing_usage_workers=settings.missing_usage_workers,
            resync_period=settings.resync_period,
            metrics_provider=metrics.workqueue,
            observer=metrics,
            charges=self.charges,
            newest=self.accessor.newest,
        )
        self.admission = QuotaEvaluator(
            self.accessor,
            registry,
            load_configuration(settings.admission_config),
            workers=settings.admission_workers,
            timeout=ADMISSION_TIMEOUT_S,
            metrics=metrics,
            charges=self.charges,
            lane_of=self._admission_lane,
        )
        self.dynamic = DynamicKinds(
            api,
            registry,
            self.quota_specs,
            self.stores,
            watched={RESOURCE_QUOTAS, *TRACKED_CORE_KINDS, PODSETS},
            replenish=self._replenish,
            creations_charged=self.creations_charged,
            charges=self.charges,
            on_kind_synced=self._count_kind_synced,
            may_report=may_report,
            watch_api=watch_api,
        )
        metrics.watch_uncounted(
            lambda: {str(gr): problem.reason for gr, problem in self.dynamic.problems.items()}
        )
        self._wire_handlers()

    @property
    def enforces_resource_quotas(self) -> bool:
        """False where the cluster's own quota system is on: ClusterQuotas only (decided by the
        start-up probe, before anything starts)."""
        return self.admission.charges_resource_quotas

    def controllers(
        self,
    ) -> list[ResourceQuotaController | ClusterQuotaController | AppliedQuotaController]:
        """The usage controllers to run while leading, and the applied view's."""
        return [
            *([self.controller] if self.enforces_resource_quotas else []),
            self.cluster_controller,
            *([self.applied_controller] if self._applied_quotas else []),
        ]

    def unfinished_syncs(self) -> int:
        """Quotas and ClusterQuotas queued or being synced by the controllers that run (not
        the applied view's, whose writes are paced on purpose)."""
        return sum(
            controller.unfinished()
            for controller in self.controllers()
            if not isinstance(controller, AppliedQuotaController)
        )

    def _wire_handlers(self) -> None:
        informers = self.caches.informers
        informers[RESOURCE_QUOTAS].add_handler(
            QuotaEvents(
                self.controller,
                charges=self.charges,
                writes=self.own_writes,
                observer=self.metrics,
                enforcing=lambda: self.enforces_resource_quotas,
                # Quotas count quotas too (``count/resourcequotas``): after the controller.
                replenish=self._replenisher(RESOURCE_QUOTAS),
                names_changed=self._quota_names_changed,
            )
        )
        for gr in (*TRACKED_CORE_KINDS, PODSETS):
            informers[gr].add_handler(self._replenisher(gr))
        informers[CLUSTER_QUOTAS].add_handler(
            ClusterQuotaEvents(
                self.cluster_controller,
                writes=self.own_writes,
                observer=self.metrics,
                measures_changed=self.refresh_measures,
                names_changed=self._quota_names_changed,
            )
        )
        informers[NAMESPACES].add_handler(self.cluster_controller.on_namespace)
        if self._applied_quotas:
            # After the ClusterQuota controller's handlers: its selectors are current.
            informers[CLUSTER_QUOTAS].add_handler(self.applied_controller.on_cluster_quota)
            informers[NAMESPACES].add_handler(self.applied_controller.on_namespace)
            informers[APPLIED_CLUSTER_QUOTAS].add_handler(self.applied_controller.on_applied)

    # -- callbacks the collaborators were given

    def _quota_names_changed(self) -> None:
        """The resources some quota names may have changed: the dynamic ``count/`` kinds and
        the webhook rules follow. Not on a write of usage alone (admission makes many; each
        would have both look through every quota again)."""
        self.dynamic.poke()
        self.serving.quotas_changed()

    def _admission_lane(self, namespace: str) -> str:
        """Quota admission's pass for ``namespace``'s requests: its own, or the one shared by
        every namespace a ClusterQuota selects (a name no namespace can have)."""
        return CLUSTER_QUOTA_LANE if self.cluster_controller.selecting(namespace) else namespace

    def _replenish(
        self, group_resource: GroupResource, namespace: str, *, unsynced_only: bool = False
    ) -> None:
        """Usage in ``namespace`` may have changed: both controllers' replenishment."""
        self.controller.replenish(group_resource, namespace, unsynced_only=unsynced_only)
        self.cluster_controller.replenish(group_resource, namespace, unsynced_only=unsynced_only)

    def _replenisher(self, gr: GroupResource) -> Callable[[Change[Any]], None]:
        return replenisher(
            self._replenish,
            gr,
            self.registry.get(gr),
            self.caches.informers[gr].store,
            creations_charged=self.creations_charged,
            charges=self.charges,
        )

    def _served_version(self, gr: GroupResource) -> str | None:
        """The API version tally reads ``gr`` at (core kinds: v1); None for a kind no longer
        watched."""
        if not gr.group:
            return "v1"
        if gr in OWN_KINDS:
            return OWN_KINDS[gr]
        return self.dynamic.version(gr)

    def _recalculate(self, keys: Iterable[QuotaKey]) -> None:
        """Quotas whose held charges were released (or whose late object arrived)."""
        for key in keys:
            name = cluster_quota_of(key)
            if name is None:
                self.controller.queue.add(key)
            else:
                self.cluster_controller.recalculate(name, key.namespace)

    def _count_kind_synced(self, gr: GroupResource) -> None:
        """A dynamic kind's cache is ready: recalculate the quotas that name it."""
        self.controller.enqueue_naming(gr)
        self.cluster_controller.enqueue_naming(gr)

    def refresh_measures(self) -> None:
        """The measured kinds' evaluators follow the ClusterQuotas; a changed kind is watched
        again."""
        for gr in self.measures.refresh(self.cluster_quotas.in_namespace(""), self.registry):
            self.dynamic.evaluator_changed(gr)

    def quota_specs(self) -> list[Any]:
        """Every ResourceQuota, and every ClusterQuota as a ResourceQuota-shaped view: what the
        webhook rules and the dynamic ``count/`` kinds follow."""
        quotas, cqs = self.quotas, self.cluster_quotas.in_namespace("")
        return [
            *(
                (q for ns in quotas.namespaces() for q in quotas.in_namespace(ns))
                if self.enforces_resource_quotas
                else ()
            ),
            *(cluster_quota.as_resource_quota(cq, "") for cq in cqs),
        ]

    def creations_charged(self, gr: GroupResource, namespace: str) -> bool:
        """Whether quota admission charges creations of ``gr`` in ``namespace`` now (the
        webhook is registered with a rule for it, long enough for the API server to apply it,
        and does not exempt the namespace). Where it does not — before registration, with
        ``TALLY_WEBHOOK_ENABLED=false``, a ``count/`` rule just added, an exempt namespace —
        the quota controller recalculates on every creation, or usage would miss those objects
        until the next full resync and admission would let more in."""
        return namespace not in self._exempt and self.serving.charges_creations(gr)

    # -- lifecycle

    async def check_builtin_quota(self, api: client.ApiClient, settings: Settings) -> None:
        """Leave ResourceQuotas to upstream's own quota system where it is on."""
        decision = await builtin_quota_probe.check(
            api, settings.namespace, allowed=settings.allow_builtin_quota
        )
        if decision.action is builtin_quota.Action.CLUSTER_QUOTAS_ONLY:
            self.admission.charges_resource_quotas = False
        self.metrics.enforcing(resource_quotas=self.enforces_resource_quotas)

    def start(self) -> None:
        """From synced caches: the measures, the dynamic kinds, the ledger and admission."""
        self.refresh_measures()
        self.dynamic.start()
        self.charges.start()
        self.admission.start()

    async def stop(self, within: Callable[[], float]) -> None:
        """Admission finishes what it has (``within()`` seconds at most), then the rest."""
        await self.admission.stop(grace_period=within())
        self.charges.stop()
        await self.charge_verifier.stop()
        await self.dynamic.stop()
