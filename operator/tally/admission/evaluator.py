"""Quota admission's engine: per-namespace batching, compare-and-swap reservation, retries.

This module owns upstream's ``quotaEvaluator`` (``apiserver/pkg/admission/plugin/resourcequota/
controller.go``) and the request filtering of ``admission.go``'s ``Validate``, on one asyncio
event loop:

* :meth:`QuotaEvaluator.evaluate` filters the request (CREATE and UPDATE only; cluster-scoped
  objects and Namespace creation skipped; ignored resources skipped; the evaluator's
  ``handles`` decides, which is where subresources are filtered), then queues a *waiter* for the
  request's namespace and waits at most 10 s for its verdict.
* N workers (5 by default, as upstream) take namespaces off a :class:`~tally.workqueue.Queue`,
  which never hands one namespace to two workers at once. A worker checks **all** waiters of its
  namespace in one pass against one read of the quotas, and writes each changed quota once: a
  burst of pod creates in a namespace costs one status write per quota per pass, not one per
  pod. Waiters that arrive while their namespace is being worked on wait for the next pass
  (``dirty_work``); this is the workqueue's dirty/processing idea keyed by namespace.
* The charge is reserved by writing the quota's status with the resourceVersion that was read
  (compare and swap). A write that fails is retried against a fresh read, up to 3 times; one
  that lost its compare-and-swap, up to 10 times, against the stored copy read from the API,
  after a short random pause. A request is allowed only after every quota it charges has been
  written, so the quotas' ``status.used`` never admits more than ``status.hard``, however many
  webhook replicas or workers race.

* Every charge is put into the charge ledger (:mod:`tally.charges`) before it is written, so
  that no recalculation erases it; when the pass ends, an allowed request's charge waits there
  for its object, and a request refused after part of its charge was written (or whose caller
  stopped waiting) gives that part back at once.
* A quota whose status holds such a charge is judged without it by this process's next
  passes (:class:`_Overcharges`) for as long as its status is the version that write stored:
  the recalculation that gives the charge back takes a moment, and the next request of the
  namespace would otherwise be refused against usage that no object makes up.

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

Left out: serving, AdmissionReview parsing and the Kopf handler (the webhook adapter), and the
quota view (the :class:`~tally.admission.accessor.QuotaAccessor` passed in).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from tally.admission.accessor import Conflict, QuotaAccessor
from tally.admission.attributes import Attributes, is_namespace_creation, resource_version
from tally.admission.checks import BatchResult, Quota, Request, check_batch
from tally.admission.config import Configuration, LimitedResource
from tally.admission.errors import (
    CONFLICT,
    FORBIDDEN,
    AdmissionDenied,
    internal_error,
    unknown_error,
)
from tally.charges import Charge, ChargeLedger, ObjectRef
from tally.evaluators.base import Evaluator, Operation
from tally.evaluators.registry import Registry, new_registry
from tally.quota import resources
from tally.quota.identity import (
    QuotaIdentity,
    QuotaKey,
    is_cluster_quota,
    quota_identity,
    quota_key,
    quota_name,
)
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList
from tally.workqueue import Queue, ShutDown, start_watched

__all__ = [
    "CHECK_QUOTAS_RETRIES",
    "CONFLICT_RETRIES",
    "DEFAULT_WORKERS",
    "EVALUATION_TIMEOUT_S",
    "TIMED_OUT",
    "AdmissionMetrics",
    "CountingAdmissionMetrics",
    "NoopAdmissionMetrics",
    "QuotaEvaluator",
    "conflict_message",
]

logger = logging.getLogger(__name__)

DEFAULT_WORKERS: Final = 5
"""Upstream ``NewResourceQuota(configuration, 5)``: namespaces checked in parallel."""
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
CONFLICT_BACKOFF_S: Final = 0.005
"""The first retry after a lost compare-and-swap waits up to this long (uniformly at random),
each further retry up to twice as long, capped at :data:`CONFLICT_BACKOFF_MAX_S`: replicas
whose passes collided then write at different moments."""
CONFLICT_BACKOFF_MAX_S: Final = 0.1
REJUDGE_LIMIT: Final = 3
"""How many times one request's refusal may be set aside because a charge it was judged
against was given back (:meth:`QuotaEvaluator.check_quotas`); each needs a pass whose writes
failed for good, so the limit is never reached in practice; it only bounds the loop."""
OVERCHARGE_MEMORY_S: Final = 60.0
"""How long a charge written for a request that was then refused is remembered for the
version of its quota that holds it: far longer than the recalculation that replaces that
version takes, short enough that the memory stays small."""

CANCEL_WAIT_S: Final = 1.0
"""How long a stop waits for cancelled workers to end."""
TIMED_OUT: Final = "resource quota evaluation timed out"
SHUTTING_DOWN: Final = "resource quota evaluator is shutting down"
DEFAULT_DENY: Final = "DEFAULT DENY"
"""Upstream's ``defaultDeny``: the verdict of a waiter nothing decided (should never show)."""


