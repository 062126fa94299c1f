"""Leader election over a Lease, ported from client-go ``tools/leaderelection``.

tally runs its webhook on every replica and its controllers (quota usage, PodSet, the webhook
configuration's writes) on one: the holder of a ``coordination.k8s.io/v1`` Lease. This module
is client-go's ``LeaderElector`` (``leaderelection.go``, v0.37.1) in two parts:

* :class:`ElectionState` — the decisions, pure: what a candidate observed, whether the lease it
  observed is still valid by its own clock, and what to write next (create, take over, renew,
  release). Tested with plain records and a stepped clock
  (``tests/unit/machinery/test_leaderelection.py``, the cases of client-go's
  ``TestTryAcquireOrRenew`` / ``TestReleaseLease``).
* :class:`LeaderElector` — the loops (acquire, renew, release) over a :class:`Lock`, the few
  reads and writes of one Lease (:mod:`tally.kube.lease_lock` does them through the API, with the
  resourceVersion read: optimistic concurrency, so two candidates never both win one write).

How client-go decides, and so this module (``tryAcquireOrRenew``):

1. A leader whose lease is still valid writes a renewal straight away, over the Lease it last
   read or wrote (the fast path; a 409 falls back to step 2).
2. Read the Lease; if none exists, create it holding it.
3. If the record read differs from the one observed last, observe it *now*: the local time of
   the last observed change is all a candidate trusts. Timestamps in the record are written by
   other machines' clocks and are never compared with ours, so the scheme tolerates clock skew
   (not clock *rate* skew: see ``leaseDuration`` vs ``renewDeadline`` upstream).
4. Someone else holds it and ``observed_time + leaseDurationSeconds`` is still ahead: wait.
5. Otherwise write it: a renewal keeps ``acquireTime`` and ``leaseTransitions``; a takeover
   (expired, or free: ``holderIdentity`` empty) counts one more transition.

The leader renews every ``retry_period``; a *round* of renewal attempts that has not succeeded
within ``renew_deadline`` loses leadership (``renew`` upstream: ``PollUntilContextTimeout``).
With the defaults (15 s / 10 s / 2 s) the leader gives up at most 2 + 10 = 12 s after its last
successful renewal, while another candidate takes over no earlier than 15 s after it *saw*
that renewal: the 3 s between is what keeps two leaders from acting at once.

Where tally differs from client-go, on purpose:

* A leader that reads the Lease and finds **another holder** stops at once instead of retrying
  until its renew deadline: another candidate only takes over a lease that has expired by its
  clock, so the leader has already lost it, and every extra second is a second with two
  leaders. (client-go keeps trying until the deadline, then stops anyway.)
* :meth:`LeaderElector.release` writes only over a record that still names this candidate
  (client-go checks its own last observation only).
* No coordinated election (``tryCoordinatedRenew``), no events on the Lease, no healthz
  adaptor: tally's leader stops itself when it loses (see :mod:`tally.app.leading`).

Fencing is out of reach here as upstream: a leader that stalls (a frozen process, a network
partition) may still have writes in flight when another takes over. tally's writes are
compare-and-swap on resourceVersions, which keeps such a write from clobbering a newer state.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from tally.workqueue import start_watched
from tally.workqueue.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

JITTER_FACTOR: Final = 1.2
"""client-go ``JitterFactor``: a candidate waits ``retry_period * (1 + 1.2 * rand)`` between
attempts to acquire, so candidates started together do not keep colliding."""
DEFAULT_LEASE_DURATION_S: Final = 15
DEFAULT_RENEW_DEADLINE_S: Final = 10.0
DEFAULT_RETRY_PERIOD_S: Final = 2.0
"""client-go's "core clients" defaults (kube-controller-manager ``--leader-elect-*``)."""
RELEASED_LEASE_DURATION_S: Final = 1
"""What a released record says (client-go ``tryRelease``): holder empty, duration 1 s."""


