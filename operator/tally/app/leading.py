"""Leading: what runs once in the cluster, and the Lease that decides where it runs.

**Leader election** (``TALLY_LEADER_ELECTION``, :mod:`tally.machinery.leaderelection`): every
replica keeps the caches and serves the webhook (admission's reservations are compare-and-swap
writes, safe from several replicas; see :mod:`tally.admission.evaluator`); only the Lease
holder leads. Leading is everything that must happen once: the quota controllers' status
writes and resync (two writers would fight; and the PodSet controller's expectations live in
one process's memory, so two would create pods twice), the webhook configuration's writes
(rules follow the leader's caches), and the dynamic kinds' Events. A replica that is not
leading keeps its queues filled from the events (keys only), so that when it takes over it
syncs every quota and PodSet at once from warm caches.

Losing the lease stops the controllers at once (in-flight syncs cancelled) and then the whole
process, through ``on_lost`` (the Kopf layer: the same graceful stop as a SIGTERM); the
kubelet restarts it as a candidate. Upstream's components exit too
(``klog.Fatalf("leaderelection lost")``): restarting from scratch is simpler and safer than
restarting controllers whose in-memory state (expectations) may be stale. A graceful stop
stops the controllers, *then* releases the lease (client-go ``ReleaseOnCancel``), so that the
other replica takes over at its next attempt rather than after the lease duration.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from kubernetes_asyncio import client

from tally.app.metrics import Metrics
from tally.app.settings import Settings
from tally.kube import rest
from tally.kube.lease_lock import KubeLeaseLock
from tally.machinery import leaderelection
from tally.webhook.registrar import WebhookRegistrar

logger = logging.getLogger(__name__)


class Controller(Protocol):
    def start(self) -> None: ...

    async def stop(self, grace_period: float = ...) -> None: ...


class Leading:
    """Starts and stops what leads (:meth:`begin`, :meth:`end`), at once or under a Lease."""

    def __init__(
        self,
        identity: str,
        metrics: Metrics,
        *,
        controllers: Callable[[], Sequence[Controller]],
        all_controllers: Sequence[Controller],
        registrar: Callable[[], WebhookRegistrar | None],
        on_begun: Callable[[], None],
        on_lost: Callable[[], None] | None,
    ) -> None:
        """``controllers``: those to start when leading begins; ``all_controllers``: those to
        stop when it ends; ``on_begun``: after they started; ``on_lost``: after the lease
        was lost and the controllers stopped (must end the process)."""
        self.identity = identity
        self.metrics = metrics
        self._controllers = controllers
        self._all = all_controllers
        self._registrar = registrar
        self._on_begun = on_begun
        self._on_lost = on_lost
        self.elector: leaderelection.LeaderElector | None = None
        self.leading = False
        """Whether the controllers run here. Invariant: they run only while this is True, and
        with leader election only while the elector holds the lease."""
        self._stopped = False
        metrics.leading(identity, False)

    def start(self, settings: Settings, api: client.ApiClient) -> None:
        """Lead at once, or (``TALLY_LEADER_ELECTION``) once the Lease is held; until then
        this replica only serves its webhook, from caches kept current, and waits its turn."""
        if not settings.leader_election:
            self.begin()
            return
        self.elector = leaderelection.LeaderElector(
            KubeLeaseLock(
                api,
                settings.lease_namespace,
                settings.leader_election_lease,
                request_timeout=settings.leader_election_renew_deadline / 2,
            ),
            self.identity,
            settings.election_config,
            on_started_leading=self.begin,
            on_stopped_leading=self._lost,
        )
        self.elector.start()

    @property
    def led_elsewhere(self) -> bool:
        """Whether the Lease was last seen held by another replica (a follower, for now)."""
        if self.elector is None:
            return False
        holder = self.elector.state.observed_record.holder_identity
        return bool(holder) and holder != self.identity

    def begin(self) -> None:
        """Start everything that must run once in the cluster."""
        self.leading = True
        for controller in self._controllers():
            controller.start()
        registrar = self._registrar()
        if registrar is not None:
            registrar.start()  # registers once tally's webhook server answers
        self._on_begun()
        self.metrics.leading(self.identity, True)
        logger.info("%s leads: quota controller, PodSet controller and webhook registration "
                    "started", self.identity)  # fmt: skip

    async def end(
        self,
        *,
        grace_period: float | None = None,
        remove: bool,
        within: Callable[[], float] | None = None,
    ) -> None:
        """Stop what :meth:`begin` started (idempotent; on a follower it only shuts the idle
        controllers' queues). ``grace_period``: how long in-flight syncs may finish (None: the
        controllers' defaults; 0: cancel at once). ``remove``: delete the webhook
        configuration (local development, graceful stop only: after losing the lease it may
        be the new leader's). ``within``: the time left for both, asked before each."""
        was_leading, self.leading = self.leading, False
        registrar = self._registrar()
        if was_leading:
            self.metrics.leading(self.identity, False)
            if registrar is not None:
                timeout = within() if within is not None else rest.REQUEST_TIMEOUT_S
                await registrar.stop(remove=remove, within=timeout)
        if not self._stopped:
            self._stopped = True
            if within is not None:
                grace_period = within() if grace_period is None else min(grace_period, within())
            kwargs = {} if grace_period is None else {"grace_period": grace_period}
            await asyncio.gather(*(controller.stop(**kwargs) for controller in self._all))

    async def release(self, within: float) -> None:
        """Give the Lease up (after :meth:`end`), so that another replica takes over now."""
        if self.elector is not None:
            await self.elector.stop(release=True, within=within)

    async def _lost(self, reason: str) -> None:
        # Another replica may take over from now on: no sync may start or go on here.
        await self.end(grace_period=0.0, remove=False)
        logger.critical("%s stopped leading (%s); controllers stopped, exiting", self.identity,
                        reason)  # fmt: skip
        if self._on_lost is not None:
            self._on_lost()
