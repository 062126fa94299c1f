"""Keeps tally's ValidatingWebhookConfiguration in the cluster, and its rules current.

The configuration is applied once the webhook server answers (registering a fail-closed webhook
before anything listens would refuse every pod create in the meantime), re-applied whenever the
requests its rules must send change — the resources named by quotas (``count/…``, or a name a
registered evaluator measures), or what their evaluators handle (a kind counted by ``count/``
gets measures: its updates now charge) — and, in local development only, removed on a graceful
exit, so that a stopped operator does not leave a dead fail-closed webhook behind.
In a cluster it stays (a quota is only a limit if creation is refused while tally is down).
Its caBundle follows the serving certificate (:meth:`WebhookRegistrar.set_ca_bundle`, called
by :mod:`tally.webhook.tls` when a CA joins or leaves).

It also answers which kinds admission charges on creation *now*
(:meth:`WebhookRegistrar.charges_creations`): the quota controller recalculates on creations
of every other kind, since nobody else counts them (before registration, with the webhook off,
in the moment a ``count/`` rule is new).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client

from tally.evaluators.base import Evaluator, GroupResource, Operation
from tally.kube import rest
from tally.webhook.configuration import (
    Route,
    ServiceReference,
    count_resources,
    routes,
    rules_for,
    validating_webhook_configuration,
)
from tally.workqueue import start_watched
from tally.workqueue.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

PATH: Final = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
READY_POLL_S: Final = 0.1
REFRESH_DEBOUNCE_S: Final = 0.2
RULES_SETTLE_S: Final = 2.0
"""How long after a configuration is applied tally counts on the API server enforcing it. The
API server picks webhook configurations up through its own watch (milliseconds on the local
control plane); a create in between passes unjudged, so until then its kind is recalculated on
creation (:meth:`WebhookRegistrar.charges_creations`)."""
_WILDCARDS: Final = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


class WebhookRegistrar:
    """Applies the configuration built by
    :func:`tally.webhook.configuration.validating_webhook_configuration`."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        name: str,
        url: str,
        ca_pem: bytes,
        listen: tuple[str, int],
        quotas: Callable[[], Iterable[Mapping[str, Any]]],
        failure_policy: str,
        exempt_namespaces: Iterable[str],
        watched_namespaces: Iterable[str] = (),
        service: ServiceReference | None = None,
        tls_name: str | None = None,
        evaluators: Callable[[], Iterable[Evaluator]] = tuple,
        clock: Callable[[], float] = time.monotonic,
        core_always: bool = True,
    ) -> None:
        """``service``: name a Service in the client configs instead of ``url``. ``tls_name``:
        a name the serving certificate holds, to check that the server answers (default: the
        listen address, which a wildcard listen address like ``0.0.0.0`` is not).
        ``evaluators``: the registered evaluators, whose names in a quota also call for rules
        on their kinds (:func:`~tally.webhook.configuration.count_resources`).
        ``core_always=False`` (ClusterQuotas only): rules only for the kinds some quota names,
        the core kinds included, so that nothing else passes tally's webhook.
        ``exempt_namespaces``: never sent to the quota and PodSet webhooks;
        ``watched_namespaces`` (the namespaces tally manages; empty: all): the only ones sent
        (:func:`~tally.webhook.configuration.namespace_selector`)."""
        self.core_always = core_always
        self._api = api
        self.name = name
        self._url = url
        self._service = service
        self._tls_name = tls_name
        self._ca_pem = ca_pem
        self._listen = listen
        self._quotas = quotas
        self._evaluators = evaluators
        self._failure_policy = failure_policy
        self._exempt = tuple(exempt_namespaces)
        self._watched = tuple(watched_namespaces)
        self._applied: frozenset[Route] | None = None
        """What the rules last applied send; None until the first apply (registration)."""
        self._clock = clock
        self._charged_since: dict[GroupResource, float] = {}
        """Each kind the applied rules send to admission, with when the first configuration
        covering it was applied (clock time). Emptied by :meth:`stop`."""
        self._lock = asyncio.Lock()
        """Held across each GET + PUT, so that a rules refresh and a caBundle change never
        race each other into a 409 (or one overwriting the other with stale content)."""
        self._task: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._changed_during_refresh = False
        self.registered = asyncio.Event()
        self._stopped = False
        """Set by :meth:`stop`; from then on :meth:`apply` and the refreshes write nothing."""

    def body(self, extra: Iterable[GroupResource]) -> dict[str, Any]:
        """The configuration with rules for the core kinds (unless ClusterQuotas only) and
        ``extra``."""
        return self._body(self._routes(extra))

    def _body(self, wanted: Iterable[Route]) -> dict[str, Any]:
        return validating_webhook_configuration(
            name=self.name,
            url=self._url,
            ca_bundle=base64.b64encode(self._ca_pem).decode("ascii"),
            rules=rules_for(wanted),
            failure_policy=self._failure_policy,
            exempt_namespaces=self._exempt,
            watched_namespaces=self._watched,
            service=self._service,
        )

    @property
    def target(self) -> str:
        """Where the API server sends requests, for logs."""
        if self._service is None:
            return self._url
        return f"service {self._service.namespace}/{self._service.name}:{self._service.port}"

    def start(self) -> None:
        # Returning (registered) and cancellation (stop) are expected; only a crash is logged.
        self._task = start_watched(
            self._register_when_serving(), name="webhook-registrar", logger=logger
        )

    async def _register_when_serving(self) -> None:
        host, port = self._listen
        # A wildcard listen address is not an address to dial (nor a name in the certificate).
        dial = _WILDCARDS.get(host, host)
        while True:
            # Built per try: the caBundle may change before the server answers.
            context = ssl.create_default_context(cadata=self._ca_pem.decode("ascii"))
            # TLS 1.3 only: the probe checks that the server presents a certificate the
            # caBundle trusts. A server that requires client certificates (mutual TLS) refuses
            # this probe, which has none; in TLS 1.3 it does so after the client has finished
            # its handshake (the connection opens, then closes), in TLS 1.2 during it
            # (indistinguishable here from a server that is not up yet).
            context.minimum_version = ssl.TLSVersion.TLSv1_3
            try:
                _, writer = await asyncio.open_connection(
                    dial, port, ssl=context, server_hostname=self._tls_name or host
                )
            except OSError:
                await asyncio.sleep(READY_POLL_S)
                continue
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()
            break
        await self.apply()
        self.registered.set()
        logger.info("webhook %s registered at %s", self.name, self.target)

    async def set_ca_bundle(self, ca_pem: bytes) -> None:
        """Trust ``ca_pem`` from now on: applied at once when registered, else at registration."""
        async with self._lock:
            self._ca_pem = ca_pem
            if self._applied is not None and not self._stopped:
                await self._apply()
                logger.info("webhook %s: caBundle updated", self.name)

    async def apply(self) -> None:
        """Create or replace the configuration with rules for the current quotas (nothing
        once stopped)."""
        async with self._lock:
            if self._stopped:
                return
            await self._apply()

    async def _apply(self) -> None:
        wanted = self._wanted()
        await self._write(self._body(wanted))
        self._applied = wanted
        now = self._clock()
        # Only creations matter here: a kind whose updates are not sent is still charged on
        # creation, and one whose creations are not sent (a kind admission ignores) is not.
        created = {
            route.group_resource
            for route in wanted
            if route.subresource == "" and route.operation is Operation.CREATE
        }
        self._charged_since = {gr: self._charged_since.get(gr, now) for gr in created}

    async def _write(self, body: dict[str, Any]) -> None:
        """Create the configuration, or replace it (with the resourceVersion read)."""
        try:
            current = await rest.get_json(self._api, f"{PATH}/{self.name}")
        except client.ApiException as error:
            if error.status != 404:
                raise
            await self._api.call_api(
                PATH,
                "POST",
                body=body,
                header_params={"Content-Type": "application/json"},
                auth_settings=["BearerToken"],
                _request_timeout=rest.REQUEST_TIMEOUT_S,
            )
        else:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await rest.put_json(self._api, f"{PATH}/{self.name}", body)

    def _routes(self, extra: Iterable[GroupResource]) -> frozenset[Route]:
        return routes(extra, core_always=self.core_always, evaluators=self._evaluators())

    def _wanted(self) -> frozenset[Route]:
        """What the rules must send now, for the current quotas and evaluators."""
        evaluators = list(self._evaluators())
        extra = count_resources(self._quotas(), evaluators, core_always=self.core_always)
        return routes(extra, core_always=self.core_always, evaluators=evaluators)

    def charges_creations(self, gr: GroupResource) -> bool:
        """Whether admission charges creations of ``gr`` now: the applied rules have covered it
        for :data:`RULES_SETTLE_S`. False before registration, after :meth:`stop`, and for a
        kind whose rule is new or gone; a quota of such a kind must be recalculated when one
        is created, as nobody charged it."""
        since = self._charged_since.get(gr)
        return since is not None and self._clock() - since >= RULES_SETTLE_S

    def quotas_changed(self) -> None:
        """A quota (or a measure) changed: re-apply if what the rules must send did
        (debounced)."""
        if self._stopped or self._applied is None:
            return
        if self._refresh is not None and not self._refresh.done():
            # The running refresh looks again when it is done: it may already have read the
            # quotas (and be applying what they wanted before this change).
            self._changed_during_refresh = True
            return
        self._refresh = start_watched(self._refresh_rules(), name="webhook-rules", logger=logger)

    def rules_current(self) -> bool:
        """Whether the applied rules are those the quotas call for now (registered, and no
        change waiting); if not, a refresh is on its way."""
        if self._applied is not None and not self._stopped and self._wanted() == self._applied:
            return True
        self.quotas_changed()
        return False

    async def _refresh_rules(self) -> None:
        while True:
            self._changed_during_refresh = False
            await asyncio.sleep(REFRESH_DEBOUNCE_S)
            if self._wanted() != self._applied:
                await self.apply()
                kinds = {str(route.group_resource) for route in self._applied or ()}
                logger.info("webhook rules now cover: %s", sorted(kinds))
            if not self._changed_during_refresh or self._stopped:
                return

    async def stop(self, *, remove: bool, within: float = rest.REQUEST_TIMEOUT_S) -> None:
        """Write nothing more; with ``remove``, delete the configuration (waiting ``within``
        seconds at most for the API server)."""
        # From now on nothing is written but the removal: a leader that lost its Lease keeps
        # receiving quota events and certificate passes until its process ends, and the
        # configuration may already be the new leader's.
        self._stopped = True
        self._charged_since.clear()
        for task in (self._task, self._refresh):
            if task is not None and not task.done():
                await cancel_and_wait(task)
        if remove:
            try:
                async with asyncio.timeout(within):
                    await self._api.call_api(
                        f"{PATH}/{self.name}",
                        "DELETE",
                        auth_settings=["BearerToken"],
                        _request_timeout=rest.REQUEST_TIMEOUT_S,
                    )
            except client.ApiException as error:
                if error.status != 404:
                    logger.warning("webhook %s not removed: %s", self.name, error.reason)
                    return
            except (TimeoutError, OSError, aiohttp.ClientError) as error:
                reason = str(error) or f"no answer within {within:g} s"
                logger.warning("webhook %s not removed: %s", self.name, reason)
                return
            logger.info("webhook %s removed", self.name)
