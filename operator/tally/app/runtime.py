"""Everything one tally process runs, built from settings and an API client, in start order.

:class:`Runtime` is what :mod:`tally.app.handlers` (Kopf's start-up, clean-up and event
callbacks) talks to. ``start`` LISTs every tracked kind (the synced point) while the built-in
quota probe checks that upstream's own quota system is off
(:mod:`tally.builtin_quota.decision`), then starts the quota side
(:meth:`QuotaSystem.start <tally.app.quota_system.QuotaSystem.start>`: measures, dynamic kinds,
charges, admission) and the webhook server, and then *leads*: starts both usage controllers,
the PodSet controller and the webhook registration; ``stop`` undoes it in reverse. The event
entry point (``on_event``) and the admission entry point (``admit``) are plain coroutines, so
the Kopf layer stays a few lines of translation.

The quota side is built in :mod:`tally.app.quota_system`; leading (what runs once in the
cluster, and the Lease that decides where) is :mod:`tally.app.leading`'s; serving the
webhooks, :mod:`tally.app.serving`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from aiohttp import web
from kubernetes_asyncio import client

from tally.admission.attributes import Attributes
from tally.app.heap import (
    collector_paused,
    freeze_long_lived,
    full_collections_rarely,
    heap_trimmer,
)
from tally.app.kinds import (
    APPLIED_CLUSTER_QUOTAS,
    CLUSTER_QUOTAS,
    CLUSTER_SCOPED,
    NAMESPACES,
    OWN_KINDS,
    PODS,
    PODSETS,
    RESOURCE_QUOTAS,
    SECRETS,
    TRACKED_CORE_KINDS,
)
from tally.app.leading import Leading
from tally.app.metrics import Metrics
from tally.app.quota_system import QuotaSystem
from tally.app.readiness import Readiness, ReadinessEndpoint
from tally.app.serving import WebhookServing
from tally.app.settings import Settings
from tally.clusterquota.controller import namespace_labels
from tally.evaluators.base import GroupResource, Reprojecting
from tally.evaluators.podsets import PodSetEvaluator
from tally.evaluators.registry import Registry, new_registry
from tally.kube import rest
from tally.kube.access_reviews import KubeAccessReviewer
from tally.kube.informers import KubeInformers
from tally.machinery import leaderelection
from tally.podset import client as podset_client
from tally.podset.controller import PodSetController, pod_view, reproject_pod_view
from tally.webhook.configuration import (
    CLUSTER_QUOTA_WEBHOOK_ID,
    PODSET_WEBHOOK_ID,
    QUOTA_WEBHOOK_ID,
)
from tally.webhook.podset_scale import ScaledPodSets
from tally.webhook.server import (
    clusterquota_review,
    podset_review,
    quota_review,
)
from tally.workqueue.tasks import cancel_and_wait, start_watched

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S: Final = 5.0
"""How long a stop waits for others in all: reviews and syncs in progress, and the API server
(the Lease released, the last Events written, the webhook configuration removed where
``TALLY_WEBHOOK_REMOVE_ON_EXIT`` says so). A graceful stop takes well under a second; with the
API server unreachable each of those would wait for its request's own timeout (a minute), and
a pod would be killed at the end of its termination grace (30 s, 5 of them the preStop sleep)
still holding its Lease."""

FIRST_PASS_LIMIT_S: Final = 60.0
"""The longest the leader's first pass holds Kopf's watches back (:meth:`Runtime._first_pass`):
at 150 000 pods and 10 000 quotas the pass is expected in well under that, and meanwhile the
caches stand still."""
FIRST_PASS_LEAD_WAIT_S: Final = 5.0
"""How long a replica waits to lead, unless it sees another holder first, before it lets Kopf's
watches begin (a cold start acquires a free Lease in milliseconds)."""
FIRST_PASS_POLL_S: Final = 0.1
LISTINGS_FREEZE_POLL_S: Final = 1.0
"""How often the start-up looks whether Kopf's first listings have all arrived, to freeze what
they left (:meth:`Runtime._freeze_after_listings`)."""


def _keep_whole(obj: Any) -> Any:
    """Quotas are few and small; the controller and admission need spec and status as read."""
    return obj


class Runtime:
    """tally's process-wide objects. Build with :meth:`start`; tear down with :meth:`stop`."""

    def __init__(
        self,
        settings: Settings,
        api: client.ApiClient,
        *,
        dedicated_api: client.ApiClient | None = None,
        watch_api: client.ApiClient | None = None,
        on_leadership_lost: Callable[[], None] | None = None,
        identity: str | None = None,
        streamed_lists: bool = False,
    ) -> None:
        """``api``: the controllers' requests (and the rest of tally's), through a pool of
        ``TALLY_API_CONNECTIONS`` (:func:`tally.kube.rest.make_api_client`). ``dedicated_api``
        (default: ``api``): a client without that limit, for what must never wait behind them:
        admission's reads and writes (a pod the PodSet controller creates waits for tally's webhook;
        were the webhook's status write queued behind that create's connection, both would wait out
        the webhook's timeout), the Lease's renewals (one queued behind a burst would lose the
        lease), the webhook configuration's writes. Admission needs no limit: its lanes bound what
        it has in flight. ``watch_api`` (default: ``dedicated_api``): the ``count/`` reflectors'
        lists and watches, outside the limit too (each watch holds a connection for minutes), on a
        client whose pool is never renewed (a watch lasts up to 10.5 minutes; the other two clients'
        pools are renewed every ``TALLY_API_POOL_RENEWAL_PERIOD``, and a retired pool is closed once
        its longest request must have ended).
        ``on_leadership_lost``: called once the controllers stopped after the lease was
        lost; it must end the process (the Kopf layer stops it gracefully).
        ``streamed_lists``: the API server streams a watch's initial state
        (:func:`tally.kube.rest.serves_watch_list`); the caches are then listed so."""
        self.settings = settings
        self.api = api
        self.dedicated_api = dedicated_api or api
        self.watch_api = watch_api or self.dedicated_api
        self.identity = identity or leaderelection.default_identity()
        self.registry: Registry = new_registry()
        self.metrics = Metrics()
        self.heap_trimmer = heap_trimmer(settings.heap_trim_period, self.metrics.heap_trimmed)
        renewed = [c for c in (self.api, self.dedicated_api) if c is not self.watch_api]
        self.pool_renewal = (
            rest.PoolRenewal(
                renewed,
                settings.api_pool_renewal_period,
                # The longest request through them: REQUEST_TIMEOUT_S, or a Lease renewal.
                grace=max(rest.REQUEST_TIMEOUT_S, settings.leader_election_renew_deadline / 2)
                + rest.KEEPALIVE_S,
            )
            if settings.api_pool_renewal_period and renewed
            else None
        )
        # count/podsets.tally.dev, and what PodSets will use (podsets.tally.dev/…): admission
        # charges creates, spec growth and scale writes.
        self.registry.register(PodSetEvaluator())
        self.caches = KubeInformers(
            api,
            versions=OWN_KINDS,
            cluster_scoped=CLUSTER_SCOPED,
            optional=frozenset(OWN_KINDS),
            namespaces=settings.watched_namespaces,
            streamed=streamed_lists,
        )
        self.informers = self.caches.informers
        self.caches.add(CLUSTER_QUOTAS, _keep_whole)
        self.caches.add(APPLIED_CLUSTER_QUOTAS, _keep_whole)
        self.caches.add(NAMESPACES, namespace_labels)
        for gr in (RESOURCE_QUOTAS, *TRACKED_CORE_KINDS, PODSETS):
            evaluator = self.registry.get(gr) if gr not in (RESOURCE_QUOTAS, PODSETS) else None
            self.caches.add(
                gr,
                evaluator.project if evaluator is not None else _keep_whole,
                evaluator.reproject if isinstance(evaluator, Reprojecting) else None,
            )
        # The PodSet controller keeps its own compact view of pods (labels, owners, lifecycle).
        self.pod_views = self.caches.add_view(
            PODS, "pods(podset)", pod_view, reproject=reproject_pod_view
        )
        self.serving = WebhookServing(
            settings, api, self.metrics, registration_api=self.dedicated_api
        )
        self.quota = QuotaSystem(
            settings,
            api,
            dedicated_api=self.dedicated_api,
            watch_api=self.watch_api,
            registry=self.registry,
            metrics=self.metrics,
            caches=self.caches,
            serving=self.serving,
            may_report=lambda: self.leadership.leading,
        )
        # One client-side budget for the PodSet controller's requests, its Events included
        # (upstream: one per controller client, which its Event sink shares); None = unlimited.
        limiter = podset_client.token_bucket(settings.podset_qps, settings.podset_burst)
        self.recorder = podset_client.KubeEventRecorder(api, limiter=limiter)
        self.podset_controller = PodSetController(
            self.informers[PODSETS].store,
            self.pod_views.store,
            podset_client.KubePodControl(api, limiter=limiter),
            podset_client.KubePodSetClient(api, limiter=limiter),
            self.recorder,
            workers=settings.workers,
            metrics_provider=self.metrics.workqueue,
        )
        self.scaled_podsets = ScaledPodSets(
            PODSETS,
            self.informers[PODSETS].store.get,
            podset_client.KubePodSetClient(self.dedicated_api).get_podset,
        )
        self.leadership = Leading(
            self.identity,
            self.metrics,
            controllers=lambda: [*self.quota.controllers(), self.podset_controller],
            all_controllers=[
                self.podset_controller,
                self.quota.controller,
                self.quota.cluster_controller,
                self.quota.applied_controller,
            ],
            registrar=lambda: self.serving.registrar,
            on_begun=self.quota.dynamic.poke,  # Events a follower only logged are posted now
            on_lost=on_leadership_lost,
        )
        self._metrics_runner: web.AppRunner | None = None
        self._first_pass_left: int | None = None
        """Syncs left in the leader's first pass (:meth:`_first_pass`), None outside it."""
        self._listings_freeze: asyncio.Task[None] | None = None
        """The freeze once Kopf's first listings have arrived (:meth:`_freeze_after_listings`)."""
        self.readiness = Readiness(
            max_lag=settings.readiness_max_loop_lag,
            window=settings.readiness_window,
            timeout=settings.readiness_timeout,
            on_lag=self.metrics.loop_lagged,
            pending=self._start_up_pending,
        )
        self.readiness_endpoint = ReadinessEndpoint(self.readiness)
        self.informers[PODSETS].add_handler(self.podset_controller.on_podset)
        self.pod_views.add_handler(self.podset_controller.on_pod)

    # -- lifecycle

    async def start(self) -> None:
        """Sync the caches and check for the built-in quota system (at the same time), then
        start admission, prepare the webhook, and lead (at once, or once the lease is held).

        Where upstream's quota system is on (and ``TALLY_ALLOW_BUILTIN_QUOTA`` is not set),
        ClusterQuotas only: no ResourceQuota controller, no ResourceQuota written (judged only),
        webhook rules only for the kinds ClusterQuotas name.
        """
        settings = self.settings
        if settings.metrics_port:
            self._metrics_runner = await self.metrics.serve(
                settings.metrics_addr,
                settings.metrics_port,
                # Reviews on the dedicated client: a scrape is not judged behind a burst.
                reviewer=KubeAccessReviewer(self.dedicated_api)
                if settings.metrics_auth_mode == "kubernetes"
                else None,
            )
        try:
            # Unready (503) from the first moment the kubelet can probe.
            await self.readiness_endpoint.start(settings.readiness_addr, settings.readiness_port)
            with collector_paused():
                await self._sync_and_check()
            if settings.webhook_enabled:
                # Before anything starts: a certificate that cannot be had (the Secret refused,
                # unusable mounted files) fails the start like a failed LIST.
                await self.serving.load()
        except BaseException:
            # Nothing else runs yet; Kopf retries a failed start in a fresh Runtime, which
            # binds the metrics and readiness ports again.
            await self.readiness_endpoint.stop()
            await self._stop_metrics()
            raise
        # What start-up built lives as long as the process: out of the collector's walks.
        frozen = freeze_long_lived()
        logger.debug("%d objects kept out of the cyclic collector's walks", frozen)
        # Kopf's listings are replayed from here, each event leaving a cycle (tally.app.heap).
        full_collections_rarely()
        self.quota.start()
        if self.heap_trimmer is not None:
            self.heap_trimmer.start()
        if self.pool_renewal is not None:
            self.pool_renewal.start()
        logger.info(
            "caches synced (%s); admission started",
            ", ".join(f"{gr}={len(i.store)}" for gr, i in self.informers.items()),
        )
        if settings.webhook_enabled:
            # Every replica serves, from synced caches (the LISTs above are the synced point).
            await self.serving.start(
                {
                    QUOTA_WEBHOOK_ID: quota_review(self.admit),
                    PODSET_WEBHOOK_ID: podset_review,
                    CLUSTER_QUOTA_WEBHOOK_ID: clusterquota_review(
                        self.registry,
                        self.quota.measures,
                        lambda: self.quota.cluster_quotas.in_namespace(""),
                    ),
                },
                quotas=self.quota.quota_specs,
                evaluators=self.registry.list,
                core_always=self.quota.enforces_resource_quotas,
            )
        # Ready once the first pass below, the re-lists and Kopf's first listings are done and
        # the loop is prompt, not at once (tally.app.readiness).
        self._first_pass_left = self.quota.unfinished_syncs()
        self.readiness.serving(asyncio.get_running_loop().time())
        self.leadership.start(settings, self.dedicated_api)
        try:
            await self._first_pass()
        finally:
            self._first_pass_left = None
        # Kopf's watches start after this handler, each with a listing of its own: what was
        # deleted between these LISTs and those is reported by neither. One re-list of every
        # kind, ~30 s from now, drops it (tally.machinery.informers: the first listing).
        self.caches.relist_all()
        # Readiness waits until those listings have arrived (tally.app.readiness).
        self.caches.expect_listings()
        # Watched: a freeze that died would otherwise leave readiness pending, unexplained.
        self._listings_freeze = start_watched(
            self._freeze_after_listings(), name="listings-freeze", logger=logger
        )

    async def _freeze_after_listings(self) -> None:
        """Once Kopf's first listings and the start-up re-lists are done, freeze again.

        Kopf keeps a few objects for every object it has seen, and the re-lists replace the
        caches' entries: at 50 000 pods, millions of objects the first freeze did not cover.
        Every full collection walked them all, 0.2-1.0 s on the loop each, and they came every
        few seconds through the replay and after it (tally.app.heap): pauses that reviews wait
        out. This one collection's pause comes before the replica reports ready; later full
        collections walk only what came after it."""
        while self.caches.relisting() or self.caches.listings_pending():  # noqa: ASYNC110
            # Polled: arrival is told by walking the stores (ListingReplay), not signalled.
            await asyncio.sleep(LISTINGS_FREEZE_POLL_S)
        started = time.perf_counter()
        frozen = freeze_long_lived()
        logger.info(
            "Kopf's first listings arrived: %d objects kept out of the cyclic collector's walks "
            "(the collection before took %.0f ms)", frozen, (time.perf_counter() - started) * 1000,
        )  # fmt: skip

    async def _first_pass(self) -> None:
        """On the leader, wait (``FIRST_PASS_LIMIT_S`` at most) until the controllers have
        recalculated every quota from the synced caches, before Kopf's watches begin.

        Kopf's first listing of every object goes through its per-event machinery on this
        loop, about a millisecond each: at 150 000 pods, minutes of one core. Started at
        once, it shares the loop with the first recalculations, and every quota waited for
        its usage behind it (10 000 quotas took 60 s to be written after the caches synced).
        Upstream's controller, too, computes from its informers' synced point; what the
        watches bring meanwhile comes after, as it would behind a listing: creations
        admission charges are held as charges, and the rest is seen once the watches catch
        up. A follower has nothing to recalculate and does not wait; neither does a replica
        whose quotas are already right (a restart: the syncs write nothing)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not self.leadership.leading:
            if self.leadership.led_elsewhere or loop.time() - started >= FIRST_PASS_LEAD_WAIT_S:
                return  # another replica leads: nothing here recalculates
            await asyncio.sleep(FIRST_PASS_POLL_S)
        while True:
            left = self.quota.unfinished_syncs()
            self._first_pass_left = left
            if left == 0:
                logger.info("every quota recalculated %.1f s after the caches synced; Kopf's "
                            "watches begin", loop.time() - started)  # fmt: skip
                return
            if loop.time() - started >= FIRST_PASS_LIMIT_S:
                logger.warning("%d quota(s) still to recalculate %.0f s after the caches synced; "
                               "Kopf's watches begin anyway", left, FIRST_PASS_LIMIT_S)  # fmt: skip
                return
            await asyncio.sleep(FIRST_PASS_POLL_S)

    def _start_up_pending(self) -> str | None:
        """The start-up work still to come on the loop (readiness waits it out), as a reason:
        the first pass, the re-lists, then the rest of Kopf's first listings."""
        if self._first_pass_left is not None:
            return (
                f"the first recalculation of every quota is under way ({self._first_pass_left} "
                "left); Kopf's watches begin after it"
            )
        kinds = self.caches.relisting()
        if kinds:
            return f"the start-up re-list of {', '.join(kinds)} is scheduled or under way"
        listings = self.caches.listings_pending()
        if listings:
            return "Kopf's first listing has yet to deliver " + ", ".join(
                f"{remaining} of {total} {kind}" for kind, remaining, total in listings
            )
        if self._listings_freeze is not None and not self._listings_freeze.done():
            return "what Kopf's first listings left is to be frozen out of the collector's walks"
        return None

    async def _sync_and_check(self) -> None:
        # The synced point: every kind listed once before any worker reads the caches.
        # The probe runs beside the LISTs (it is mostly waiting), so on a cluster of any size it
        # costs no start-up time; both end before any controller or webhook starts.
        # A failed probe request cancels the LISTs (on a large cluster they take minutes), and
        # a failed LIST cancels the probe (which still deletes its quota).
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._check_then_sync_quotas(), name="builtin-quota-probe")
                group.create_task(self._sync_all_but_quotas(), name="cache-sync")
        except BaseExceptionGroup as failed:
            # Callers (Kopf's start handler) expect the failure itself, not a group.
            raise failed.exceptions[0] from None

    async def _check_then_sync_quotas(self) -> None:
        await self.quota.check_builtin_quota(self.api, self.settings)
        # Quotas only after the probe: a LIST taken while the probe quota exists would keep it
        # in the store (Kopf's watch, started later, never reports its deletion) until the next
        # re-list, and the controller would sync a deleted quota. Quotas are few: a quick LIST,
        # still beside the other kinds' on a cluster where those take longer than the probe.
        await self.caches.sync([RESOURCE_QUOTAS])

    async def _sync_all_but_quotas(self) -> None:
        await self.caches.sync(gr for gr in self.informers if gr != RESOURCE_QUOTAS)

    async def stop(self, within: float = STOP_TIMEOUT_S) -> None:
        """Stop everything, waiting ``within`` seconds at most for others in all: reviews and
        syncs in progress, and the API server (the webhook configuration removed, the Lease
        released, the last Events written). What is not done by then is cut, so that a stop
        ends in time even with the API server unreachable."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within

        def left() -> float:
            return max(0.0, deadline - loop.time())

        # Out of the Service's endpoints first (the preStop sleep gives that its time).
        self.readiness.stopping()
        # No new review from here; those in progress finish while admission still runs.
        await self.serving.stop_serving(within=left())
        # The lease guards the controllers and the registration: release it only once they
        # stopped (client-go ReleaseOnCancel), and keep renewing it meanwhile.
        await self.leadership.end(remove=self.settings.webhook_remove_on_exit, within=left)
        await self.leadership.release(within=left())
        await self.quota.stop(within=left)
        await self.caches.stop()
        if self._listings_freeze is not None and not self._listings_freeze.done():
            await cancel_and_wait(self._listings_freeze)  # one that died was logged
        await self.recorder.flush(within=left())
        if left() == 0.0:
            logger.warning(
                "stopping: the API server or the work in progress took longer than %g s; the "
                "rest was cut", within,
            )  # fmt: skip
        if self.heap_trimmer is not None:
            await self.heap_trimmer.stop()
        if self.pool_renewal is not None:
            # Last: everything above may still send; the current pools are the clients' owners'.
            await self.pool_renewal.stop()
        await self.readiness_endpoint.stop()
        await self._stop_metrics()

    async def _stop_metrics(self) -> None:
        runner, self._metrics_runner = self._metrics_runner, None
        if runner is not None:
            await runner.cleanup()

    # -- entry points for the Kopf layer

    def on_event(self, gr: GroupResource, event_type: str | None, obj: Mapping[str, Any]) -> None:
        if gr == SECRETS:
            # Before the TALLY_NAMESPACES filter: the certificate Secret lives in tally's own
            # namespace, which tally need not manage.
            self.serving.secret_event(obj)
        self.caches.on_event(gr, event_type, obj)

    async def admit(self, attributes: Attributes) -> None:
        """Judge one admission request; raises ``AdmissionDenied`` to refuse it."""
        resolved = await self.scaled_podsets.resolve(attributes)
        if resolved is not None:
            await self.quota.admission.evaluate(resolved)