def conflict_message(name: str, resource: str = "resourcequotas") -> str:
    """The API server's 409 text for a status write that lost its compare-and-swap."""
    return (
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )


def _resource_of(quota: Quota) -> str:
    return "clusterquotas.tally.dev" if is_cluster_quota(quota) else "resourcequotas"


def resolving_error_message(error: object) -> str:
    """Upstream ``GetQuotas``' ``error resolving quota: %v``."""
    return f"error resolving quota: {error}"


# -- metrics --


class AdmissionMetrics(Protocol):
    """Hooks for admission metrics; every method is called on the event loop and must not block.

    ``result`` is one of ``allowed``, ``ignored`` (nothing to check), ``forbidden`` (403),
    ``conflict`` (409) or ``error`` (500, including timeouts).
    """

    def request_finished(self, resource: str, result: str, seconds: float) -> None:
        """A call to ``evaluate`` ended; ``resource`` is ``str(GroupResource)``."""
        ...

    def batch_checked(self, size: int) -> None:
        """A pass checked ``size`` waiters of one namespace together."""
        ...

    def write_conflicted(self) -> None:
        """A quota status write lost its compare-and-swap (409)."""
        ...

    def retried(self) -> None:
        """A pass re-read its quotas to retry failed writes."""
        ...

    def rejudged(self, count: int) -> None:
        """A pass put ``count`` refusals back into their lane: it gave back a charge they
        were judged against."""
        ...


class NoopAdmissionMetrics:
    """Records nothing (the default)."""

    def request_finished(self, resource: str, result: str, seconds: float) -> None:
        pass

    def batch_checked(self, size: int) -> None:
        pass

    def write_conflicted(self) -> None:
        pass

    def retried(self) -> None:
        pass

    def rejudged(self, count: int) -> None:
        pass


@dataclass
class CountingAdmissionMetrics:
    """Plain counters, for tests and for a Prometheus adapter to read."""

    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    batch_sizes: list[int] = field(default_factory=list)
    conflicts: int = 0
    retries: int = 0
    rejudged_refusals: int = 0

    def request_finished(self, resource: str, result: str, seconds: float) -> None:
        key = (resource, result)
        self.requests[key] = self.requests.get(key, 0) + 1

    def batch_checked(self, size: int) -> None:
        self.batch_sizes.append(size)

    def write_conflicted(self) -> None:
        self.conflicts += 1

    def retried(self) -> None:
        self.retries += 1

    def rejudged(self, count: int) -> None:
        self.rejudged_refusals += count


_: type[AdmissionMetrics] = NoopAdmissionMetrics
_ = CountingAdmissionMetrics


def _result_label(denied: AdmissionDenied | None) -> str:
    if denied is None:
        return "allowed"
    if denied.code == FORBIDDEN:
        return "forbidden"
    if denied.code == CONFLICT:
        return "conflict"
    return "error"


# -- waiters --


@dataclass(eq=False)
class _Waiter:
    """One request waiting for its verdict (upstream ``admissionWaiter``)."""

    request: Request
    future: asyncio.Future[AdmissionDenied | None]
    """Resolved exactly once, with ``None`` (allowed) or the refusal; never with an exception,
    so a verdict nobody awaits any more (a timed-out caller) is not an unretrieved error."""
    abandoned: bool = False
    """Set when the caller stopped waiting; the worker then drops the waiter unchecked, or
    stops re-checking it."""
    rejudged: int = 0
    """How many times a refusal of this request was set aside for a later pass
    (:data:`REJUDGE_LIMIT`)."""
    requeued: bool = False
    """Put back into its lane by the pass now ending: that pass leaves it unresolved."""

    def resolve(self, verdict: AdmissionDenied | None) -> None:
        if not self.future.done():
            self.future.set_result(verdict)


