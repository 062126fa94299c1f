"""The ledger of pending charges: recorded by admission, confirmed by the caches, released on time.

A charge is what one admitted request added to each quota it charged (the amounts admission
wrote, masked to each quota's hard names), and the object it is for. It is *confirmed* when the
object is seen in a cache:

* a CREATE by the object with the uid the review carried (the API server assigns the uid
  before validating webhooks run), or by any object of that kind, namespace and name when the
  review carried none;
* an UPDATE by the object with that uid at a resourceVersion other than the one the update
  replaced (the update was stored, or another write won and the API server tried the update
  again, judged and charged anew); its quotas are then recalculated, which gives back the
  charge of a try that was never stored.

One observation confirms one CREATE charge per object: where it confirms more (one request
judged twice, say a webhook call the API server retried), the others charged the object a
second time and are released as *duplicate*, their quotas recalculated at once, as for an
UPDATE.

A charge not confirmed ``timeout`` seconds after admission answered is *released*: it stops
holding usage, and its quotas are recalculated at once (``recalculate``). The timeout must
cover the time from tally's answer to the object's watch event for every create that succeeds:
the other validating webhooks still deciding, the write to etcd, the watch. A create that takes
longer is counted late, which lets admission admit past the limit meanwhile; such a *late*
object triggers a recalculation and the ``late`` metric, so the status is right again as soon
as it is seen and the operator learns that the timeout is too short.

With a ``verify`` function (the operator sets one), the API is asked first whether the object
was stored (:mod:`tally.charges.verification`): if it was, the caches are only behind (a
loaded tally sees events seconds late) and the charge is held on, asked about again after a
wait that doubles with each such answer (a stored object only needs the caches to catch up);
a charge whose object was never stored (or is gone) is released. A question tally could not
even send (its own questions held every slot) counts for nothing either way. Without that,
a release during such lag would lower usage below what exists and admit past the limit. No
charge is held without bound on a question that cannot be answered: one the API refuses (401,
403) is released at once, one left unanswered (timeouts, 5xx) after
:data:`~tally.charges.verification.MAX_UNANSWERED` questions in a row, both as *unverified*,
with a log line naming the object and the error (one a minute in full, the rest summed up:
:class:`UnansweredReport`). A CREATE charge whose review carried no uid
(the API server always sets one before validating admission: only a forged review lacks it)
is never asked about, since any object of its name would answer "stored" at every deadline:
it is released at its deadline, confirmed until then by any object of its name.

While admission's status write of a quota is in flight, a recalculation of that quota is
*deferred* until the write has landed or failed (:meth:`defer_sync`), then run
(``recalculate``). A charge is recorded before its write, so a recalculation could count it
while not knowing whether the status it read already contains it: if it does not, and the
recalculation's own write lands first, admission's write loses its compare-and-swap, judges
again against the recalculated status (which holds the charge) and adds the charge a second
time. Nothing recalculates afterwards (the object's creation is charged, so it replenishes
nothing): usage would stay one object too high until the next full resync.

A *hold* is a charge without an object: a raise of ``status.used`` seen on a quota's watch that
another replica's admission made. It cannot be confirmed (its object is unknown here); it holds
usage for ``timeout`` and is then released like an unconfirmed charge.

Requests that tally itself refused after their charge was written (a later write of the same
pass lost every retry; the caller stopped waiting) are released at once (:meth:`release_now`).

Every map here shrinks: a charge leaves every index when it is confirmed or released, a
released one is remembered for late objects for one more ``timeout``, and a deleted quota's
amounts are dropped (:meth:`forget_quota`).

Pure and single-threaded (one event loop); time comes from an injectable monotonic clock. The
expiry timer is the running loop's ``call_later``, armed only after :meth:`start`, so tests
drive :meth:`expire` with a fake clock. Leaves out the question to the API (the ``verify``
function: :mod:`tally.kube.charge_verifier` in the operator) and what its answer means
(:mod:`tally.charges.verification`).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from tally.charges.verification import (
    MAX_UNANSWERED,
    Answer,
    Unanswered,
    Verdict,
    decide,
    describe_unanswered,
    stored_wait,
)
from tally.evaluators.base import GroupResource
from tally.quota import resources as quota
from tally.quota.identity import QuotaKey, sync_key
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S: Final = 5.0
"""How long a charge may wait for its object (``TALLY_CHARGE_CONFIRM_TIMEOUT``).

