"""Kopf wiring: registers tally's handlers and translates Kopf's callbacks into calls on
:class:`tally.app.runtime.Runtime`. Nothing here decides anything about quota.

* ``@kopf.on.event`` on ResourceQuotas and every core quota-tracked kind feeds the informers.
  These handlers return None, so Kopf writes nothing onto objects tally does not own.
* ``@kopf.on.validate`` (id ``quota``) serves quota admission for every resource the
  registered webhook configuration sends (the rules decide which; see
  :mod:`tally.webhook.configuration`).
* Start-up connects the API client and starts the runtime: caches LISTed (the synced point),
  controller and admission workers running. When the runtime sees upstream's own quota system
  on (:mod:`tally.builtin_quota.decision`), the handler raises ``kopf.PermanentError``: Kopf logs
  the message and the process exits with status 1, having started and registered nothing.
  Kopf starts its watches and its webhook server only after the start-up handlers finished,
  so no event is lost between the LIST and the watch (Kopf's own initial listing replays
  everything; replays are dropped by resourceVersion) and no admission request is judged on an
  unsynced cache.
* With leader election on, a replica that loses the lease stops its controllers at once and
  then stops the process the way a SIGTERM does (Kopf's graceful stop: the webhook server and
  watches end, then the cleanup handler); in a pod the kubelet restarts it as a candidate.
* The liveness probe reports the API server version reached at start-up. It does no I/O: an API
  server outage must not make the kubelet restart tally, which would not help.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import kopf

from tally.admission.attributes import Attributes
from tally.admission.errors import AdmissionDenied
from tally.app.runtime import PODSETS, RESOURCE_QUOTAS, TRACKED_CORE_KINDS, Runtime
from tally.app.settings import Settings, SettingsError
from tally.builtin_quota.decision import BuiltinQuotaActive
from tally.evaluators.base import GroupResource
from tally.kube import rest
from tally.podset import client as podset_client
from tally.podset import validation
from tally.webhook.configuration import PODSET_WEBHOOK_ID, QUOTA_WEBHOOK_ID
from tally.webhook.server import WebhookServer, attributes_from_review, review_response

logger = logging.getLogger(__name__)


class NoEssenceDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf's diff base, turned off: tally has no change handlers (create/update/resume/field).

    For every watch event Kopf builds the object's "essence" (a deep copy minus system
    fields) and diffs it against the last handled one, but only change handlers read that
    diff; on.event handlers do not. Measured under bench/admission.py, the deep copies were
    the largest single cost of a pod event in tally. ``fetch``/``build`` return None, for
    which Kopf skips the progress cleaning and computes an empty diff; ``store`` (called only
    after change handlers) refuses, so a change handler added later fails loudly instead of
    seeing no changes. ``tests/unit/test_handlers.py`` checks that none is registered.
    """

    def build(self, **_: Any) -> Any:
        return None

    def fetch(self, **_: Any) -> Any:
        return None

    def store(self, **_: Any) -> None:
        raise RuntimeError("tally registers no change handlers; Kopf's diff base is off")


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # No Kopf peering: peering is not leader election (no lease, no fencing, and paused peers
    # would still serve webhooks). Which replica runs the controllers is tally's own Lease
    # (TALLY_LEADER_ELECTION, tally.machinery.leaderelection); Kopf watches on every replica.
    settings.peering.standalone = True
    # Kopf's own per-handler events would be posted onto objects tally does not own.
    settings.posting.enabled = False
    settings.persistence.diffbase_storage = NoEssenceDiffBase()
    # Memory at scale (bench/scale.py, 10 000 pods): Kopf's initial LIST in pages rather than
    # one response, and per-object workers that exit soon after their last event — an idle
    # worker holds that event's whole body for idle_timeout (5 s by default), so the initial
    # listing kept thousands of raw bodies alive at once.
    settings.watching.chunk_size = 500
    settings.queueing.idle_timeout = 0.5
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Kopf logs every handler run at INFO; for caches fed by every pod event that is noise
    # (and cost). Failures still log at ERROR, except tally's own refusals (below).
    objects = logging.getLogger("kopf.objects")
    objects.setLevel(logging.WARNING)
    if not any(isinstance(f, _RefusalsFilter) for f in objects.filters):
        objects.addFilter(_RefusalsFilter())
    # aiohttp's access log would print a line for every admission review the webhook answers
    # (3.5% of tally's CPU under bench/admission.py, and a busy cluster's log filled with pod
    # creates); upstream's admission plugin logs none. Kept with `kopf run --verbose`.
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        config = Settings.from_env()
    except SettingsError as error:
        raise kopf.PermanentError(str(error)) from None
    api = await rest.make_api_client()
    memo.api = api
    memo.apiserver_version = await rest.server_version(api)
    logger.info("connected to the API server, version %s", memo.apiserver_version)

    runtime = Runtime(config, api, on_leadership_lost=_stop_this_process)
    try:
        await runtime.start()
    except BuiltinQuotaActive as refused:
        # Kopf stops on a PermanentError from a start-up handler, without running the cleanup
        # handlers: close the client here. Nothing else was started or registered.
        await api.close()
        raise kopf.PermanentError(str(refused)) from None
    memo.runtime = runtime
    if runtime.tls is not None:
        # Kopf reads this after the start-up handlers and only then starts serving.
        async def quota_fallback(review: dict[str, Any]) -> dict[str, Any]:
            try:
                await runtime.admit(attributes_from_review(review))
            except AdmissionDenied as denied:
                return review_response(review, False, denied.message, denied.code)
            return review_response(review, True)

        settings.admission.server = WebhookServer(
            fallbacks={QUOTA_WEBHOOK_ID: quota_fallback},
            addr=config.webhook_addr,
            port=config.webhook_port,
            host=config.webhook_host or config.webhook_addr,
            # tally's context: tally.webhook.tls reloads the certificate in it while serving.
            context=runtime.tls.context,
            cadata=runtime.tls.ca_bundle,
        )
    else:
        # TALLY_WEBHOOK_ENABLED=false: Kopf refuses to run at all while validate handlers
        # exist and no server is configured.
        settings.admission.server = _NoWebhookServer()


