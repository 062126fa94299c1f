"""tally.machinery.leaderelection: the election's decisions, on plain records and a stepped clock.

The first table is client-go's ``TestTryAcquireOrRenew`` (``tools/leaderelection/
leaderelection_test.go``, v0.37.1): candidate ``baz``, lease duration 10 s, each case an
observed record and time, the record the Lease holds, and the expected outcome (success, the
holder observed afterwards, whether ``leaseTransitions`` went up). client-go sets the observed
raw record to the observed record in every case, and so does :func:`state`. Its "past" and
"future" are 1000 hours away; a missing object is a read of None here.

Then: the renew loop's steps (``renew``: rounds bounded by the renew deadline), the release
(``TestReleaseLease``), the configuration checks (``NewLeaderElector``,
``TestLeaderElectionConfigValidation``), the Lease spec round trip
(``TestLeaseSpecToLeaderElectionRecordRoundTrip``), and whole elections between two candidates
driven step by step with client-go's default durations.
"""

from __future__ import annotations

import datetime

import pytest

from tally.machinery.leaderelection import (
    Create,
    ElectionConfig,
    ElectionConfigError,
    ElectionState,
    Held,
    LeaderElectionRecord,
    Lost,
    Renewed,
    Retry,
    Update,
    after_renew_attempt,
    config_problem,
    format_micro_time,
    jittered,
    lease_spec,
    record_from_lease_spec,
)

pytestmark = pytest.mark.unit

NOW = 1_000_000.0
HOURS_1000 = 1000 * 3600.0
PAST = NOW - HOURS_1000
FUTURE = NOW + HOURS_1000
READ_LATENCY = 0.001
"""A read returns after the attempt began (client-go stamps an observation with a second clock
read): the one case where this matters is "don't acquire from led, acked object"."""
WALL = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)


def state(
    observed: LeaderElectionRecord | None = None,
    observed_time: float | None = None,
    *,
    identity: str = "baz",
    lease_duration: int = 10,
) -> ElectionState:
    record = observed or LeaderElectionRecord()
    return ElectionState(
        identity,
        lease_duration,
        observed_record=record,
        observed_raw=record,
        observed_time=observed_time,
    )


def attempt(election: ElectionState, read: LeaderElectionRecord | None, now: float = NOW) -> bool:
    """The slow path of one ``tryAcquireOrRenew`` whose writes succeed; its result."""
    decision = election.decide(read, now, WALL, read_at=now + READ_LATENCY)
    if isinstance(decision, Held):
        return False
    election.set_observed_record(decision.record, now + 2 * READ_LATENCY)
    return True


@pytest.mark.parametrize(
    ("observed", "observed_time", "read", "retry_after", "succeeds", "transitions", "holder"),
    [
        pytest.param(None, None, None, 0, True, 0, "baz", id="acquire from no object"),
        pytest.param(
            None,
            None,
            record_from_lease_spec({}),
            0,
            True,
            1,
            "baz",
            id="acquire from object without annotations",
        ),
        pytest.param(
            None,
            None,
            LeaderElectionRecord("bing", 3),
            3.0,
            True,
            1,
            "baz",
            id="acquire from led object with the lease duration seconds",
        ),
        pytest.param(
            None,
            None,
            LeaderElectionRecord(),
            0,
            True,
            1,
            "baz",
            id="acquire from unled object",
        ),
        pytest.param(
            LeaderElectionRecord("bing"),
            PAST,
            LeaderElectionRecord("bing"),
            0,
            True,
            1,
            "baz",
            id="acquire from led, unacked object",
        ),
        pytest.param(
            None,
            FUTURE,
            LeaderElectionRecord(""),
            0,
            True,
            1,
            "baz",
            id="acquire from empty led, acked object",
        ),
        pytest.param(
            None,
            FUTURE,
            LeaderElectionRecord("bing"),
            0,
            False,
            0,
            "bing",
            id="don't acquire from led, acked object",
        ),
        pytest.param(
            LeaderElectionRecord("baz"),
            FUTURE,
            LeaderElectionRecord("baz"),
            0,
            True,
            0,
            "baz",
            id="renew already acquired object",
        ),
    ],
)
def test_try_acquire_or_renew(
    observed: LeaderElectionRecord | None,
    observed_time: float | None,
    read: LeaderElectionRecord | None,
    retry_after: float,
    succeeds: bool,
    transitions: int,
    holder: str,
) -> None:
    election = state(observed, observed_time)
    result = attempt(election, read)
    if result != succeeds and retry_after:
        # client-go sleeps retryAfter after the first attempt returned and tries once more: the
        # record has not changed, so the lease counts from when it was first seen, and has
        # expired.
        assert election.observed_time is not None
        result = attempt(election, read, election.observed_time + retry_after)
    assert succeeds == result
    assert holder == election.observed_record.holder_identity
    assert transitions == election.observed_record.leader_transitions