class ElectionConfigError(ValueError):
    """Durations that cannot work together (client-go ``NewLeaderElector``'s checks)."""


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    """The three durations, checked as client-go's ``NewLeaderElector`` checks them."""

    lease_duration: int = DEFAULT_LEASE_DURATION_S
    """Seconds a candidate waits without seeing the record change before taking over; the
    Lease's ``leaseDurationSeconds`` (whole seconds: client-go truncates the same way)."""
    renew_deadline: float = DEFAULT_RENEW_DEADLINE_S
    """Seconds the leader keeps trying to renew before it gives up."""
    retry_period: float = DEFAULT_RETRY_PERIOD_S
    """Seconds between attempts (to acquire, or to renew)."""

    def __post_init__(self) -> None:
        problem = config_problem(self.lease_duration, self.renew_deadline, self.retry_period)
        if problem:
            raise ElectionConfigError(problem)


def config_problem(lease_duration: float, renew_deadline: float, retry_period: float) -> str:
    """Why these durations cannot work together ('' when they can); client-go's messages."""
    if lease_duration <= renew_deadline:
        return "leaseDuration must be greater than renewDeadline"
    if renew_deadline <= JITTER_FACTOR * retry_period:
        return "renewDeadline must be greater than retryPeriod*JitterFactor"
    if lease_duration < 1:
        return "leaseDuration must be greater than zero"
    if renew_deadline <= 0:
        return "renewDeadline must be greater than zero"
    if retry_period <= 0:
        return "retryPeriod must be greater than zero"
    return ""


def default_identity() -> str:
    """This process's name among the candidates: the pod name (``HOSTNAME`` in a pod) and a
    random suffix, as kube-controller-manager does (``hostname + "_" + uuid``), so that a
    restarted container never mistakes its predecessor's lease for its own."""
    host = os.environ.get("HOSTNAME") or socket.gethostname() or "tally"
    return f"{host}_{uuid.uuid4()}"


# -- the record


@dataclass(frozen=True, slots=True)
class LeaderElectionRecord:
    """What a Lease's spec says (client-go ``resourcelock.LeaderElectionRecord``)."""

    holder_identity: str = ""
    """Empty: nobody holds it (never acquired, or released); anyone may take it at once."""
    lease_duration_seconds: int = 0
    acquire_time: datetime.datetime | None = None
    renew_time: datetime.datetime | None = None
    leader_transitions: int = 0


def record_from_lease_spec(spec: Any) -> LeaderElectionRecord:
    """``LeaseSpecToLeaderElectionRecord``: missing fields are zero values."""
    spec = spec if isinstance(spec, dict) else {}
    return LeaderElectionRecord(
        holder_identity=str(spec.get("holderIdentity") or ""),
        lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=_parse_micro_time(spec.get("acquireTime")),
        renew_time=_parse_micro_time(spec.get("renewTime")),
        leader_transitions=int(spec.get("leaseTransitions") or 0),
    )


def lease_spec(record: LeaderElectionRecord) -> dict[str, Any]:
    """``LeaderElectionRecordToLeaseSpec``: the spec written for a record."""
    spec: dict[str, Any] = {
        "holderIdentity": record.holder_identity,
        "leaseDurationSeconds": record.lease_duration_seconds,
        "leaseTransitions": record.leader_transitions,
    }
    if record.acquire_time is not None:
        spec["acquireTime"] = format_micro_time(record.acquire_time)
    if record.renew_time is not None:
        spec["renewTime"] = format_micro_time(record.renew_time)
    return spec