@dataclass
class _Pass:
    """What one pass (:meth:`QuotaEvaluator.check_quotas`) records for its end."""

    charges: dict[int, Charge] = field(default_factory=dict)
    """Per waiter, its charge in the ledger: what it is reserving or has reserved in each
    quota's status (a waiter refused later may have some)."""
    written: dict[int, dict[QuotaIdentity, tuple[str, ResourceList]]] = field(default_factory=dict)
    """Per waiter, what of its charge each quota's stored status holds, and that status's
    resourceVersion."""
    writing: list[QuotaKey] = field(default_factory=list)
    """The ledger's keys of every status write started (their recalculations wait)."""
    refusals: dict[int, AdmissionDenied] = field(default_factory=dict)
    """Per waiter, the refusal the checks gave it, delivered when the pass ends."""
    counted: set[int] = field(default_factory=set)
    """Waiters whose charges joined the running totals (pending at some point)."""


@dataclass
class _Overcharge:
    version: str
    """The quota's ``metadata.resourceVersion`` whose ``status.used`` holds ``amounts``."""
    amounts: dict[str, Quantity]
    since: float
    by_namespace: dict[str, dict[str, Quantity]] = field(default_factory=dict)
    """``amounts`` by the namespace of the requests they were charged for: a ClusterQuota's
    status keeps each namespace's share."""