def test_a_foreign_lease_is_respected_until_it_expires_by_our_clock() -> None:
    # Seen at NOW with leaseDurationSeconds 10: held at NOW + 9.999, taken at NOW + 10.
    # The record's own timestamps (an hour ago by the other machine's clock) do not matter.
    hour_ago = WALL - datetime.timedelta(hours=1)
    foreign = LeaderElectionRecord("bing", 10, hour_ago, hour_ago, 4)
    election = state()
    assert election.decide(foreign, NOW, WALL) == Held("bing")
    assert election.decide(foreign, NOW + 9.999, WALL) == Held("bing")
    decision = election.decide(foreign, NOW + 10, WALL)
    assert decision == Update(LeaderElectionRecord("baz", 10, WALL, WALL, 5))


def test_every_renewal_of_the_holder_restarts_its_lease() -> None:
    # The holder renews (renewTime changes) before each expiry: never taken over.
    election = state()
    for step in range(10):
        renewed_at = WALL + datetime.timedelta(seconds=8 * step)
        record = LeaderElectionRecord("bing", 10, WALL, renewed_at, 0)
        assert election.decide(record, NOW + 8 * step, WALL) == Held("bing")
    # It stops renewing: 10 s after the last change was seen, the lease is free to take.
    assert election.decide(record, NOW + 72 + 9.9, WALL) == Held("bing")
    assert isinstance(election.decide(record, NOW + 72 + 10, WALL), Update)


def test_create_and_takeover_records() -> None:
    assert state().decide(None, NOW, WALL) == Create(LeaderElectionRecord("baz", 10, WALL, WALL))
    expired = LeaderElectionRecord("bing", 10, WALL, WALL, 7)
    decision = state(expired, PAST).decide(expired, NOW, WALL)
    # A takeover starts a new term: acquireTime now, one more transition.
    assert decision == Update(LeaderElectionRecord("baz", 10, WALL, WALL, 8))


def test_renewal_keeps_acquire_time_and_transitions() -> None:
    acquired = WALL - datetime.timedelta(minutes=5)
    mine = LeaderElectionRecord("baz", 10, acquired, acquired, 3)
    election = state(mine, NOW - 2)
    expected = LeaderElectionRecord("baz", 10, acquired, WALL, 3)
    # The slow path (after a read) and the fast path (no read) write the same renewal.
    assert election.decide(mine, NOW, WALL) == Update(expected)
    assert state(mine, NOW - 2).fast_path(NOW, WALL) == expected


@pytest.mark.parametrize(
    ("observed", "observed_time"),
    [
        pytest.param(LeaderElectionRecord("bing", 10), NOW, id="not the leader"),
        pytest.param(LeaderElectionRecord("baz", 10), NOW - 10, id="own lease expired"),
        pytest.param(LeaderElectionRecord("baz", 10), None, id="never observed"),
    ],
)
def test_no_fast_path_unless_leading_with_a_valid_lease(
    observed: LeaderElectionRecord, observed_time: float | None
) -> None:
    assert state(observed, observed_time).fast_path(NOW, WALL) is None


# -- renew: rounds bounded by the renew deadline (client-go defaults: 15 s / 10 s / 2 s)

DEFAULTS = ElectionConfig()


@pytest.mark.parametrize(
    ("succeeded", "holder", "elapsed", "expected"),
    [
        pytest.param(True, "baz", 0.0, Renewed(), id="renewed"),
        pytest.param(True, "baz", 9.9, Renewed(), id="renewed late in the round"),
        pytest.param(False, "baz", 0.0, Retry(2.0), id="failed: retry after the retry period"),
        pytest.param(False, "baz", 9.5, Retry(0.5), id="failed: last retry at the deadline"),
        pytest.param(
            False,
            "baz",
            10.0,
            Lost("not renewed within the renew deadline (10 s)"),
            id="failed at the renew deadline",
        ),
        pytest.param(
            False, "", 3.0, Retry(2.0), id="lease found released: retry (re-acquire) in time"
        ),
        pytest.param(
            False,
            "bing",
            0.0,
            Lost("the lease is held by bing"),
            id="another holder: lost at once, before the deadline",
        ),
    ],
)
def test_after_renew_attempt(
    succeeded: bool, holder: str, elapsed: float, expected: object
) -> None:
    step = after_renew_attempt(
        succeeded=succeeded,
        observed_holder=holder,
        identity="baz",
        round_started=NOW,
        now=NOW + elapsed,
        config=DEFAULTS,
    )
    assert expected == step