def format_micro_time(moment: datetime.datetime) -> str:
    """metav1.MicroTime's JSON form (``RFC3339Micro``: six fractional digits, UTC ``Z``)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro_time(raw: object) -> datetime.datetime | None:
    if not isinstance(raw, str) or not raw:
        return None
    return datetime.datetime.fromisoformat(raw)


# -- the decisions (pure)


@dataclass(frozen=True, slots=True)
class Create:
    """No Lease exists: create it with this record."""

    record: LeaderElectionRecord


@dataclass(frozen=True, slots=True)
class Update:
    """Write this record over the Lease read (its resourceVersion): a takeover or a renewal."""

    record: LeaderElectionRecord


@dataclass(frozen=True, slots=True)
class Held:
    """Someone else holds a lease that is still valid by our clock: nothing to write."""

    holder: str


Decision = Create | Update | Held


@dataclass(slots=True)
class ElectionState:
    """One candidate's view of the election: client-go ``LeaderElector``'s bookkeeping.

    Times named ``now`` are this process's monotonic clock, the only clock validity is judged
    by; ``wall`` is the time written into records (for people and other tools, never compared).
    """

    identity: str
    lease_duration: int
    observed_record: LeaderElectionRecord = field(default_factory=LeaderElectionRecord)
    """The record last read or written. Invariant: ``is_leader`` reads only this."""
    observed_raw: LeaderElectionRecord | None = None
    """The record last *read* (client-go ``observedRawRecord``): a read equal to it is no
    change, so it does not restart the other holder's lease duration."""
    observed_time: float | None = None
    """When ``observed_record`` was set, by our clock; None: never (no lease is valid)."""

    def is_leader(self) -> bool:
        return self.observed_record.holder_identity == self.identity

    def is_lease_valid(self, now: float) -> bool:
        """``observedTime + leaseDurationSeconds`` still ahead of ``now`` (client-go
        ``isLeaseValid``), using the duration the *record* says."""
        if self.observed_time is None:
            return False
        return self.observed_time + self.observed_record.lease_duration_seconds > now

    def set_observed_record(self, record: LeaderElectionRecord, now: float) -> None:
        self.observed_record = record
        self.observed_time = now

    def _new_record(self, wall: datetime.datetime) -> LeaderElectionRecord:
        return LeaderElectionRecord(
            holder_identity=self.identity,
            lease_duration_seconds=self.lease_duration,
            acquire_time=wall,
            renew_time=wall,
        )

    def fast_path(self, now: float, wall: datetime.datetime) -> LeaderElectionRecord | None:
        """Step 1: the renewal a leader with a valid lease writes without reading first."""
        if not (self.is_leader() and self.is_lease_valid(now)):
            return None
        return replace(
            self._new_record(wall),
            acquire_time=self.observed_record.acquire_time,
            leader_transitions=self.observed_record.leader_transitions,
        )

    def decide(
        self,
        read: LeaderElectionRecord | None,
        now: float,
        wall: datetime.datetime,
        *,
        read_at: float | None = None,
    ) -> Decision:
        """Steps 2-5 after reading the Lease (``read`` None: it does not exist).

        ``now`` is when the attempt began (validity is judged at that moment, as client-go
        captures ``now`` first); ``read_at`` is when the read returned, the moment a changed
        record counts as observed (client-go's ``setObservedRecord`` reads the clock again).
        The order matters only at the edge: a record seen for the first time is valid for the
        attempt that saw it even when it names no duration.
        """
        record = self._new_record(wall)
        if read is None:
            return Create(record)
        if read != self.observed_raw:
            self.set_observed_record(read, now if read_at is None else read_at)
            self.observed_raw = read
        if read.holder_identity and self.is_lease_valid(now) and not self.is_leader():
            return Held(read.holder_identity)
        if self.is_leader():
            return Update(
                replace(
                    record,
                    acquire_time=read.acquire_time,
                    leader_transitions=read.leader_transitions,
                )
            )
        return Update(replace(record, leader_transitions=read.leader_transitions + 1))

    def release_record(
        self, read: LeaderElectionRecord, wall: datetime.datetime
    ) -> LeaderElectionRecord | None:
        """What releasing writes over ``read`` (client-go ``tryRelease``), or None when there is
        nothing of ours to release: we do not lead, or (tally's extra check) the Lease now
        names someone else."""
        if not self.is_leader() or read.holder_identity != self.identity:
            return None
        return LeaderElectionRecord(
            holder_identity="",
            lease_duration_seconds=RELEASED_LEASE_DURATION_S,
            acquire_time=wall,
            renew_time=wall,
            leader_transitions=read.leader_transitions,
        )


@dataclass(frozen=True, slots=True)
class Renewed:
    """The round succeeded: the next one starts ``retry_period`` later."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again after ``wait`` seconds (less than ``retry_period`` near the deadline)."""

    wait: float


