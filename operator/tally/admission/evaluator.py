"""Quota admission's engine: per-lane batching, compare-and-swap reservation, retries.

This module owns upstream's ``quotaEvaluator`` (``apiserver/pkg/admission/plugin/resourcequota/
controller.go``) and the request filtering of ``admission.go``'s ``Validate``, on one asyncio
event loop:

* :meth:`QuotaEvaluator.evaluate` filters the request (CREATE and UPDATE only; cluster-scoped
  objects and Namespace creation skipped; ignored resources skipped; the evaluator's
  ``handles`` decides, which is where subresources are filtered), then queues a *waiter* in the
  request's *lane* and waits at most 10 s for its verdict. A lane is the request's namespace,
  or the one lane every namespace a ClusterQuota selects shares (``lane_of``).
* N workers (5 by default, as upstream; a :class:`~tally.workqueue.WorkerPool`) take lanes off
  the queue, which never hands one lane to two workers at once. A worker checks **all** waiters
  of its lane in one pass against one read of the quotas, and writes each changed quota once: a
  burst of pod creates in a namespace costs one status write per quota per pass, not one per
  pod. Waiters that arrive while their lane is being worked on wait for the next pass
  (``dirty_work``); this is the workqueue's dirty/processing idea keyed by lane.
* The charge is reserved by writing the quota's status with the resourceVersion that was read
  (compare and swap; :mod:`tally.admission.writes`). A write that fails is retried against a
  fresh read, up to 3 times; one that lost its compare-and-swap, up to 10 times, against the
  stored copy read from the API, after a short random pause. A request is allowed only after
  every quota it charges has been written, so the quotas' ``status.used`` never admits more
  than ``status.hard``, however many webhook replicas or workers race.
* Every charge is put into the charge ledger (:mod:`tally.charges`) before it is written, so
  that no recalculation erases it; when the pass ends, an allowed request's charge waits there
  for its object, and a request refused after part of its charge was written (or whose caller
  stopped waiting) gives that part back at once, and the quotas holding it are judged without
  it meanwhile (:mod:`tally.admission.overcharges`).
* The controllers' recalculations of the quotas a pass writes wait until the pass ends, not
  only until each write lands: one running during a retry would count the charges the pass
  still holds into a new status version, including those of requests the retry then refuses,
  and the next pass would judge against that version, which the overcharge memory does not know.

Statuses, and where tally's answer differs in form from upstream's:

* timeout: 500 ``Internal error occurred: resource quota evaluation timed out``; upstream's
  ``apierrors.NewInternalError`` yields exactly this message, so the webhook's message (after
  ``denied the request: ``) matches what reference mode prints;
* conflicts on every attempt: 409 ``Operation cannot be fulfilled on resourcequotas "<name>":
  the object has been modified; please apply your changes to the latest version and try
  again``, the API server's text for the lost write, which upstream passes through;
* any other failure to read or write quotas, or an unexpected error: a 500 (deny on internal
  error; never allow what could not be checked).

Deliberate differences from upstream's ``checkQuotas``, each closing a hole in its retry:

* A retry re-checks only the requests still pending (those waiting on a failed write).
  Upstream re-checks every waiter against the retried subset and resets a waiter that changes
  nothing there to *allowed*, so a request that an unrelated, successfully written quota had
  refused could be admitted. Here a refusal is never turned into an admission within its pass.
* A refusal judged against a charge the same pass then gave back (upstream refuses it: the
  namespace's next request fits where this one did not) is judged again by the lane's next
  pass, against the status without that charge.
* A quota whose write answers 404 (deleted since it was read) is left out of the retry even
  while the cache still holds it (upstream's informer lags the same way, and its retries keep
  writing to the deleted quota until they fail the request); a quota re-created under that name
  is another uid, and is judged.
* A retry skips the LimitedResources checks: the requests passed them against the full quota
  list, and the subset of retried quotas would not cover names the other quotas cover.
* A lost compare-and-swap is retried against the quota read from the API (upstream re-reads
  its informer, which often has not seen the write that won, so the retry loses again), with
  more attempts (10 instead of 3) and a random pause growing with each, so that replicas
  charging one quota do not stay in step. With two replicas behind a balancer, upstream's
  policy ended 8 of 480 pod creates in a burst with a 409 instead of a decision.
* A waiter whose caller has stopped waiting (timeout or cancellation) is dropped before it is
  checked, so the quota is not charged for a request the client was told failed.
* After :meth:`QuotaEvaluator.stop`, requests are refused at once with a 500 instead of timing
  out.

Left out: serving and AdmissionReview parsing (:mod:`tally.webhook.server`, tally's own aiohttp
app, which reaches :meth:`QuotaEvaluator.evaluate` through the runtime's ``admit``), and the
quota view (the :class:`~tally.admission.accessor.QuotaAccessor` passed in).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from tally.admission.accessor import QuotaAccessor
from tally.admission.attributes import Attributes, is_namespace_creation
from tally.admission.checks import Quota, Request, check_batch
from tally.admission.config import Configuration, LimitedResource
from tally.admission.errors import FORBIDDEN, AdmissionDenied, internal_error, unknown_error
from tally.admission.metrics import AdmissionMetrics, NoopAdmissionMetrics, result_label
from tally.admission.overcharges import Overcharges
from tally.admission.waiters import Waiter
from tally.admission.writes import QuotaWriter, WriteResult
from tally.charges import ChargeLedger
from tally.evaluators.base import Evaluator, Operation
from tally.evaluators.registry import Registry, new_registry
from tally.quota.identity import (
    QuotaIdentity,
    QuotaKey,
    is_cluster_quota,
    quota_identity,
    quota_key,
    quota_uid,
)
from tally.workqueue import ItemExponentialFailureRateLimiter, RateLimitingQueue, WorkerPool

__all__ = [
    "CHECK_QUOTAS_RETRIES",
    "CONFLICT_RETRIES",
    "DEFAULT_WORKERS",
    "EVALUATION_TIMEOUT_S",
    "TIMED_OUT",
    "QuotaEvaluator",
]

logger = logging.getLogger(__name__)

DEFAULT_WORKERS: Final = 5
"""Upstream ``NewResourceQuota(configuration, 5)``: lanes checked in parallel."""
EVALUATION_TIMEOUT_S: Final = 10.0
"""Upstream ``Evaluate``'s ``time.After(10 * time.Second)``: how long a request waits for its
verdict, queueing included. The webhook's ``timeoutSeconds`` should not be shorter, or the API
server gives up first and applies the failure policy instead of this 500."""
CHECK_QUOTAS_RETRIES: Final = 3
"""Upstream ``checkAttributes`` calls ``checkQuotas(quotas, admissionAttributes, 3)``: one
attempt plus 3 retries, at most 4 writes of a quota per pass. Here for failures other than a
lost compare-and-swap."""
CONFLICT_RETRIES: Final = 10
"""Retries of a write that lost its compare-and-swap, each against the stored copy read from
the API: another loss needs another writer to land between that read and the write (a few
milliseconds), so ten in a row mean a quota written far faster than one pass can follow; the
10 s evaluation timeout bounds the pass anyway."""
REJUDGE_LIMIT: Final = 3
"""How many times one request's refusal may be set aside because a charge it was judged
against was given back (:meth:`QuotaEvaluator.check_quotas`); each needs a pass whose writes
failed for good, so the limit is never reached in practice; it only bounds the loop."""

CANCEL_WAIT_S: Final = 1.0
"""How long a stop waits, at least, for cancelled workers to end."""
TIMED_OUT: Final = "resource quota evaluation timed out"
SHUTTING_DOWN: Final = "resource quota evaluator is shutting down"
DEFAULT_DENY: Final = "DEFAULT DENY"
"""Upstream's ``defaultDeny``: the verdict of a waiter nothing decided (should never show)."""