def test_a_leader_gives_up_before_anyone_may_take_over() -> None:
    # The margin client-go's defaults leave. The last renewal succeeds at T; the next round
    # starts retry_period later and is lost renew_deadline after that: T + 12. A candidate
    # that read the renewal at T (the earliest it can) takes over at T + 15.
    last_success = NOW
    round_started = last_success + DEFAULTS.retry_period
    elapsed = 0.0
    while True:
        step = after_renew_attempt(
            succeeded=False,
            observed_holder="baz",
            identity="baz",
            round_started=round_started,
            now=round_started + elapsed,
            config=DEFAULTS,
        )
        if isinstance(step, Lost):
            break
        assert isinstance(step, Retry)
        elapsed += step.wait
    gave_up_at = round_started + elapsed
    assert gave_up_at == last_success + 12.0

    candidate = state(identity="bing", lease_duration=15)
    renewal = LeaderElectionRecord("baz", 15, WALL, WALL)
    assert candidate.decide(renewal, last_success, WALL) == Held("baz")
    assert candidate.decide(renewal, gave_up_at, WALL) == Held("baz")
    assert candidate.decide(renewal, last_success + 14.999, WALL) == Held("baz")
    assert isinstance(candidate.decide(renewal, last_success + 15, WALL), Update)


# -- release (client-go TestReleaseLease: "release acquired lock from no object")


def test_release_writes_an_empty_holder_with_a_one_second_lease() -> None:
    election = state()
    assert attempt(election, LeaderElectionRecord("baz"))
    assert election.is_leader()
    read = LeaderElectionRecord("baz", 10, WALL, WALL, 0)
    later = WALL + datetime.timedelta(seconds=30)
    record = election.release_record(read, later)
    assert record == LeaderElectionRecord("", 1, later, later, 0)
    assert record is not None
    election.set_observed_record(record, NOW + 1)
    assert "" == election.observed_record.holder_identity
    assert not election.is_leader()


def test_a_released_lease_is_taken_at_once() -> None:
    # No waiting out a lease duration: an empty holder is free (client-go step 3's check
    # needs a holder), so the other replica takes over at its next attempt.
    released = LeaderElectionRecord("", 1, WALL, WALL, 4)
    candidate = state(LeaderElectionRecord("baz", 15), NOW - 1, identity="bing")
    decision = candidate.decide(released, NOW, WALL)
    assert decision == Update(LeaderElectionRecord("bing", 10, WALL, WALL, 5))


@pytest.mark.parametrize(
    ("observed", "read"),
    [
        pytest.param(LeaderElectionRecord("bing"), LeaderElectionRecord("bing"), id="never led"),
        pytest.param(
            LeaderElectionRecord("baz"),
            LeaderElectionRecord("bing", 10, WALL, WALL, 1),
            id="someone took over meanwhile",
        ),
    ],
)
def test_nothing_to_release(observed: LeaderElectionRecord, read: LeaderElectionRecord) -> None:
    assert state(observed, NOW).release_record(read, WALL) is None


# -- whole elections, two candidates, one Lease (plain data standing for it)


class Lease:
    """The record a Lease holds and a version, with the API server's compare-and-swap."""

    def __init__(self) -> None:
        self.record: LeaderElectionRecord | None = None
        self.version = 0

    def write(self, record: LeaderElectionRecord, version: int | None) -> bool:
        if version != (self.version if self.record is not None else None):
            return False
        self.record, self.version = record, self.version + 1
        return True


def run_attempt(election: ElectionState, lease: Lease, now: float) -> bool:
    read, version = lease.record, (lease.version if lease.record is not None else None)
    # Every write stamps the writer's wall clock: a renewal changes the record.
    wall = WALL + datetime.timedelta(seconds=now - NOW)
    decision = election.decide(read, now, wall)
    if isinstance(decision, Held):
        return False
    if not lease.write(decision.record, version):
        return False
    election.set_observed_record(decision.record, now)
    return True