@dataclass(frozen=True, slots=True)
class Lost:
    """Leadership is gone; stop everything the lease guards."""

    reason: str


RenewStep = Renewed | Retry | Lost


def after_renew_attempt(
    *,
    succeeded: bool,
    observed_holder: str,
    identity: str,
    round_started: float,
    now: float,
    config: ElectionConfig,
) -> RenewStep:
    """What the renew loop does after one attempt of a round that began at ``round_started``
    (client-go ``renew``: ``PollUntilContextTimeout(retryPeriod, renewDeadline)``)."""
    if succeeded:
        return Renewed()
    if observed_holder and observed_holder != identity:
        return Lost(f"the lease is held by {observed_holder}")
    deadline = round_started + config.renew_deadline
    if now >= deadline:
        return Lost(f"not renewed within the renew deadline ({config.renew_deadline:g} s)")
    return Retry(min(config.retry_period, deadline - now))


def jittered(period: float, rand: float) -> float:
    """``wait.Jitter(period, JitterFactor)``: ``period`` plus up to 1.2 times it more."""
    return period * (1.0 + JITTER_FACTOR * rand)


# -- the loops (I/O through a Lock)


class LockError(Exception):
    """A read or write of the Lease failed (``status`` 0: no answer)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class LockConflict(LockError):
    """409: the Lease changed since it was read."""


class Lock(Protocol):
    """One Lease (client-go ``resourcelock.Interface``)."""

    def describe(self) -> str:
        """``namespace/name``, for logs."""
        ...

    @property
    def has_version(self) -> bool:
        """Whether a Lease was read or written, so :meth:`update` has a version to name."""
        ...

    async def get(self) -> LeaderElectionRecord | None:
        """The record, or None when the Lease does not exist; remembers its version."""
        ...

    async def create(self, record: LeaderElectionRecord) -> None: ...

    async def update(self, record: LeaderElectionRecord) -> None:
        """Write over the version last read or written; :class:`LockConflict` on 409."""
        ...


class LeaderElector:
    """Acquires the lease, then keeps renewing it until told to stop or until it is lost.

    ``on_started_leading`` runs once leadership is acquired; ``on_stopped_leading(reason)`` runs
    only when it is *lost* (not on :meth:`stop`): the caller must stop everything the lease
    guards at once. Unlike client-go, which calls ``OnStoppedLeading`` on every exit, a stop the
    caller asked for needs no callback: the caller is already stopping.
    """

    def __init__(
        self,
        lock: Lock,
        identity: str,
        config: ElectionConfig,
        *,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[str], Awaitable[None]],
        on_new_leader: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.lock = lock
        self.identity = identity
        self.config = config
        self.state = ElectionState(identity, config.lease_duration)
        self._on_started_leading = on_started_leading
        self._on_stopped_leading = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._clock = clock
        self._wall = wall or (lambda: datetime.datetime.now(datetime.UTC))
        self._rand = rand
        self._reported_leader = ""
        self._task: asyncio.Task[None] | None = None
        self.leading = False
        """True from acquiring until losing or stopping (what the guarded work may rely on)."""

    # -- lifecycle

    def start(self) -> None:
        # ``run`` returns after reporting a lost lease itself; only a crash is logged here.
        self._task = start_watched(
            self.run(),
            name="leader-election",
            logger=logger,
            died="leader election: loop died: %(error)r",
        )

    async def stop(self, *, release: bool, within: float | None = None) -> None:
        """Stop the loops; with ``release``, give the lease up so that another candidate takes
        over at its next attempt rather than after the lease duration (client-go
        ``ReleaseOnCancel``), trying for ``within`` seconds at most (default: the renew
        deadline). Everything the lease guards must have stopped already."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            await cancel_and_wait(task)
        was_leading, self.leading = self.leading, False
        if release and was_leading:
            await self.release(within)

    async def run(self) -> None:
        logger.info("leader election: %s tries to acquire lease %s", self.identity,
                    self.lock.describe())  # fmt: skip
        await self._acquire()
        self.leading = True
        logger.info("leader election: %s acquired lease %s", self.identity, self.lock.describe())
        try:
            self._on_started_leading()
        except Exception as error:
            # Half-started guarded work must not keep running under a lease nobody renews.
            logger.exception("leader election: starting to lead failed")
            reason = f"starting to lead failed: {error!r}"
        else:
            reason = await self._renew()
        self.leading = False
        logger.critical("leader election lost: %s (lease %s)", reason, self.lock.describe())
        await self._on_stopped_leading(reason)

    # -- the loops

    async def _acquire(self) -> None:
        while True:
            if await self._attempt():
                return
            await asyncio.sleep(jittered(self.config.retry_period, self._rand()))

    async def _renew(self) -> str:
        """Renew round after round; the reason once a round fails."""
        while True:
            round_started = self._clock()
            while True:
                remaining = round_started + self.config.renew_deadline - self._clock()
                succeeded = False
                if remaining > 0:
                    # Bounded by the round's deadline: a hung request must not keep a leader
                    # that can no longer renew believing it leads.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(remaining):
                            succeeded = await self._attempt()
                step = after_renew_attempt(
                    succeeded=succeeded,
                    observed_holder=self.state.observed_record.holder_identity,
                    identity=self.identity,
                    round_started=round_started,
                    now=self._clock(),
                    config=self.config,
                )
                if isinstance(step, Lost):
                    return step.reason
                if isinstance(step, Renewed):
                    break
                await asyncio.sleep(step.wait)
            await asyncio.sleep(self.config.retry_period)

    async def _attempt(self) -> bool:
        """One ``tryAcquireOrRenew``; never raises (a failed attempt is retried)."""
        try:
            return await self.try_acquire_or_renew()
        except LockError as error:
            # Refused (RBAC): a setup problem to see, not a race to retry quietly.
            level = logging.WARNING if error.status in (401, 403) else logging.INFO
            logger.log(level, "leader election: lease %s: %s", self.lock.describe(), error)
            return False
        except Exception:
            logger.exception("leader election: attempt on lease %s failed", self.lock.describe())
            return False
        finally:
            self._report_transition()

    async def try_acquire_or_renew(self) -> bool:
        state = self.state
        renewal = state.fast_path(self._clock(), self._wall())
        if renewal is not None and self.lock.has_version:
            try:
                await self.lock.update(renewal)
            except LockError as error:
                logger.debug("leader election: optimistic renewal failed (%s); reading", error)
            else:
                state.set_observed_record(renewal, self._clock())
                return True
        started = self._clock()
        read = await self.lock.get()
        decision = state.decide(read, started, self._wall(), read_at=self._clock())
        if isinstance(decision, Held):
            return False
        if isinstance(decision, Create):
            await self.lock.create(decision.record)
        else:
            await self.lock.update(decision.record)
        state.set_observed_record(decision.record, self._clock())
        return True

    async def release(self, within: float | None = None) -> bool:
        """Give the lease up (client-go ``tryRelease``; a 409 re-reads and tries again, within
        the renew deadline, or ``within`` if shorter). True when nothing of ours is left on
        the Lease."""
        bound = self.config.renew_deadline
        if within is not None:
            bound = min(within, bound)
        try:
            async with asyncio.timeout(bound):
                while True:
                    read = await self.lock.get()
                    if read is None:
                        return True
                    record = self.state.release_record(read, self._wall())
                    if record is None:
                        return True
                    try:
                        await self.lock.update(record)
                    except LockConflict:
                        continue
                    self.state.set_observed_record(record, self._clock())
                    logger.info("leader election: %s released lease %s", self.identity,
                                self.lock.describe())  # fmt: skip
                    return True
        except (LockError, TimeoutError) as error:
            logger.warning("leader election: could not release lease %s: %s; the other "
                           "candidates take over once it expires", self.lock.describe(),
                           str(error) or f"no answer within {bound:g} s")  # fmt: skip
            return False

    def _report_transition(self) -> None:
        holder = self.state.observed_record.holder_identity
        if holder == self._reported_leader:
            return
        self._reported_leader = holder
        if holder:
            logger.info("leader election: lease %s is held by %s", self.lock.describe(), holder)
        if self._on_new_leader is not None:
            self._on_new_leader(holder)