class _Overcharges:
    """Charges this process wrote into quotas' statuses for requests it then refused.

    A pass writes every changed quota at once; when one write is lost and the retry refuses a
    request, that request's charge is already in the other quotas' statuses until the
    recalculation the ledger asks for lands. Judging the next requests against such a status,
    minus those charges, is exact as long as the status read is the very version the write
    stored (``metadata.resourceVersion``): a write that follows carries that version, so if
    anyone changed the quota meanwhile it fails its compare-and-swap and is judged again
    against the newer status, which this never touches.

    A ClusterQuota's view is judged the same way; its status also keeps each namespace's
    share, which a lower total alone would contradict, so the write that follows lowers the
    shares by the same charges (:meth:`given_back`).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_quota: dict[QuotaIdentity, _Overcharge] = {}

    def __len__(self) -> int:
        return len(self._by_quota)

    def add(
        self,
        identity: QuotaIdentity,
        version: str,
        amounts: Mapping[str, Quantity],
        namespace: str = "",
    ) -> None:
        """``amounts`` in the status ``version`` of quota ``identity``, charged for a request
        of ``namespace``, charged nothing real."""
        if not version:
            return
        now = self._clock()
        self._forget_before(now - OVERCHARGE_MEMORY_S)
        known = self._by_quota.get(identity)
        if known is None or known.version != version:
            known = self._by_quota[identity] = _Overcharge(version, {}, now)
        known.amounts = resources.add(known.amounts, amounts)
        known.by_namespace[namespace] = resources.add(
            known.by_namespace.get(namespace, {}), amounts
        )

    def given_back(self, quota: Quota) -> dict[str, dict[str, Quantity]]:
        """By namespace, what :meth:`without` took out of ``quota``'s status (nothing unless
        ``quota`` is the version that holds it)."""
        known = self._by_quota.get(quota_identity(quota))
        if known is None or resource_version(quota) != known.version:
            return {}
        return {namespace: dict(amounts) for namespace, amounts in known.by_namespace.items()}

    def without(self, quotas: list[Quota]) -> list[Quota]:
        """``quotas``, each whose status is a version holding overcharges without them."""
        if not self._by_quota:
            return quotas
        self._forget_before(self._clock() - OVERCHARGE_MEMORY_S)
        return [self._less(quota) for quota in quotas]

    def _less(self, quota: Quota) -> Quota:
        known = self._by_quota.get(quota_identity(quota))
        if known is None or resource_version(quota) != known.version:
            return quota
        status = quota.get("status")
        if not isinstance(status, Mapping):
            return quota
        try:
            used = resources.parse_resource_list(status.get("used"), "status.used")
        except resources.ResourceListError:
            return quota  # the checks refuse it in their own words
        less = resources.subtract_non_negative(used, resources.mask(known.amounts, used))
        return {**quota, "status": {**status, "used": resources.to_strings(less)}}

    def _forget_before(self, moment: float) -> None:
        for identity in [i for i, o in self._by_quota.items() if o.since < moment]:
            del self._by_quota[identity]


class QuotaEvaluator:
    """Decides quota admission for requests, batching them per namespace (``quotaEvaluator``).

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
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._accessor = accessor
        self._registry = registry if registry is not None else new_registry()
        self._config = config if config is not None else Configuration()
        self._workers = workers
        self._timeout = timeout
        self._retries = retries
        self._conflict_retries = conflict_retries
        self._metrics: AdmissionMetrics = metrics if metrics is not None else NoopAdmissionMetrics()
        self._charges = charges
        self._overcharges = _Overcharges()
        self._lane_of: Callable[[str], str] = lane_of or (lambda namespace: namespace)
        self.charges_resource_quotas = True
        """False where the cluster's own quota system enforces ResourceQuotas (it runs after
        this webhook): they are then judged, with upstream's checks and words, and never
        written. A request they will refuse is refused before any ClusterQuota is charged."""

        #: Namespaces with waiters to check. The queue never hands one namespace to two
        #: workers at once, and collapses repeated adds of a namespace into one pass.
        self._queue: Queue[str] = Queue(name="admission_quota_controller")
        #: Waiters for the next pass of each namespace. Every namespace with an entry here is
        #: in the queue (queued, or being processed and added again, which re-queues it on
        #: ``done``), so its waiters are always picked up.
        self._work: dict[str, list[_Waiter]] = {}
        #: Waiters that arrived while their namespace was in progress. Only namespaces in
        #: ``_in_progress`` have entries; ``complete_work`` moves them to ``_work``.
        self._dirty_work: dict[str, list[_Waiter]] = {}
        #: Namespaces a worker is checking now (between ``get_work`` and ``complete_work``).
        self._in_progress: set[str] = set()

        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._stopping = False

    @property
    def limited_resources(self) -> tuple[LimitedResource, ...]:
        return self._config.limited_resources

    # -- lifecycle --

    def start(self) -> None:
        """Start the workers on the running loop; later calls do nothing."""
        if self._started:
            return
        self._started = True
        for index in range(self._workers):
            task = start_watched(
                self._run_worker(),
                name=f"admission-quota-worker-{index}",
                logger=logger,
                level=logging.ERROR,
                # A worker runs until stop: say loudly when one ends any other way (a crash,
                # even while stopping).
                died="quota admission: worker %(task)s crashed; one worker fewer",
                ended="quota admission: worker %(task)s exited unexpectedly",
                cancelled="quota admission: worker %(task)s was cancelled",
                stopping=lambda: self._stopping,
            )
            self._tasks.append(task)

    async def stop(self, grace_period: float = EVALUATION_TIMEOUT_S) -> None:
        """Refuse new requests, let the workers finish the passes already queued, then stop.

        Workers still busy after ``grace_period`` seconds are cancelled; their waiters are
        refused with a 500. Every waiter gets a verdict before this returns.
        """
        self._stopping = True
        try:
            # A drain with nothing in progress returns before the timeout can fire, also at 0.
            async with asyncio.timeout(grace_period):
                await self._queue.shut_down_with_drain()
        except TimeoutError:
            logger.warning("quota admission: passes still running after %g s", grace_period)
            self._queue.shut_down()
        pending = {task for task in self._tasks if not task.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=grace_period)
        for task in pending:
            task.cancel()
        if pending:
            # A cancelled worker ends at its next step: a moment, whatever the grace was.
            _, hanging = await asyncio.wait(pending, timeout=max(grace_period, CANCEL_WAIT_S))
            for task in hanging:
                logger.error("quota admission: worker %s will not stop", task.get_name())
        for waiters in (*self._work.values(), *self._dirty_work.values()):
            for waiter in waiters:
                waiter.resolve(internal_error(SHUTTING_DOWN))
        self._work.clear()
        self._dirty_work.clear()

    # -- the request side --

    async def evaluate(self, attributes: Attributes) -> None:
        """Return if the request is allowed; raise :class:`AdmissionDenied` if not.

        Requests quota does not look at return at once. The others wait for the pass of their
        namespace, at most ``timeout`` seconds (then 500 ``resource quota evaluation timed
        out``).
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
            waiter = _Waiter(Request(attributes, evaluator), loop.create_future())
            self.add_work(waiter)
            try:
                done, _ = await asyncio.wait({waiter.future}, timeout=self._timeout)
            finally:
                if not waiter.future.done():
                    waiter.abandoned = True
            if not done:
                raise internal_error(TIMED_OUT)
            verdict = waiter.future.result()
            result = _result_label(verdict)
            if verdict is not None:
                # A copy per caller: one verdict may be shared by every waiter of a pass.
                raise AdmissionDenied(verdict.code, verdict.message, verdict.reason)
        except AdmissionDenied as denied:
            result = _result_label(denied)
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

    def add_work(self, waiter: _Waiter) -> None:
        """Queue ``waiter`` for its lane's next pass (its namespace's, unless ``lane_of``
        says otherwise)."""
        namespace = self._lane_of(waiter.request.attributes.namespace)
        self._queue.add(namespace)
        if namespace in self._in_progress:
            self._dirty_work.setdefault(namespace, []).append(waiter)
            return
        self._work.setdefault(namespace, []).append(waiter)

    async def get_work(self) -> tuple[str, list[_Waiter]]:
        """The next namespace and all its waiting requests; the namespace is now in progress.

        Every return must be followed by :meth:`complete_work` for that namespace, whatever
        happens (the list may be empty). Raises :class:`~tally.workqueue.ShutDown` after
        :meth:`stop` once nothing is queued.
        """
        namespace = await self._queue.get()
        waiters = [w for w in self._work.pop(namespace, []) if not w.abandoned]
        for waiter in waiters:
            waiter.requeued = False
        self._dirty_work.pop(namespace, None)
        self._in_progress.add(namespace)
        return namespace, waiters

    def complete_work(self, namespace: str) -> None:
        """End the pass of ``namespace``: waiters that arrived meanwhile become the next work."""
        self._queue.done(namespace)
        dirty = self._dirty_work.pop(namespace, [])
        if dirty:
            self._work.setdefault(namespace, []).extend(dirty)
        self._in_progress.discard(namespace)

    async def _run_worker(self) -> None:
        while True:
            try:
                namespace, waiters = await self.get_work()
            except ShutDown:
                return
            try:
                if waiters:
                    await self.check_attributes(namespace, waiters)
            finally:
                self.complete_work(namespace)

    # -- the checks (upstream checkAttributes / checkQuotas) --

    async def check_attributes(self, namespace: str, waiters: Sequence[_Waiter]) -> None:
        """Check one lane's waiters together (``namespace``: the lane, usually one
        namespace); every waiter has a verdict on return.

        Upstream's default is to deny: a waiter that nothing decided (an unexpected error, or
        cancellation at shutdown) is refused with a 500.
        """
        self._metrics.batch_checked(len(waiters))
        fallback = unknown_error(DEFAULT_DENY)
        try:
            namespaces = sorted({w.request.attributes.namespace for w in waiters})
            try:
                quotas, applies = await self._read_quotas(namespaces)
            except AdmissionDenied as denied:
                fallback = denied
                return
            except Exception as error:
                logger.warning("quota admission: reading quotas of %s failed: %s", namespace, error)
                fallback = unknown_error(resolving_error_message(error))
                return
            if not quotas and not self._config.limited_resources:
                # Without quotas and without LimitedResources nothing can be refused.
                for waiter in waiters:
                    waiter.resolve(None)
                return
            await self.check_quotas(namespace, quotas, waiters, self._retries, applies=applies)
        except asyncio.CancelledError:
            fallback = internal_error(SHUTTING_DOWN)
            raise
        except Exception as error:
            logger.exception("quota admission: checking namespace %s failed", namespace)
            fallback = unknown_error(f"resource quota evaluation failed: {error}")
        finally:
            for waiter in waiters:
                if not waiter.requeued:
                    waiter.resolve(fallback)

    async def _read_quotas(
        self, namespaces: Sequence[str]
    ) -> tuple[list[Quota], Callable[[Request, Quota], bool] | None]:
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
        namespace: str,
        quotas: Sequence[Quota],
        waiters: Sequence[_Waiter],
        remaining_retries: int,
        *,
        applies: Callable[[Request, Quota], bool] | None = None,
    ) -> None:
        """Check ``waiters`` against ``quotas`` and reserve their charges. In phases:

        1. Check each waiter against the running quotas (``check_batch``): a refused waiter
           gets its error at once and does not change the totals; a dry-run waiter is judged
           and never added; a waiter that changes no quota is allowed at once; the others are
           *pending* and their charges join the totals.
        2. If no quota changed, return: every waiter has its verdict.
        3. Write every changed quota's status, carrying the resourceVersion read (compare and
           swap). If all writes succeed, allow the pending waiters and return.
        4. If some writes failed and no retries remain, or the quotas cannot be re-read, refuse
           the pending waiters with the last write error (409 for a conflict) and return.
           Lost compare-and-swaps alone have their own, larger budget of retries
           (``conflict_retries``); any other failure counts against ``remaining_retries``.
        5. Otherwise re-read the namespace's quotas (those whose write lost its compare-and-swap
           from the API, after a short random pause), keep only those whose write failed (by
           name; a quota deleted meanwhile is skipped), and go back to 1 with the pending
           waiters only. Their other charges are already written, so checking them against the
           retried quotas alone is enough.

        Refusals are delivered when the pass ends. One made against running totals that held
        the charge of another request of the pass, which the pass then refused after all (its
        writes failed for good, or a retry found a quota full), was judged against usage that
        nothing makes up: when the pass gave back any charge, its quota refusals go back to the
        lane instead (:meth:`_deliver_refusals`), judged again by the next pass against
        statuses without that charge (:class:`_Overcharges`, then the recalculation).

        The controllers' recalculations of the quotas the pass writes wait until the pass ends,
        not only until each write lands: one running during a retry would count the charges it
        still holds into a new status version, including those of requests the retry then
        refuses, and the next pass would judge against that version, which the overcharge
        memory does not know.
        """
        state = _Pass()
        try:
            await self._check_quotas(namespace, quotas, waiters, remaining_retries, applies, state)
        finally:
            try:
                self._deliver_refusals(namespace, waiters, state)
                self._settle_charges(waiters, state.charges)
                for index, amounts in state.written.items():
                    if _gave_back(waiters[index]):
                        for identity, (version, amount) in amounts.items():
                            self._overcharges.add(
                                identity, version, amount, _namespace(waiters[index])
                            )
            finally:
                if self._charges is not None:
                    self._charges.writes_ended(state.writing)

    def _deliver_refusals(self, lane: str, waiters: Sequence[_Waiter], state: _Pass) -> None:
        """Resolve the pass's refusals, or, where the pass gave back a charge (a request whose
        charge joined the running totals ended refused or abandoned), put its quota refusals
        (403) back into the lane: each may have been judged against that charge. A request
        goes back at most :data:`REJUDGE_LIMIT` times, and never while stopping."""
        gave_back = any(_gave_back(waiters[index]) for index in state.counted)
        again = 0
        for index, verdict in state.refusals.items():
            waiter = waiters[index]
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

    async def _check_quotas(
        self,
        namespace: str,
        quotas: Sequence[Quota],
        waiters: Sequence[_Waiter],
        remaining_retries: int,
        applies: Callable[[Request, Quota], bool] | None,
        state: _Pass,
    ) -> None:
        """:meth:`check_quotas`' phases, recording in ``state`` (see :class:`_Pass`)."""
        charges, written = state.charges, state.written
        requests = [waiter.request for waiter in waiters]
        limited: Sequence[LimitedResource] = self._config.limited_resources
        conflict_retries = self._conflict_retries
        to_check: list[int] | None = None
        while True:
            # Phase 1.
            batch = check_batch(quotas, requests, limited, check=to_check, applies=applies)
            for index, verdict in batch.decisions.items():
                if verdict is None:
                    waiters[index].resolve(None)
                else:
                    state.refusals[index] = verdict
            pending = batch.pending
            state.counted.update(pending)
            # Phase 2. Quotas judged only (the cluster's own quota system charges them) are
            # never written: a request that changed nothing else is allowed now.
            writes = [i for i in batch.changed if not self._judged_only(batch.quotas[i])]
            if not writes:
                for index in pending:
                    waiters[index].resolve(None)
                return
            # Phase 3. The ledger holds the charges from before the writes: a recalculation
            # running while they are in flight, or before this pass ends, must not erase them.
            self._hold_charges(batch, waiters, charges)
            # Until the pass ends, the controllers' recalculations of these quotas wait: they
            # cannot tell whether the status they read holds these charges, nor which of them
            # a retry will give back (check_quotas ends the writes).
            if self._charges is not None:
                state.writing.extend(
                    self._charges.writes_started(_written_key(batch.quotas[i]) for i in writes)
                )
            stored, failed, lost, last_error = await self._write(batch, writes, waiters)
            for index in pending:
                for quota_index, amount in batch.charges[index].items():
                    charged = batch.quotas[quota_index]
                    version = stored.get(quota_identity(charged))
                    if version is not None:
                        written.setdefault(index, {})[quota_identity(charged)] = (version, amount)
            if self._charges is not None:
                for index in pending:
                    for quota_index in batch.charges[index]:
                        charged = batch.quotas[quota_index]
                        if quota_identity(charged) in failed:
                            self._charges.amend(
                                charges[index], quota_key(charged, _namespace(waiters[index])), None
                            )
            if last_error is None:
                for index in pending:
                    waiters[index].resolve(None)
                return
            # Phase 4.
            conflicts_only = all(identity in lost for identity in failed)
            if conflicts_only:
                if conflict_retries <= 0:
                    self._refuse(waiters, pending, last_error)
                    return
                conflict_retries -= 1
            else:
                if remaining_retries <= 0:
                    self._refuse(waiters, pending, last_error)
                    return
                remaining_retries -= 1
            self._metrics.retried()
            if lost:
                await self._refresh(batch, lost, self._conflict_retries - conflict_retries)
            try:
                fresh, applies = await self._read_quotas(
                    sorted({_namespace(waiters[index]) for index in pending})
                )
            except Exception as error:
                logger.warning(
                    "quota admission: re-reading quotas of %s failed: %s", namespace, error
                )
                self._refuse(waiters, pending, last_error)
                return
            # Phase 5.
            quotas = [q for q in fresh if quota_identity(q) in failed]
            to_check = [index for index in pending if not waiters[index].abandoned]
            limited = ()

    def _hold_charges(
        self,
        batch: BatchResult,
        waiters: Sequence[_Waiter],
        charges: dict[int, Charge],
    ) -> None:
        """Put what this pass is about to write for each pending waiter into the ledger."""
        if self._charges is None:
            return
        for index in batch.pending:
            amounts = {
                quota_key(batch.quotas[quota_index], _namespace(waiters[index])): amount
                for quota_index, amount in batch.charges[index].items()
                if not self._judged_only(batch.quotas[quota_index])
            }
            charge = charges.get(index)
            if charge is None:
                if not amounts:
                    continue  # it charged only quotas tally does not write
                charges[index] = self._charges.record(*_charged_object(waiters[index]), amounts)
            else:
                for key, amount in amounts.items():
                    self._charges.amend(charge, key, amount)

    def _settle_charges(self, waiters: Sequence[_Waiter], charges: Mapping[int, Charge]) -> None:
        """At the end of a pass: an allowed request's charge waits for its object; a request
        refused after part of its charge was written (or whose caller stopped waiting: the API
        server has refused it) gives back what was written, at once."""
        if self._charges is None:
            return
        for index, charge in charges.items():
            if not _gave_back(waiters[index]):
                continue
            self._charges.withdraw(charge)
            self._charges.release_now(charge.amounts)

    async def _update(self, index: int, batch: BatchResult, waiters: Sequence[_Waiter]) -> Quota:
        """Write one changed quota; a ClusterQuota's view with each namespace's share."""
        quota = batch.quotas[index]
        if not is_cluster_quota(quota):
            return await self._accessor.update_quota_status(quota)
        shares: dict[str, dict[str, Quantity]] = {}
        for request_index in batch.pending:
            amount = batch.charges[request_index].get(index)
            if amount:
                namespace = _namespace(waiters[request_index])
                shares[namespace] = resources.add(shares.get(namespace, {}), amount)
        return await self._accessor.update_quota_status(
            quota,
            charged_by_namespace=shares,
            given_back_by_namespace=self._overcharges.given_back(quota),
        )

    def _judged_only(self, quota: Quota) -> bool:
        return not self.charges_resource_quotas and not is_cluster_quota(quota)

    @staticmethod
    def _refuse(waiters: Sequence[_Waiter], indexes: Sequence[int], error: AdmissionDenied) -> None:
        for index in indexes:
            waiters[index].resolve(error)

    async def _refresh(self, batch: BatchResult, lost: set[QuotaIdentity], attempt: int) -> None:
        """Before retry ``attempt`` (1, 2, …): pause at random, then fetch the quotas whose
        write lost its compare-and-swap from the API (a failed fetch leaves the cached copy)."""
        pause = min(CONFLICT_BACKOFF_MAX_S, CONFLICT_BACKOFF_S * 2 ** (attempt - 1))
        await asyncio.sleep(random.uniform(0, pause))
        quotas = [q for q in batch.quotas if quota_identity(q) in lost]
        results = await asyncio.gather(
            *(self._accessor.refresh(q) for q in quotas), return_exceptions=True
        )
        for quota, outcome in zip(quotas, results, strict=True):
            if isinstance(outcome, Exception):
                logger.warning(
                    "quota admission: reading quota %s after a conflict failed: %s",
                    quota_name(quota), outcome,
                )  # fmt: skip
            elif isinstance(outcome, BaseException):
                raise outcome

    async def _write(
        self, batch: BatchResult, changed: Sequence[int], waiters: Sequence[_Waiter]
    ) -> tuple[
        dict[QuotaIdentity, str],
        set[QuotaIdentity],
        set[QuotaIdentity],
        AdmissionDenied | None,
    ]:
        """Write the quotas ``changed`` indexes at once; the resourceVersion stored by each
        that was written (by identity), the identities of those that failed, of those among
        them that lost their compare-and-swap, and the last failure."""
        quotas = batch.quotas
        results = await asyncio.gather(
            *(self._update(index, batch, waiters) for index in changed),
            return_exceptions=True,
        )
        stored: dict[QuotaIdentity, str] = {}
        failed: set[QuotaIdentity] = set()
        lost: set[QuotaIdentity] = set()
        last_error: AdmissionDenied | None = None
        for index, outcome in zip(changed, results, strict=True):
            if not isinstance(outcome, BaseException):
                stored[quota_identity(quotas[index])] = resource_version(outcome)
                continue
            name = quota_name(quotas[index])
            if isinstance(outcome, Conflict):
                self._metrics.write_conflicted()
                lost.add(quota_identity(quotas[index]))
                last_error = AdmissionDenied(
                    CONFLICT, conflict_message(name, _resource_of(quotas[index]))
                )
            elif isinstance(outcome, AdmissionDenied):
                last_error = outcome
            elif isinstance(outcome, Exception):
                logger.warning("quota admission: writing quota %s failed: %r", name, outcome)
                last_error = unknown_error(str(outcome) or type(outcome).__name__)
            else:
                raise outcome  # CancelledError and friends
            failed.add(quota_identity(quotas[index]))
        return stored, failed, lost, last_error