def test_two_candidates_exactly_one_leads_and_the_other_takes_over_after_a_crash() -> None:
    lease = Lease()
    a = state(identity="a", lease_duration=15)
    b = state(identity="b", lease_duration=15)
    # Both start together; reads happen before either writes, so both decide to create.
    a_decision, b_decision = a.decide(None, NOW, WALL), b.decide(None, NOW, WALL)
    assert isinstance(a_decision, Create)
    assert isinstance(b_decision, Create)
    assert lease.write(a_decision.record, None)
    assert not lease.write(b_decision.record, None)  # AlreadyExists
    a.set_observed_record(a_decision.record, NOW)
    assert lease.record is not None
    assert "a" == lease.record.holder_identity

    # a renews every 2 s for a minute; b tries every 2 s and never gets it.
    t = NOW
    for _ in range(30):
        t += 2.0
        assert run_attempt(a, lease, t)
        assert not run_attempt(b, lease, t + 0.5)
    assert lease.record is not None
    assert (lease.record.holder_identity, lease.record.leader_transitions) == ("a", 0)

    # a dies right after its renewal at t. b saw that renewal at t + 0.5 and takes over at
    # its first attempt from t + 0.5 + 15 on.
    tries = [t + 0.5 + 2.0 * k for k in range(1, 10)]
    taken = next(at for at in tries if run_attempt(b, lease, at))
    assert taken == t + 0.5 + 16.0
    assert (lease.record.holder_identity, lease.record.leader_transitions) == ("b", 1)
    # a comes back (a restart, a new identity in practice): b's lease is respected.
    a2 = state(identity="a2", lease_duration=15)
    assert not run_attempt(a2, lease, taken + 1)


def test_two_candidates_release_hands_over_at_the_next_attempt() -> None:
    lease = Lease()
    a = state(identity="a", lease_duration=15)
    b = state(identity="b", lease_duration=15)
    assert run_attempt(a, lease, NOW)
    assert not run_attempt(b, lease, NOW + 1)
    assert lease.record is not None
    record = a.release_record(lease.record, WALL)
    assert record is not None
    assert lease.write(record, lease.version)
    assert run_attempt(b, lease, NOW + 2)
    assert (lease.record.holder_identity, lease.record.leader_transitions) == ("b", 1)


# -- configuration (client-go NewLeaderElector)


@pytest.mark.parametrize(
    ("durations", "problem"),
    [
        pytest.param((15, 10.0, 2.0), "", id="client-go defaults"),
        pytest.param((15, 2.0, 1.0), "", id="TestLeaderElectionConfigValidation"),
        pytest.param(
            (10, 10.0, 2.0), "leaseDuration must be greater than renewDeadline", id="lease=renew"
        ),
        pytest.param(
            (15, 2.4, 2.0),
            "renewDeadline must be greater than retryPeriod*JitterFactor",
            id="renew=1.2*retry",
        ),
        pytest.param((15, 10.0, 0.0), "retryPeriod must be greater than zero", id="no retry"),
    ],
)
def test_config_checks(durations: tuple[int, float, float], problem: str) -> None:
    assert problem == config_problem(*durations)
    if problem:
        with pytest.raises(ElectionConfigError, match=problem.replace("*", r"\*")):
            ElectionConfig(*durations)
    else:
        ElectionConfig(*durations)


def test_jitter_between_one_and_two_point_two_retry_periods() -> None:
    assert jittered(2.0, 0.0) == 2.0
    assert jittered(2.0, 1.0) == pytest.approx(4.4)


# -- the Lease spec


def test_lease_spec_round_trip() -> None:
    # TestLeaseSpecToLeaderElectionRecordRoundTrip, and metav1.MicroTime's JSON form.
    record = LeaderElectionRecord("holder", 15, WALL, WALL + datetime.timedelta(seconds=1), 2)
    spec = lease_spec(record)
    assert spec == {
        "holderIdentity": "holder",
        "leaseDurationSeconds": 15,
        "leaseTransitions": 2,
        "acquireTime": "2026-01-02T03:04:05.678901Z",
        "renewTime": "2026-01-02T03:04:06.678901Z",
    }
    assert record == record_from_lease_spec(spec)


def test_micro_time_is_utc() -> None:
    plus_two = datetime.timezone(datetime.timedelta(hours=2))
    moment = datetime.datetime(2026, 1, 2, 5, 4, 5, 1, tzinfo=plus_two)
    assert "2026-01-02T03:04:05.000001Z" == format_micro_time(moment)


def test_an_empty_spec_is_a_free_lease() -> None:
    assert LeaderElectionRecord() == record_from_lease_spec(None)
    assert LeaderElectionRecord() == record_from_lease_spec({"holderIdentity": None})