Measured on this project's 2-core machine under ``bench/admission.py`` load (20 clients,
125-175 creates/s, tally's own histogram ``tally_admission_charge_confirmation_seconds``): the
charge recorded → the object in tally's cache, p99.9 within 0.25 s in five runs and 0.5 s in a
sixth on a more loaded machine. The API server calls the other validating webhooks in parallel
with tally's and stores the object only once the slowest of them answered, so the timeout must
also cover their latency: 5 s leaves 10-20x the measured p99.9 for webhooks that take seconds,
while a refused request holds its quotas for 5 s instead of until the next full resync
(minutes)."""


REPORT_PERIOD_S: Final = 60.0
"""Unanswered questions are logged one line per kind per period, beyond the first: under load
they come by the thousand (a cold start at 150 000 pods, creates at 10/s: 6 652 lines)."""


class UnansweredReport:
    """The log of questions the API left unanswered, per kind of line (``held on``,
    ``released unverified``): the first of a period in full, the rest counted and summed up,
    with the last one's words, once the period is over (at the next such line, or at the next
    :meth:`flush`). Counts are exact in the metrics
    (``tally_admission_charges_released_total``); the log keeps an example and a rate."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._reported_at: dict[str, float] = {}
        self._unreported: dict[str, tuple[int, str]] = {}
        """Kind of line → (lines counted since its last report, the last one)."""

    def warn(self, kind: str, line: str) -> None:
        now = self._clock()
        reported_at = self._reported_at.get(kind)
        if reported_at is not None and now - reported_at < REPORT_PERIOD_S:
            count, _ = self._unreported.get(kind, (0, ""))
            self._unreported[kind] = (count + 1, line)
            return
        self._summarise(kind)
        logger.warning("%s", line)
        self._reported_at[kind] = now

    def flush(self) -> None:
        """Sum up every kind whose period is over."""
        now = self._clock()
        for kind in list(self._unreported):
            if now - self._reported_at[kind] >= REPORT_PERIOD_S:
                self._summarise(kind)
                self._reported_at[kind] = now

    def _summarise(self, kind: str) -> None:
        unreported = self._unreported.pop(kind, None)
        if unreported is not None:
            count, last = unreported
            logger.warning(
                "charges: %d more %s since the last such line (at most one line a minute), "
                "the last: %s", count, kind, last,
            )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Which object a charge is for."""

    group_resource: GroupResource
    namespace: str
    name: str


class ReleaseReason(enum.Enum):
    UNCONFIRMED = "unconfirmed"
    """The object was not seen within the timeout (refused after tally's answer, the write
    failed, or a hold of another replica's charge ran out)."""
    REFUSED = "refused"
    """tally refused the request itself after its charge was written."""
    UNVERIFIED = "unverified"
    """The API could not be asked whether the object was stored: it refused the question (401,
    403: a right missing) or left it unanswered too many times in a row."""
    DUPLICATE = "duplicate"
    """Another CREATE charge for the same object was confirmed by the same observation: the
    request was judged (and charged) twice."""


@dataclass(eq=False, slots=True)
class Charge:
    """One request's charge (or one hold) and how long it may wait."""

    ref: ObjectRef | None
    """The object charged for; None for a hold (another replica's charge)."""
    uid: str
    """The object's uid as the review carried it; "" when it carried none."""
    replaces: str
    """For an UPDATE, the resourceVersion of the object it replaced; "" for a CREATE."""
    amounts: dict[QuotaKey, ResourceList]
    """What was added to each quota's ``status.used``."""
    at: float
    """Monotonic time admission answered (or the hold was seen)."""
    deadline: float
    asking: bool = False
    """A question about it is out to the API (one at a time); only its answer counts."""
    unanswered: int = 0
    """Questions about it in a row that got no answer (reset by a "stored" answer)."""
    stored: int = 0
    """"Stored" answers about it in a row (reset by an unanswered question)."""
    ask_after: float = 0.0
    """No question about it before this time (monotonic): a stored object waits for the
    caches (:func:`~tally.charges.verification.stored_wait`)."""

    @property
    def verifiable(self) -> bool:
        """Whether the API can tell if its object was stored: a hold has no object, and a
        CREATE without a uid would be answered by any object of its name."""
        return self.ref is not None and bool(self.uid or self.replaces)

    def confirmed_by(self, uid: str, resource_version: str) -> bool:
        if self.uid and uid != self.uid:
            return False  # another incarnation of the name
        return not self.replaces or resource_version != self.replaces


class ChargeMetrics(Protocol):
    """What the ledger reports (implemented by the Prometheus adapter)."""

    def charge_confirmed(self, seconds: float) -> None:
        """A charge's object was seen ``seconds`` after admission answered."""
        ...

    def charge_released(self, reason: str) -> None:
        """A charge stopped holding usage before its object was seen (a ``ReleaseReason``)."""
        ...

    def charge_late(self) -> None:
        """An object was seen after its charge had been released for want of it."""
        ...


class NoopChargeMetrics:
    def charge_confirmed(self, seconds: float) -> None:
        pass

    def charge_released(self, reason: str) -> None:
        pass

    def charge_late(self) -> None:
        pass


_: type[ChargeMetrics] = NoopChargeMetrics


class Verify(Protocol):
    """Asks the API whether the objects of ``charges`` were stored, and gives each answer to
    ``answer`` (on the ledger's loop, once per charge, within one timeout)."""

    def __call__(self, charges: list[Charge], answer: Callable[[Charge, Answer], None]) -> None: ...


class ChargeLedger:
    """Pending charges by object and by quota, in deadline order (see module doc)."""

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: ChargeMetrics | None = None,
        recalculate: Callable[[Iterable[QuotaKey]], None] | None = None,
        verify: Verify | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.timeout = timeout
        self._clock = clock
        self.metrics: ChargeMetrics = metrics if metrics is not None else NoopChargeMetrics()
        self.recalculate: Callable[[Iterable[QuotaKey]], None] = recalculate or (lambda _: None)
        """Called with the quotas whose usage a release (or a late object) changed."""
        self.verify: Verify | None = verify
        """Asks the API whether the objects of charges past their deadline were stored, and
        answers each through :meth:`verified`; None releases them unasked (see
        :meth:`expire`)."""
        self._seq = itertools.count()
        # Invariant: a charge is in _pending exactly while it is in _by_object (if it has an
        # object) and in _by_quota under each of its amounts' quotas. Every charge has the
        # same timeout and the clock is monotonic, so _pending's order is deadline order.
        self._pending: dict[int, Charge] = {}
        self._by_object: dict[ObjectRef, dict[int, Charge]] = {}
        self._by_quota: dict[QuotaKey, dict[int, Charge]] = {}
        # Charges released unconfirmed, remembered one more timeout for late objects; in
        # release order (so in expiry order of this memory too).
        self._released: dict[ObjectRef, list[Charge]] = {}
        self._released_order: deque[tuple[float, ObjectRef, Charge]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._running = False
        # Admission's status writes in flight, by sync key (sync_key), and the quotas whose
        # recalculation waits for them to end; both drop a key when its last write ends.
        self._writing: dict[QuotaKey, int] = {}
        self._deferred: set[QuotaKey] = set()
        self._unanswered = UnansweredReport(clock)

    # -- reading

    def __len__(self) -> int:
        return len(self._pending)

    def expects(self, ref: ObjectRef) -> bool:
        """Whether an observation of ``ref`` could confirm (or be late for) a charge: the
        cheap test the informers' handlers make for every event."""
        return ref in self._by_object or ref in self._released

    def held(self, key: QuotaKey) -> dict[str, Quantity]:
        """What the pending charges on ``key`` add up to: every charge until it is confirmed
        or released (one past its deadline still counts until the timer releases it: were it
        dropped earlier, a recalculation in between would lower usage below what the object,
        confirmed a moment later without a recalculation, uses)."""
        total: dict[str, Quantity] = {}
        for charge in self._by_quota.get(key, {}).values():
            total = quota.add(total, charge.amounts[key])
        return total

    def oldest_age(self) -> float | None:
        """Seconds since the oldest pending charge was made; None when there is none."""
        for charge in self._pending.values():
            return self._clock() - charge.at
        return None

    # -- recording

    def record(
        self, ref: ObjectRef, uid: str, replaces: str, amounts: Mapping[QuotaKey, ResourceList]
    ) -> Charge:
        """Admission is writing a request's charges: hold them and wait for its object.

        Recorded *before* the status writes, so that no recalculation running meanwhile (or
        between a write and the pass's end) can erase them; :meth:`amend` drops what a write
        failed to reserve, :meth:`withdraw` the whole charge when the request is refused.
        """
        charge = Charge(ref, uid, replaces, dict(amounts), *self._times())
        self._add(charge)
        return charge

    def amend(self, charge: Charge, key: QuotaKey, amount: ResourceList | None) -> None:
        """Set (or, with None, drop) what ``charge`` holds on ``key``."""
        seq = self._seq_of(charge)
        if seq is None:
            return  # confirmed or released meanwhile
        if amount is None:
            charge.amounts.pop(key, None)
            _discard(self._by_quota, key, seq)
        else:
            charge.amounts[key] = amount
            self._by_quota.setdefault(key, {})[seq] = charge

    def withdraw(self, charge: Charge) -> None:
        """The request was refused: ``charge`` holds nothing any more (no metric: the caller
        releases what was written with :meth:`release_now`)."""
        seq = self._seq_of(charge)
        if seq is not None:
            self._remove(seq, charge)

    def _seq_of(self, charge: Charge) -> int | None:
        if charge.ref is None:
            for key in charge.amounts:
                for seq, pending in self._by_quota.get(key, {}).items():
                    if pending is charge:
                        return seq
            return None
        for seq, pending in self._by_object.get(charge.ref, {}).items():
            if pending is charge:
                return seq
        return None

    def hold(self, key: QuotaKey, amount: ResourceList) -> Charge | None:
        """A raise of ``key``'s usage this process did not make (or may not have: the caller
        can :meth:`withdraw` it): hold it for the timeout."""
        if not amount:
            return None
        charge = Charge(None, "", "", {key: dict(amount)}, *self._times())
        self._add(charge)
        return charge

    def release_now(self, amounts: Mapping[QuotaKey, ResourceList]) -> None:
        """tally refused a request after writing these charges: recalculate their quotas now.

        Nothing is recorded: the charge never holds anything, so the recalculation lowers the
        quotas to what the caches (and the other pending charges) say.
        """
        if amounts:
            self.metrics.charge_released(ReleaseReason.REFUSED.value)
            self.recalculate(list(amounts))

    def _times(self) -> tuple[float, float]:
        now = self._clock()
        return now, now + self.timeout

    def _add(self, charge: Charge) -> None:
        seq = next(self._seq)
        self._pending[seq] = charge
        if charge.ref is not None:
            self._by_object.setdefault(charge.ref, {})[seq] = charge
        for key in charge.amounts:
            self._by_quota.setdefault(key, {})[seq] = charge
        self._arm()

    def _remove(self, seq: int, charge: Charge) -> None:
        del self._pending[seq]
        if charge.ref is not None:
            _discard(self._by_object, charge.ref, seq)
        for key in charge.amounts:
            _discard(self._by_quota, key, seq)

    # -- writes in flight

    def writes_started(self, keys: Iterable[QuotaKey]) -> list[QuotaKey]:
        """Admission starts writing the status of these quotas (their charges are recorded):
        their recalculations wait (:meth:`defer_sync`) until :meth:`writes_ended` with the
        sync keys returned here."""
        started = sorted({sync_key(key) for key in keys})
        for key in started:
            self._writing[key] = self._writing.get(key, 0) + 1
        return started

    def writes_ended(self, keys: Iterable[QuotaKey]) -> None:
        """The writes :meth:`writes_started` announced landed or failed (and the charges of
        those that failed were amended): a recalculation deferred meanwhile runs now."""
        ready: list[QuotaKey] = []
        for key in keys:
            left = self._writing.get(key, 0) - 1
            if left > 0:
                self._writing[key] = left
                continue
            self._writing.pop(key, None)
            if key in self._deferred:
                self._deferred.discard(key)
                ready.append(key)
        if ready:
            self.recalculate(ready)

    def defer_sync(self, key: QuotaKey) -> bool:
        """Whether a recalculation of ``key`` (a sync key) must wait: admission is writing its
        status, so the status just read may or may not contain charges this ledger holds (see
        the module doc). True: it is recalculated once the writes end."""
        if not self._writing.get(key):
            return False
        self._deferred.add(key)
        return True

    # -- confirming

    def observed(self, ref: ObjectRef, uid: str, resource_version: str) -> None:
        """The caches now hold ``ref`` at ``resource_version``: confirm what it confirms.

        Called by the informers' handlers after the store changed, so a confirmed charge's
        object is counted by the caches from this moment on.
        """
        pending = self._by_object.get(ref)
        updated: set[QuotaKey] = set()
        created: list[Charge] = []
        if pending:
            now = self._clock()
            for seq, charge in list(pending.items()):
                if not charge.confirmed_by(uid, resource_version):
                    continue
                self._remove(seq, charge)
                if charge.replaces:
                    # The API server judges every try of an update: one that lost its own
                    # compare-and-swap to another writer (a controller's status write) is
                    # tried again against that write, and admitted and charged again. Only the
                    # last try is stored; the event that confirms the earlier one does not
                    # contain it, so the status holds a charge nothing uses. Recalculating now
                    # (the caches, plus the charges still pending: the later try's) gives it
                    # back at once instead of at the next resync.
                    self.metrics.charge_confirmed(now - charge.at)
                    updated.update(charge.amounts)
                elif not created:
                    self.metrics.charge_confirmed(now - charge.at)
                    created.append(charge)
                else:
                    # One object, one create: a second CREATE charge confirmed by this same
                    # object is one request judged twice (a webhook call answered twice), and
                    # both charges are in the status. Nothing else recalculates (a charged
                    # creation replenishes nothing), so without this the quota would stay one
                    # object too high until the next full resync.
                    self.metrics.charge_released(ReleaseReason.DUPLICATE.value)
                    created.append(charge)
        if len(created) > 1:
            # Which one is "the" object's charge is unknowable and does not matter: the
            # recalculation counts the object once, from the caches that now hold it.
            updated.update(key for charge in created for key in charge.amounts)
        if updated:
            self.recalculate(updated)
        released = self._released.get(ref)
        if released:
            late = [c for c in released if c.confirmed_by(uid, resource_version)]
            if late:
                self._released[ref] = [c for c in released if c not in late]
                if not self._released[ref]:
                    del self._released[ref]
                for _ in late:
                    self.metrics.charge_late()
                self.recalculate({key for charge in late for key in charge.amounts})

    # -- releasing

    def expire(self, now: float | None = None) -> list[QuotaKey]:
        """Release every charge whose deadline passed; recalculate their quotas.

        Returns the quotas passed to ``recalculate`` (sorted), for callers and tests.
        """
        now = self._clock() if now is None else now
        keys: set[QuotaKey] = set()
        to_verify: list[Charge] = []
        while self._pending:
            seq, charge = next(iter(self._pending.items()))
            if charge.deadline > now:
                break
            self._remove(seq, charge)
            if self.verify is None or not charge.verifiable:
                self._release(charge, now, ReleaseReason.UNCONFIRMED)
                keys.update(charge.amounts)
                continue
            if charge.asking:
                # The question asked at the last deadline is still out a whole timeout later
                # (the verifier gives up well before: only a stalled loop, or a verifier that
                # lost it, gets here). Written off as unanswered and its late answer ignored,
                # so that not even a verifier that never answers holds a charge without
                # bound; the next deadline asks again (one question out at a time).
                charge.asking = False
                charge.unanswered += 1
                if charge.unanswered >= MAX_UNANSWERED:
                    self._release_unverified(charge, now, "no answer within the timeout")
                    keys.update(charge.amounts)
                    continue
                charge.deadline = now + self.timeout
                self._add(charge)
                continue
            # The caches may only be slow (a loaded tally sees events seconds late):
            # releasing now would lower usage below what exists. Held one more timeout
            # while the API is asked (re-added last: deadline order holds); a charge the
            # API said was stored is held without asking until its wait is over.
            charge.deadline = now + self.timeout
            self._add(charge)
            if now < charge.ask_after:
                continue
            charge.asking = True
            to_verify.append(charge)
        while self._released_order and self._released_order[0][0] <= now:
            _, ref, charge = self._released_order.popleft()
            remaining = [c for c in self._released.get(ref, []) if c is not charge]
            if remaining:
                self._released[ref] = remaining
            else:
                self._released.pop(ref, None)
        self._unanswered.flush()
        if keys:
            self.recalculate(sorted(keys))
        if to_verify and self.verify is not None:
            self.verify(to_verify, self.verified)
        return sorted(keys)

    def _release(self, charge: Charge, now: float, reason: ReleaseReason) -> None:
        """``charge`` (already out of the indexes) holds nothing any more; its object, if it
        shows up within one more timeout, is late."""
        self.metrics.charge_released(reason.value)
        if charge.ref is not None:
            self._released.setdefault(charge.ref, []).append(charge)
            self._released_order.append((now + self.timeout, charge.ref, charge))

    def _release_unverified(self, charge: Charge, now: float, error: str) -> None:
        quotas = ", ".join("/".join(key) for key in sorted(charge.amounts))
        self._unanswered.warn(
            "charges released unverified",
            f"charges: could not ask the API whether {_object_of(charge)} was stored ({error}); "
            f"its charge on {quotas} released unverified",
        )
        self._release(charge, now, ReleaseReason.UNVERIFIED)

    def verified(self, charge: Charge, answer: Answer) -> None:
        """The API's answer for a charge :meth:`expire` asked about (see
        :func:`~tally.charges.verification.decide`): its object was stored (held on, until the
        caches show it or the next deadline asks again), or not (released now, its quotas
        recalculated); no answer: asked again at the next deadline, or released as unverified
        (at once for a refusal, after :data:`~tally.charges.verification.MAX_UNANSWERED` in a
        row otherwise)."""
        seq = self._seq_of(charge)
        if seq is None or not charge.asking:
            return  # confirmed (or released) meanwhile, or written off as unanswered
        charge.asking = False
        verdict = decide(charge.uid, charge.replaces, answer)
        if verdict is Verdict.STORED:
            # The bound is on questions unanswered in a row: this answer says the object
            # exists, so holding on is right and the count starts again.
            charge.unanswered = 0
            charge.stored += 1
            charge.ask_after = self._clock() + stored_wait(charge.stored, self.timeout)
            return
        if verdict is Verdict.UNASKED:
            return  # held on, asked again at its next deadline: the API was not asked
        charge.stored = 0
        if verdict is not Verdict.NOT_STORED and isinstance(answer, Unanswered):
            resource = str(charge.ref.group_resource) if charge.ref is not None else ""
            error = describe_unanswered(resource, answer)
            if verdict is Verdict.UNANSWERED:
                charge.unanswered += 1
                if charge.unanswered < MAX_UNANSWERED:
                    self._unanswered.warn(
                        "charges held on unanswered",
                        f"charges: could not ask the API whether {_object_of(charge)} was "
                        f"stored ({error}); held on, asked again at its next deadline "
                        f"({charge.unanswered} of {MAX_UNANSWERED})",
                    )
                    return
            self._remove(seq, charge)
            self._release_unverified(charge, self._clock(), error)
        else:
            self._remove(seq, charge)
            self._release(charge, self._clock(), ReleaseReason.UNCONFIRMED)
        self.recalculate(sorted(charge.amounts))

    def forget_quota(self, key: QuotaKey) -> None:
        """``key`` was deleted: drop its amounts (a charge left with none is gone). A write in
        flight still ends through :meth:`writes_ended`, which drops its count (and runs a
        deferred recalculation, which finds the quota gone)."""
        for seq, charge in self._by_quota.pop(key, {}).items():
            del charge.amounts[key]
            if not charge.amounts:
                del self._pending[seq]
                if charge.ref is not None:
                    _discard(self._by_object, charge.ref, seq)

    # -- the expiry timer

    def start(self) -> None:
        """Release charges on time from now on (on the running loop)."""
        self._running = True
        self._arm()

    def stop(self) -> None:
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if not self._running or self._timer is not None or not self._pending:
            return
        deadline = next(iter(self._pending.values())).deadline
        delay = max(0.0, deadline - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        try:
            self.expire()
        finally:
            self._arm()


def hold_pending(
    calculated: Mapping[str, Quantity],
    status_used: Mapping[str, Quantity],
    held: Mapping[str, Quantity],
) -> dict[str, Quantity]:
    """The usage a recalculation writes: ``calculated`` from the caches, except that a value
    below the status is lowered no further than the caches plus the pending charges allow.

    Admission writes a charge before its object exists; until the caches show the object (or
    the charge is released), lowering the status to what the caches count would erase the
    charge and let admission admit past the limit. Never above the status either: a pending
    charge only keeps what admission wrote, so a charge whose object the caches already count
    (confirmed a moment later) cannot raise usage twice.
    """
    result = dict(calculated)
    for name, value in calculated.items():
        previous, extra = status_used.get(name), held.get(name)
        if previous is not None and extra is not None and value < previous:
            result[name] = min(previous, value + extra)
    return result


def _object_of(charge: Charge) -> str:
    """How log lines name a charge's object: ``pods team-a/web-1``."""
    ref = charge.ref
    return "a hold" if ref is None else f"{ref.group_resource} {ref.namespace}/{ref.name}"


K = TypeVar("K")


def _discard(index: dict[K, dict[int, Charge]], key: K, seq: int) -> None:
    entries = index.get(key)
    if entries is None:
        return
    entries.pop(seq, None)
    if not entries:
        del index[key]