def _gave_back(waiter: _Waiter) -> bool:
    """Whether what was written for ``waiter`` charges nothing: it was refused, or its caller
    stopped waiting (the API server has refused it)."""
    allowed = waiter.future.done() and waiter.future.result() is None
    return waiter.abandoned or not allowed


def _written_key(quota: Quota) -> QuotaKey:
    """The ledger's key of what one status write of ``quota`` covers: a ResourceQuota; a
    ClusterQuota whole (the share of every namespace is in the one write)."""
    _, namespace, _ = quota_identity(quota)
    return quota_key(quota, namespace)


def _namespace(waiter: _Waiter) -> str:
    return waiter.request.attributes.namespace


def _charged_object(waiter: _Waiter) -> tuple[ObjectRef, str, str]:
    """The object a waiter's charge waits for: its reference, uid, and (for an UPDATE) the
    resourceVersion the update replaces."""
    attributes = waiter.request.attributes
    metadata = (attributes.obj or {}).get("metadata") or {}
    ref = ObjectRef(
        attributes.group_resource,
        attributes.namespace,
        attributes.name or str(metadata.get("name") or ""),
    )
    replaces = (
        resource_version(attributes.old_obj) if attributes.operation == Operation.UPDATE else ""
    )
    return ref, str(metadata.get("uid") or ""), replaces