Applies = Callable[[Request, Quota], bool]
"""Which quotas bind which request, for a lane that spans namespaces (see ``check_batch``)."""


def resolving_error_message(error: object) -> str:
    """Upstream ``GetQuotas``' ``error resolving quota: %v``."""
    return f"error resolving quota: {error}"


@dataclass
class _Pass:
    """What one pass (:meth:`QuotaEvaluator.check_quotas`) keeps beside its waiters."""

    retries: int
    """Retries left for failures other than a lost compare-and-swap."""
    conflict_retries: int
    """Retries left when every failed write lost its compare-and-swap."""
    conflict_attempt: int = 0
    """Retries spent on lost compare-and-swaps (the pause before the next one grows with it)."""
    refused: list[Waiter] = field(default_factory=list)
    """The waiters the checks refused, in the order they were refused."""
    writing: list[QuotaKey] = field(default_factory=list)
    """The ledger's keys of every status write started (their recalculations wait)."""

    def spend_retry(self, *, conflicts_only: bool) -> bool:
        """Take one retry from the budget that applies; False when it is spent."""
        if conflicts_only:
            if self.conflict_retries <= 0:
                return False
            self.conflict_retries -= 1
            self.conflict_attempt += 1
        else:
            if self.retries <= 0:
                return False
            self.retries -= 1
        return True


