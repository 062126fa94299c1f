"""tally's admission webhooks on one replica: the serving certificate, the server, and the
registration that points the API server at them.

Every replica loads the certificate and serves, from caches already synced; only the leader
registers (:class:`~tally.webhook.registrar.WebhookRegistrar`), and a follower keeps the CA
bundle for the day it leads. Admission is served by tally's own aiohttp server
(:mod:`tally.webhook.server`), not Kopf's: the webhook module says why.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from tally.app.metrics import Metrics
from tally.app.settings import Settings
from tally.evaluators.base import Evaluator, GroupResource
from tally.webhook.registrar import WebhookRegistrar
from tally.webhook.server import ReviewHandler, WebhookServer
from tally.webhook.tls import MemorySource, MountedSource, SecretSource, ServingTLS, Source

logger = logging.getLogger(__name__)


class WebhookServing:
    """Loads the certificate (:meth:`load`), then serves and registers (:meth:`start`)."""

    def __init__(
        self,
        settings: Settings,
        api: client.ApiClient,
        metrics: Metrics,
        *,
        registration_api: client.ApiClient | None = None,
    ) -> None:
        """``registration_api`` (default: ``api``): the client the registrar writes the
        webhook configuration with. The runtime gives it the dedicated client: at a cold
        start of 30 000 pods the registration waited 16 s behind the quota controller's first
        status writes and the re-lists on the controllers' pool, and creates were not judged
        meanwhile (bench/scale.py)."""
        self.settings = settings
        self.api = api
        self.registration_api = registration_api or api
        self.metrics = metrics
        self.tls: ServingTLS | None = None
        self.registrar: WebhookRegistrar | None = None
        self.server: WebhookServer | None = None

    async def load(self) -> None:
        """The serving certificate; failing here fails the start like a failed LIST (the
        Secret refused, unusable mounted files)."""
        settings = self.settings
        host = settings.webhook_host or settings.webhook_addr
        service = settings.webhook_service_ref
        # With a Service client config the API server checks <svc>.<ns>.svc.
        tls = ServingTLS(
            self._certificate_source(),
            hosts=[host, *(service.dns_names if service is not None else ())],
            policy=settings.certificate_policy,
            directory=Path(settings.webhook_cert_dir or tempfile.mkdtemp(prefix="tally-tls-")),
            client_ca=settings.webhook_client_ca,
            check_period=settings.webhook_cert_check_period,
            on_load=self.metrics.webhook_certificate_loaded,
        )
        await tls.load()
        self.tls = tls

    def _certificate_source(self) -> Source:
        settings = self.settings
        secret = settings.webhook_cert_secret_ref
        if secret is not None:
            return SecretSource(self.api, *secret)
        if settings.webhook_cert_mount:
            return MountedSource(Path(settings.webhook_cert_mount))
        return MemorySource()

    async def start(
        self,
        reviews: Mapping[str, ReviewHandler],
        *,
        quotas: Callable[[], Iterable[Any]],
        evaluators: Callable[[], Iterable[Evaluator]],
        core_always: bool,
    ) -> None:
        """Serve ``reviews`` (by webhook id) and prepare the registration of rules for the
        kinds ``quotas`` name (and the core kinds when ``core_always``)."""
        settings, tls = self.settings, self.tls
        assert tls is not None, "load() first"
        host = settings.webhook_host or settings.webhook_addr
        self.registrar = WebhookRegistrar(
            self.registration_api,
            name=settings.webhook_config_name,
            url=f"https://{host}:{settings.webhook_url_port or settings.webhook_port}",
            service=settings.webhook_service_ref,
            tls_name=host,
            ca_pem=tls.ca_bundle,
            listen=(settings.webhook_addr, settings.webhook_port),
            quotas=quotas,
            evaluators=evaluators,
            failure_policy=settings.webhook_failure_policy,
            core_always=core_always,
            exempt_namespaces=settings.webhook_exempt_namespaces,
            watched_namespaces=settings.watched_namespaces,
        )
        # On every replica: each follows the certificate (renewals are compare-and-swap
        # writes of the Secret); publishing writes the configuration only where it is
        # registered, the leader.
        tls.start(publish=self.registrar.set_ca_bundle)
        self.server = WebhookServer(
            reviews,
            addr=settings.webhook_addr,
            port=settings.webhook_port,
            context=tls.context,
            access_log=logger.isEnabledFor(logging.DEBUG),
            limits=settings.webhook_limits,
        )
        await self.server.start()

    def secret_event(self, obj: Mapping[str, Any]) -> None:
        if self.tls is not None:
            self.tls.secret_event(obj)

    def rules_current(self) -> bool:
        """Whether the API server sends the webhook every kind the quotas name; True without a
        registrar (the webhook is off: nothing to wait for)."""
        return self.registrar is None or self.registrar.rules_current()

    def charges_creations(self, gr: GroupResource) -> bool:
        return self.registrar is not None and self.registrar.charges_creations(gr)

    def quotas_changed(self) -> None:
        if self.registrar is not None:
            self.registrar.quotas_changed()

    async def stop_serving(self, within: float) -> None:
        """No new review from here; those in progress finish within ``within`` seconds."""
        if self.server is not None:
            await self.server.stop(within=within)
        if self.tls is not None:
            await self.tls.stop()