class _NoWebhookServer:
    """A webhook "server" that never listens and never yields a client configuration: Kopf
    then waits on it forever, as it would with none, and nothing is registered."""

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        await asyncio.Event().wait()
        nothing: tuple[kopf.WebhookClientConfig, ...] = ()
        for config in nothing:  # an async generator that yields nothing
            yield config


class _RefusalsFilter(logging.Filter):
    """Drops Kopf's ERROR line for each request tally's webhooks refuse on purpose.

    Kopf logs every ``kopf.AdmissionError`` as ``Webhook 'quota' failed permanently: …`` at
    ERROR: an ERROR line for each create a full namespace refuses, which is quota working, not
    failing (upstream's plugin logs none). The handlers log what deserves it themselves
    (:func:`validate_quota`: admission failures other than a 403). Only these exact lines go:
    an unexpected exception in a handler is logged by Kopf with its traceback, untouched.
    """

    PREFIXES = tuple(
        f"Webhook {webhook!r} failed permanently: " for webhook in (QUOTA_WEBHOOK_ID,
                                                                   PODSET_WEBHOOK_ID)
    )  # fmt: skip

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is not None or not record.getMessage().startswith(self.PREFIXES)


def _stop_this_process() -> None:
    """Leadership lost: stop the operator as a SIGTERM would. Kopf's signal handler turns it
    into its graceful stop (exit status 0); a pod's container is restarted either way."""
    os.kill(os.getpid(), signal.SIGTERM)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    runtime = memo.get("runtime")
    if runtime is not None:
        await runtime.stop()
    api = memo.get("api")
    if api is not None:
        await api.close()


def _feed(gr: GroupResource) -> Callable[..., Coroutine[Any, Any, None]]:
    # async, not a plain function: Kopf runs plain handlers in a thread pool, and the stores,
    # queues and timers they touch belong to the event loop.
    async def on_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        runtime = memo.get("runtime")
        if runtime is not None:
            runtime.on_event(gr, event["type"], event["object"])
        # Returns None: Kopf writes nothing onto the object.

    return on_event


for _gr in (RESOURCE_QUOTAS, *TRACKED_CORE_KINDS):
    kopf.on.event("v1", _gr.resource, id=f"cache-{_gr.resource}")(_feed(_gr))
kopf.on.event(PODSETS.group, podset_client.VERSION, PODSETS.resource, id="cache-podsets")(
    _feed(PODSETS)
)


@kopf.on.validate(
    kopf.EVERYTHING, id=QUOTA_WEBHOOK_ID, operations=["CREATE", "UPDATE"], subresource="*"
)
async def validate_quota(
    *,
    memo: kopf.Memo,
    resource: kopf.Resource,
    namespace: str | None,
    name: str,
    subresource: str | None,
    dryrun: bool,
    **kwargs: Any,
) -> None:
    """Quota admission for one request: translate, evaluate, turn a denial into Kopf's."""
    runtime: Runtime | None = memo.get("runtime")
    if runtime is None:
        # Kopf serves webhooks only after start-up, so this is a broken invariant: refuse
        # rather than allow something a quota would deny.
        logger.error("quota admission called before tally started; refused")
        raise kopf.AdmissionError("tally is not started", code=500)
    attributes = Attributes(
        namespace=namespace or "",
        name=name or "",
        group_resource=GroupResource(resource.group, resource.plural),
        subresource=subresource or "",
        operation=str(kwargs.get("operation") or ""),
        obj=_raw(kwargs.get("new")),
        old_obj=_raw(kwargs.get("old")),
        dry_run=dryrun,
    )
    try:
        await runtime.admit(attributes)
    except AdmissionDenied as denied:
        if denied.code != 403:
            # Not a quota saying no (403) but admission failing to decide: a timeout, writes
            # that kept conflicting, an object or quota it cannot read. Kopf's own line for
            # it is filtered (_RefusalsFilter).
            logger.warning(
                "quota admission refused %s %s %s/%s with %d: %s",
                attributes.operation, attributes.group_resource, namespace, name, denied.code,
                denied.message,
            )  # fmt: skip
        raise kopf.AdmissionError(denied.message, code=denied.code) from None


@kopf.on.validate(
    PODSETS.group,
    podset_client.VERSION,
    PODSETS.resource,
    id=PODSET_WEBHOOK_ID,
    operations=["CREATE", "UPDATE"],
)
async def validate_podset(*, name: str, body: kopf.Body, **kwargs: Any) -> None:
    """PodSet validation (apps/v1 ReplicaSet rules): 422 with the API server's own wording."""
    errors = validation.validate_podset(dict(body), _raw(kwargs.get("old")))
    if errors:
        raise kopf.AdmissionError(validation.invalid_message(name, errors), code=422)


def _raw(body: kopf.Body | None) -> dict[str, Any] | None:
    """The raw JSON behind Kopf's read-only view (evaluators read plain mappings)."""
    return None if body is None else dict(body)


@kopf.on.probe(id="apiserver")
def apiserver_version(memo: kopf.Memo, **_: Any) -> str:
    return str(memo.get("apiserver_version", ""))