class QuotaEvaluator:
    """Decides quota admission for requests, batching them per lane (``quotaEvaluator``).

    Call :meth:`start` on the running loop (or let the first :meth:`evaluate` do it, as
    upstream's ``init.Do(e.start)`` does) and :meth:`stop` at shutdown.
    """

    def __init__(
        self,
        accessor: QuotaAccessor,
        registry: Registry | None = None,
        config: Configuration | None = None,
        *,
        workers: int = DEFAULT_WORKERS,
        timeout: float = EVALUATION_TIMEOUT_S,
        retries: int = CHECK_QUOTAS_RETRIES,
        conflict_retries: int = CONFLICT_RETRIES,
        metrics: AdmissionMetrics | None = None,
        charges: ChargeLedger | None = None,
        lane_of: Callable[[str], str] | None = None,
    ) -> None:
        """``charges``: where the charges of allowed requests wait for their objects (see
        :mod:`tally.charges`); None records nothing. ``lane_of``: the pass a namespace's
        requests join (default: its own). Namespaces that ClusterQuotas bind share one lane,
        so that one pass charges each ClusterQuota once for all of them instead of racing
        passes of every namespace on the same object."""
        self._accessor = accessor
        self._registry = registry if registry is not None else new_registry()
        self._config = config if config is not None else Configuration()
        self._timeout = timeout
        self._retries = retries
        self._conflict_retries = conflict_retries
        self._metrics: AdmissionMetrics = metrics if metrics is not None else NoopAdmissionMetrics()
        self._charges = charges
        self._overcharges = Overcharges()
        self._writer = QuotaWriter(accessor, self._overcharges, self._metrics)
        self._lane_of: Callable[[str], str] = lane_of or (lambda namespace: namespace)
        self.charges_resource_quotas = True
        """False where the cluster's own quota system enforces ResourceQuotas (it runs after
        this webhook): they are then judged, with upstream's checks and words, and never
        written. A request they will refuse is refused before any ClusterQuota is charged."""

        #: Lanes with waiters to check. The queue never hands one lane to two workers at once,
        #: and collapses repeated adds of a lane into one pass. A pass does not fail (every
        #: error is a verdict), so the rate limiter only spaces out a lane whose pass crashed.
        self._queue: RateLimitingQueue[str] = RateLimitingQueue(
            ItemExponentialFailureRateLimiter(0.005, 1.0), name="admission_quota_controller"
        )
        self._pool = WorkerPool(
            self._queue, self._work_on, workers=workers, name="admission-quota", log=logger
        )
        #: Waiters for the next pass of each lane. Every lane with an entry here is in the
        #: queue (queued, or being processed and added again, which re-queues it on ``done``),
        #: so its waiters are always picked up.
        self._work: dict[str, list[Waiter]] = {}
        #: Waiters that arrived while their lane was in progress. Only lanes in
        #: ``_in_progress`` have entries; ``complete_work`` moves them to ``_work``.
        self._dirty_work: dict[str, list[Waiter]] = {}
        #: Lanes a worker is checking now (between ``get_work`` and ``complete_work``).
        self._in_progress: set[str] = set()

        self._started = False
        self._stopping = False

    @property
    def limited_resources(self) -> tuple[LimitedResource, ...]:
        return self._config.limited_resources

    # -- lifecycle --

    def start(self) -> None:
        """Start the workers on the running loop; later calls do nothing."""
        if not self._started:
            self._started = True
            self._pool.start()

    async def stop(self, grace_period: float = EVALUATION_TIMEOUT_S) -> None:
        """Refuse new requests, let the workers finish the passes already queued, then stop.

        Workers still busy ``grace_period`` seconds after the call are cancelled (at 0: at
        once, no queued pass started); their waiters are refused with a 500. Every waiter gets
        a verdict before this returns.
        """
        self._stopping = True
        try:
            # A cancelled worker ends at its next step: a moment, whatever the grace was.
            await self._pool.stop(
                grace_period=grace_period, cancel_timeout=max(grace_period, CANCEL_WAIT_S)
            )
        finally:
            for waiters in (*self._work.values(), *self._dirty_work.values()):
                for waiter in waiters:
                    waiter.resolve(internal_error(SHUTTING_DOWN))
            self._work.clear()
            self._dirty_work.clear()

    # -- the request side --

    async def evaluate(self, attributes: Attributes) -> None:
        """Return if the request is allowed; raise :class:`AdmissionDenied` if not.

        Requests quota does not look at return at once. The others wait for the pass of their
        lane, at most ``timeout`` seconds (then 500 ``resource quota evaluation timed out``).
        """
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        resource = str(attributes.group_resource)
        result = "error"
        try:
            evaluator = self._evaluator_for(attributes)
            if evaluator is None:
                result = "ignored"
                return
            if self._stopping:
                raise internal_error(SHUTTING_DOWN)
            self.start()
            waiter = Waiter(Request(attributes, evaluator), loop.create_future())
            self.add_work(waiter)
            try:
                done, _ = await asyncio.wait({waiter.future}, timeout=self._timeout)
            finally:
                if not waiter.future.done():
                    waiter.abandoned = True
            if not done:
                raise internal_error(TIMED_OUT)
            verdict = waiter.future.result()
            result = result_label(verdict)
            if verdict is not None:
                # A copy per caller: one verdict may be shared by every waiter of a pass.
                raise AdmissionDenied(verdict.code, verdict.message, verdict.reason)
        except AdmissionDenied as denied:
            result = result_label(denied)
            raise
        finally:
            self._metrics.request_finished(resource, result, time.monotonic() - started)

    def _evaluator_for(self, attributes: Attributes) -> Evaluator | None:
        """The evaluator that must check this request, or ``None`` when quota ignores it.

        ``admission.go``'s ``Validate`` and the start of ``Evaluate``, in their order.
        """
        if attributes.operation not in (Operation.CREATE, Operation.UPDATE):
            return None
        if not attributes.namespace or is_namespace_creation(attributes):
            return None
        evaluator = self._registry.get_or_count(attributes.group_resource)
        if evaluator is None:
            return None  # an ignored resource
        try:
            handled = evaluator.handles(
                attributes.operation, attributes.subresource, attributes.old_obj, attributes.obj
            )
        except ValueError as error:
            raise unknown_error(str(error)) from error
        return evaluator if handled else None

    # -- work bookkeeping (upstream addWork / getWork / completeWork) --

    def add_work(self, waiter: Waiter) -> None:
        """Queue ``waiter`` for its lane's next pass (its namespace's, unless ``lane_of``
        says otherwise)."""
        lane = self._lane_of(waiter.request.attributes.namespace)
        self._queue.add(lane)
        if lane in self._in_progress:
            self._dirty_work.setdefault(lane, []).append(waiter)
            return
        self._work.setdefault(lane, []).append(waiter)

    def get_work(self, lane: str) -> list[Waiter]:
        """All waiting requests of ``lane``, which the queue has just handed to a worker; the
        lane is now in progress. Must be followed by :meth:`complete_work` for that lane,
        whatever happens (the list may be empty)."""
        waiters = [w for w in self._work.pop(lane, []) if not w.abandoned]
        for waiter in waiters:
            waiter.requeued = False
        self._dirty_work.pop(lane, None)
        self._in_progress.add(lane)
        return waiters

    def complete_work(self, lane: str) -> None:
        """End the pass of ``lane``: waiters that arrived meanwhile become the next work (the
        worker pool then calls the queue's ``done``, which queues the lane again for them)."""
        dirty = self._dirty_work.pop(lane, [])
        if dirty:
            self._work.setdefault(lane, []).extend(dirty)
        self._in_progress.discard(lane)

    async def _work_on(self, lane: str) -> None:
        """A worker's turn with ``lane`` (the worker pool's sync, between the queue's ``get``
        and ``done``)."""
        waiters = self.get_work(lane)
        try:
            if waiters:
                await self.check_attributes(lane, waiters)
        finally:
            self.complete_work(lane)

    # -- the checks (upstream checkAttributes / checkQuotas) --

    async def check_attributes(self, lane: str, waiters: Sequence[Waiter]) -> None:
        """Check one lane's waiters together; every waiter has a verdict on return, or is
        back in the lane.

        Upstream's default is to deny: a waiter that nothing decided (an unexpected error, or
        cancellation at shutdown) is refused with a 500.
        """
        self._metrics.batch_checked(len(waiters))
        fallback = unknown_error(DEFAULT_DENY)
        try:
            namespaces = sorted({w.namespace for w in waiters})
            try:
                quotas, applies = await self._read_quotas(namespaces)
            except AdmissionDenied as denied:
                fallback = denied
                return
            except Exception as error:
                logger.warning("quota admission: reading quotas of %s failed: %s", lane, error)
                fallback = unknown_error(resolving_error_message(error))
                return
            if not quotas and not self._config.limited_resources:
                # Without quotas and without LimitedResources nothing can be refused.
                for waiter in waiters:
                    waiter.resolve(None)
                return
            await self.check_quotas(lane, quotas, waiters, self._retries, applies=applies)
        except asyncio.CancelledError:
            fallback = internal_error(SHUTTING_DOWN)
            raise
        except Exception as error:
            logger.exception("quota admission: checking lane %s failed", lane)
            fallback = unknown_error(f"resource quota evaluation failed: {error}")
        finally:
            for waiter in waiters:
                if not waiter.requeued:
                    waiter.resolve(fallback)

    async def _read_quotas(self, namespaces: Sequence[str]) -> tuple[list[Quota], Applies | None]:
        """The quotas binding the requests of ``namespaces``, each once (a ClusterQuota's view
        may come from several), and which bind which request (None: one namespace, all)."""
        if len(namespaces) == 1:
            return self._overcharges.without(
                list(await self._accessor.get_quotas(namespaces[0]))
            ), None
        combined: dict[QuotaIdentity, Quota] = {}
        binding: dict[str, set[QuotaIdentity]] = {}
        for namespace in namespaces:
            for quota in await self._accessor.get_quotas(namespace):
                identity = quota_identity(quota)
                combined.setdefault(identity, quota)
                binding.setdefault(namespace, set()).add(identity)

        def applies(request: Request, quota: Quota) -> bool:
            return quota_identity(quota) in binding.get(request.attributes.namespace, set())

        return self._overcharges.without(list(combined.values())), applies

    async def check_quotas(
        self,
        lane: str,
        quotas: Sequence[Quota],
        waiters: Sequence[Waiter],
        remaining_retries: int,
        *,
        applies: Applies | None = None,
    ) -> None:
        """Check ``waiters`` against ``quotas`` and reserve their charges (upstream
        ``checkQuotas``), in the phases numbered below; each waiter then has its verdict, or
        is back in ``lane``. How a phase differs from upstream's: the module docstring."""
        state = _Pass(retries=remaining_retries, conflict_retries=self._conflict_retries)
        for waiter in waiters:
            waiter.begin_pass()
        checking, limited = list(waiters), self._config.limited_resources
        try:
            while True:
                # 1. Check each waiter against the running totals (check_batch): a refusal
                #    waits for the pass's end; a dry run, or a waiter that changes no quota,
                #    is allowed; the others are pending, their charges in the totals.
                changed, pending = self._check_batch(quotas, checking, limited, applies, state)
                # 2. Quotas only judged (the cluster's own quota system charges them) are
                #    never written: if nothing else changed, the pending waiters are allowed.
                changed = [quota for quota in changed if not self._judged_only(quota)]
                if not changed:
                    _allow(pending)
                    return
                # 3. Hold the charges in the ledger before writing them (no recalculation may
                #    erase them), and hold back the written quotas' recalculations until the
                #    pass ends: a retry may still give some charges back.
                self._hold_charges(changed, pending, state)
                # 4. Write every changed quota at once, with the resourceVersion read (compare
                #    and swap); each pending waiter records what the stored statuses hold.
                result = await self._writer.write(changed, pending)
                self._record_writes(pending, result)
                if result.error is None:
                    _allow(pending)
                    return
                # 5. Some writes failed: within the retry budgets, re-read the quotas that
                #    failed (those that lost their compare-and-swap from the API, after a
                #    pause) and check the pending waiters again against those alone; their
                #    other charges are written. Out of retries, refuse them.
                retry = await self._retry(lane, changed, result, pending, state)
                if retry is None:
                    _refuse(pending, result.error)
                    return
                quotas, applies = retry
                checking, limited = [w for w in pending if not w.abandoned], ()
        finally:
            # 6. Deliver the refusals, or send them back to the lane where the pass gave back
            #    a charge they were judged against; give back the charges of the waiters
            #    refused after their write, remember them (overcharges) until the
            #    recalculation lands, and let the held recalculations run.
            try:
                self._deliver_refusals(lane, waiters, state)
                self._settle_charges(waiters)
            finally:
                if self._charges is not None:
                    self._charges.writes_ended(state.writing)

    def _check_batch(
        self,
        quotas: Sequence[Quota],
        waiters: Sequence[Waiter],
        limited: Sequence[LimitedResource],
        applies: Applies | None,
        state: _Pass,
    ) -> tuple[list[Quota], list[Waiter]]:
        """Phase 1: the quotas whose running totals changed, and the pending waiters."""
        batch = check_batch(quotas, [w.request for w in waiters], limited, applies=applies)
        for index, verdict in batch.decisions.items():
            if verdict is None:
                waiters[index].resolve(None)
            else:
                waiters[index].refusal = verdict
                state.refused.append(waiters[index])
        pending = [waiters[index] for index in batch.pending]
        for index, waiter in zip(batch.pending, pending, strict=True):
            waiter.counted = True
            waiter.charging = [
                (batch.quotas[i], amount) for i, amount in batch.charges[index].items()
            ]
        return [batch.quotas[index] for index in batch.changed], pending

    def _hold_charges(self, changed: list[Quota], pending: list[Waiter], state: _Pass) -> None:
        """Phase 3: put what the writes carry for each pending waiter into the ledger, and
        tell it which quotas are being written."""
        if self._charges is None:
            return
        for waiter in pending:
            amounts = {
                quota_key(quota, waiter.namespace): amount
                for quota, amount in waiter.charging
                if not self._judged_only(quota)
            }
            if waiter.charge is None:
                if amounts:  # else it charged only quotas tally does not write
                    waiter.charge = self._charges.record(*waiter.charged_object(), amounts)
            else:
                for key, amount in amounts.items():
                    self._charges.amend(waiter.charge, key, amount)
        # Until the pass ends, the controllers' recalculations of these quotas wait: they
        # cannot tell whether the status they read holds these charges, nor which of them a
        # retry will give back.
        state.writing.extend(self._charges.writes_started(quota_key(q) for q in changed))

    def _record_writes(self, pending: list[Waiter], result: WriteResult) -> None:
        """Phase 4: what each stored status holds of each pending waiter's charge; what a
        failed write carried leaves the ledger (a retry charges it again)."""
        ledger = self._charges
        for waiter in pending:
            for quota, amount in waiter.charging:
                identity = quota_identity(quota)
                version = result.stored.get(identity)
                if version is not None:
                    waiter.written[identity] = (version, amount)
                elif identity in result.failed and ledger is not None and waiter.charge is not None:
                    ledger.amend(waiter.charge, quota_key(quota, waiter.namespace), None)

    async def _retry(
        self,
        lane: str,
        changed: list[Quota],
        result: WriteResult,
        pending: list[Waiter],
        state: _Pass,
    ) -> tuple[list[Quota], Applies | None] | None:
        """Phase 5: the fresh copies of the quotas whose write failed (a quota deleted
        meanwhile is skipped) and which bind which waiter; None when no retry is left or the
        quotas cannot be read, or when a status was refused for its size (the same charges
        would make it as large again). Lost compare-and-swaps alone have their own, larger
        budget."""
        if result.too_large:
            return None
        if not state.spend_retry(conflicts_only=result.failed <= result.lost):
            return None
        self._metrics.retried()
        if result.lost:
            lost = [quota for quota in changed if quota_identity(quota) in result.lost]
            await self._writer.refresh(lost, state.conflict_attempt)
        try:
            fresh, applies = await self._read_quotas(sorted({w.namespace for w in pending}))
        except Exception as error:
            logger.warning("quota admission: re-reading quotas of %s failed: %s", lane, error)
            return None
        return [
            quota
            for quota in fresh
            if quota_identity(quota) in result.failed
            and (quota_identity(quota), quota_uid(quota)) not in result.gone
        ], applies

    def _deliver_refusals(self, lane: str, waiters: Sequence[Waiter], state: _Pass) -> None:
        """Resolve the pass's refusals, or, where the pass gave back a charge (a request whose
        charge joined the running totals ended refused or abandoned), put its quota refusals
        (403) back into the lane: each may have been judged against that charge. A request
        goes back at most :data:`REJUDGE_LIMIT` times, and never while stopping."""
        gave_back = any(waiter.counted and waiter.gave_back for waiter in waiters)
        again = 0
        for waiter in state.refused:
            verdict = waiter.refusal or unknown_error(DEFAULT_DENY)
            if (
                gave_back
                and verdict.code == FORBIDDEN
                and waiter.rejudged < REJUDGE_LIMIT
                and not waiter.abandoned
                and not self._stopping
            ):
                waiter.rejudged += 1
                waiter.requeued = True
                self.add_work(waiter)
                again += 1
            else:
                waiter.resolve(verdict)
        if again:
            self._metrics.rejudged(again)
            logger.info(
                "quota admission: %d refusal(s) in %s judged again: the pass gave back a charge "
                "they were judged against", again, lane,
            )  # fmt: skip

    def _settle_charges(self, waiters: Sequence[Waiter]) -> None:
        """At the end of a pass: an allowed request's charge waits for its object; a request
        refused after part of its charge was written (or whose caller stopped waiting: the API
        server has refused it) gives back what was written, at once, and the statuses holding
        it are judged without it meanwhile."""
        for waiter in waiters:
            if not waiter.gave_back:
                continue
            if self._charges is not None and waiter.charge is not None:
                self._charges.withdraw(waiter.charge)
                self._charges.release_now(waiter.charge.amounts)
            for identity, (version, amount) in waiter.written.items():
                self._overcharges.add(identity, version, amount, waiter.namespace)

    def _judged_only(self, quota: Quota) -> bool:
        return not self.charges_resource_quotas and not is_cluster_quota(quota)


def _allow(waiters: Sequence[Waiter]) -> None:
    for waiter in waiters:
        waiter.resolve(None)


def _refuse(waiters: Sequence[Waiter], error: AdmissionDenied) -> None:
    for waiter in waiters:
        waiter.resolve(error)
