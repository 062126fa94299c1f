"""tally.charges.ChargeLedger: charges confirmed by their objects, released on time, held; and
tally.charges.verification: what the API's answer about a charge's object means.

Time comes from a fake clock (``now[0]``) and the tests drive :meth:`ChargeLedger.expire`
themselves; only the timer tests run the real ``call_later`` timer. The API's answers are plain
data handed to :meth:`ChargeLedger.verified`, as the verifier would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import pytest

from tally.charges import (
    Answer,
    Charge,
    ChargeLedger,
    Listed,
    ObjectRef,
    ObjectVersion,
    Unanswered,
    Unasked,
)
from tally.charges.verification import (
    MAX_UNANSWERED,
    Verdict,
    decide,
    describe_unanswered,
)
from tally.evaluators.base import GroupResource
from tally.quota.identity import QuotaKey, cluster_quota_key, sync_key
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit

PODS = GroupResource("", "pods")
REF = ObjectRef(PODS, "a", "p")
OTHER_REF = ObjectRef(PODS, "a", "q")
QA = QuotaKey("a", "qa")
QB = QuotaKey("a", "qb")
TIMEOUT = 5.0
STORED = Listed(ObjectVersion("u1", "7"))
NOT_STORED = Listed(None)
FORBIDDEN = Unanswered(403, "Forbidden")
TIMED_OUT = Unanswered(None, "no answer within 4 s")
UNAVAILABLE = Unanswered(503, "Service Unavailable")


def q(text: str) -> Quantity:
    return Quantity.parse(text)


class RecordingMetrics:
    def __init__(self) -> None:
        self.confirmed: list[float] = []
        self.released: list[str] = []
        self.late = 0

    def charge_confirmed(self, seconds: float) -> None:
        self.confirmed.append(seconds)

    def charge_released(self, reason: str) -> None:
        self.released.append(reason)

    def charge_late(self) -> None:
        self.late += 1


class Harness:
    """A ledger on a fake clock, recording its recalculations and metrics."""

    def __init__(self) -> None:
        self.now = [100.0]
        self.metrics = RecordingMetrics()
        self.ledger = ChargeLedger(TIMEOUT, clock=lambda: self.now[0], metrics=self.metrics)
        self.recalculated: list[list[QuotaKey]] = []
        self.ledger.recalculate = self._recalculate

    def _recalculate(self, keys: Iterable[QuotaKey]) -> None:
        self.recalculated.append(sorted(keys))

    def advance(self, seconds: float) -> None:
        self.now[0] += seconds

    def verifying(self) -> list[list[Charge]]:
        """Give the ledger a verifier that only records what it is asked (the test answers
        through :meth:`ChargeLedger.verified`); returns the record."""
        asked: list[list[Charge]] = []

        def verify(charges: list[Charge], answer: Callable[[Charge, Answer], None]) -> None:
            assert answer == self.ledger.verified
            asked.append(list(charges))

        self.ledger.verify = verify
        return asked


@pytest.fixture
def h() -> Harness:
    return Harness()


# -- confirmation


def test_create_confirmed_by_same_uid_stops_holding_at_once(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    assert {"cpu": q("1")} == h.ledger.held(QA)
    h.advance(1.5)

    h.ledger.observed(REF, "u1", "7")

    assert {} == h.ledger.held(QA)
    assert 0 == len(h.ledger)
    assert [1.5] == h.metrics.confirmed
    assert not h.ledger.expects(REF)
    h.advance(TIMEOUT * 3)
    assert [] == h.ledger.expire()
    assert [] == h.recalculated
    assert [] == h.metrics.released


def test_observation_with_another_uid_confirms_nothing(h: Harness) -> None:
    h.ledger.record(REF, "u-new", "", {QA: {"cpu": q("1")}})

    h.ledger.observed(REF, "u-old", "7")

    assert 1 == len(h.ledger)
    assert {"cpu": q("1")} == h.ledger.held(QA)
    assert [] == h.metrics.confirmed
    assert h.ledger.expects(REF)


def test_charge_without_uid_is_confirmed_by_any_uid(h: Harness) -> None:
    h.ledger.record(REF, "", "", {QA: {"cpu": q("1")}})

    h.ledger.observed(REF, "whatever", "7")

    assert 0 == len(h.ledger)
    assert {} == h.ledger.held(QA)
    assert [0.0] == h.metrics.confirmed


def test_observation_of_another_object_confirms_nothing(h: Harness) -> None:
    h.ledger.record(REF, "", "", {QA: {"cpu": q("1")}})

    h.ledger.observed(OTHER_REF, "u1", "7")

    assert 1 == len(h.ledger)
    assert {"cpu": q("1")} == h.ledger.held(QA)


@pytest.mark.parametrize(
    ("resource_version", "confirmed"),
    [
        ("41", False),  # still the object the update replaced
        ("42", True),  # the update was stored
    ],
)
def test_update_is_confirmed_only_past_the_replaced_version(
    h: Harness, resource_version: str, confirmed: bool
) -> None:
    h.ledger.record(REF, "u1", "41", {QA: {"cpu": q("1")}})

    h.ledger.observed(REF, "u1", resource_version)

    assert (0 if confirmed else 1) == len(h.ledger)
    assert ({} if confirmed else {"cpu": q("1")}) == h.ledger.held(QA)
    assert confirmed != h.ledger.expects(REF)


def test_a_confirmed_update_recalculates_its_quotas_and_a_create_does_not(h: Harness) -> None:
    # Two tries of one update were charged (the first lost to a status write at 42 and the
    # API server tried again against 42): the event at 42 confirms the first, which it does
    # not contain, so its quotas are recalculated while the second try's charge stays held.
    h.ledger.record(REF, "u1", "41", {QA: {"cpu": q("1")}})
    h.ledger.record(REF, "u1", "42", {QA: {"cpu": q("1")}, QB: {"cpu": q("1")}})
    h.ledger.record(OTHER_REF, "u2", "", {QB: {"cpu": q("2")}})
    h.ledger.observed(REF, "u1", "42")
    assert [[QA]] == h.recalculated
    assert {"cpu": q("1")} == h.ledger.held(QA)
    h.ledger.observed(REF, "u1", "43")
    assert [[QA], [QA, QB]] == h.recalculated
    h.ledger.observed(OTHER_REF, "u2", "44")
    assert [[QA], [QA, QB]] == h.recalculated
    assert {} == h.ledger.held(QB)


def test_update_observed_at_replaced_version_then_at_next(h: Harness) -> None:
    h.ledger.record(REF, "u1", "41", {QA: {"cpu": q("1")}})
    h.ledger.observed(REF, "u1", "41")
    assert 1 == len(h.ledger)
    h.ledger.observed(REF, "u1", "42")
    assert 0 == len(h.ledger)
    assert 1 == len(h.metrics.confirmed)


def test_update_with_another_uid_is_not_confirmed(h: Harness) -> None:
    h.ledger.record(REF, "u1", "41", {QA: {"cpu": q("1")}})
    h.ledger.observed(REF, "u2", "42")
    assert 1 == len(h.ledger)


def test_expects_while_pending_and_not_after_confirmation(h: Harness) -> None:
    assert not h.ledger.expects(REF)
    h.ledger.record(REF, "u1", "", {QA: {"pods": q("1")}})
    assert h.ledger.expects(REF)
    assert not h.ledger.expects(OTHER_REF)
    h.ledger.observed(REF, "u1", "3")
    assert not h.ledger.expects(REF)


def test_one_observation_confirms_every_matching_charge_of_the_object(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.advance(1)
    h.ledger.record(REF, "u1", "5", {QA: {"cpu": q("2")}})
    h.advance(1)

    h.ledger.observed(REF, "u1", "6")

    assert 0 == len(h.ledger)
    assert [2.0, 1.0] == h.metrics.confirmed


# -- what is held


def test_held_sums_pending_charges_per_quota(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1"), "pods": q("1")}, QB: {"pods": q("1")}})
    h.ledger.record(OTHER_REF, "u2", "", {QA: {"cpu": q("500m"), "memory": q("1Gi")}})

    assert {"cpu": q("1500m"), "pods": q("1"), "memory": q("1Gi")} == h.ledger.held(QA)
    assert {"pods": q("1")} == h.ledger.held(QB)
    assert {} == h.ledger.held(("a", "unknown"))
    assert {} == h.ledger.held(("b", "qa"))


def test_held_counts_a_charge_past_its_deadline_until_it_is_released(h: Harness) -> None:
    # A recalculation between the deadline and the timer's release must still hold it: the
    # object may be confirmed in that window, without a recalculation of its own.
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})  # deadline 105
    h.advance(2)
    h.ledger.record(OTHER_REF, "u2", "", {QA: {"cpu": q("500m")}})  # deadline 107
    h.advance(TIMEOUT - 2)  # 105: the first charge's deadline
    assert {"cpu": q("1500m")} == h.ledger.held(QA)
    assert 2 == len(h.ledger)
    h.ledger.expire()
    assert {"cpu": q("500m")} == h.ledger.held(QA)


# -- asking the API before releasing


def test_an_expired_charge_is_held_while_the_api_is_asked(h: Harness) -> None:
    asked = h.verifying()
    charge = h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.ledger.hold(QB, {"cpu": q("2")})
    h.advance(TIMEOUT)
    # The hold (no object to ask about) is released; the charge is asked about and held.
    assert [QB] == h.ledger.expire()
    assert [[charge]] == asked
    assert {"cpu": q("1")} == h.ledger.held(QA)
    assert ["unconfirmed"] == h.metrics.released
    # Stored: held on; asked again two timeouts later (the object exists: the caches only need
    # to catch up), not at the next deadline.
    h.ledger.verified(charge, STORED)
    assert {"cpu": q("1")} == h.ledger.held(QA)
    h.advance(TIMEOUT)  # 110
    h.ledger.expire()
    assert [[charge]] == asked
    assert {"cpu": q("1")} == h.ledger.held(QA)
    h.advance(TIMEOUT)  # 115
    h.ledger.expire()
    assert [[charge], [charge]] == asked
    # Not stored (or gone): released at once, its quota recalculated.
    h.ledger.verified(charge, NOT_STORED)
    assert {} == h.ledger.held(QA)
    assert [[QB], [QA]] == h.recalculated
    assert ["unconfirmed", "unconfirmed"] == h.metrics.released
    # ... and its object, should it show up after all, is late.
    h.ledger.observed(REF, "u1", "9")
    assert 1 == h.metrics.late


def test_a_charge_confirmed_while_the_api_is_asked_is_not_released(h: Harness) -> None:
    h.verifying()
    charge = h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.advance(TIMEOUT)
    h.ledger.expire()
    h.ledger.observed(REF, "u1", "7")  # the caches caught up
    h.ledger.verified(charge, NOT_STORED)  # an answer from before: too late to matter
    assert [] == h.recalculated
    assert [] == h.metrics.released
    assert 0 == len(h.ledger)


@pytest.mark.parametrize(
    ("refusal", "words"),
    [
        pytest.param(FORBIDDEN, "needs list pods", id="403: the right is named"),
        pytest.param(Unanswered(401, "Unauthorized"), "credentials", id="401"),
    ],
)
def test_a_refused_question_releases_the_charge_at_once_as_unverified(
    h: Harness, caplog: pytest.LogCaptureFixture, refusal: Unanswered, words: str
) -> None:
    asked = h.verifying()
    charge = h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}, QB: {"pods": q("1")}})
    h.advance(TIMEOUT)  # 105: its deadline; held while the API is asked
    assert [] == h.ledger.expire()
    assert [[charge]] == asked
    assert {"cpu": q("1")} == h.ledger.held(QA)

    with caplog.at_level(logging.WARNING, logger="tally.charges.ledger"):
        h.ledger.verified(charge, refusal)

    # Released at once (asking again would be refused again), its quotas recalculated.
    assert [[QA, QB]] == h.recalculated
    assert ["unverified"] == h.metrics.released
    assert (0, {}, {}) == (len(h.ledger), h.ledger.held(QA), h.ledger.held(QB))
    (line,) = [r.getMessage() for r in caplog.records]
    assert "pods a/p" in line
    assert words in line
    # Nothing held afterwards: no deadline asks about it again, none releases it twice.
    for _ in range(3):
        h.advance(TIMEOUT)
        assert [] == h.ledger.expire()
    assert [[charge]] == asked
    assert [[QA, QB]] == h.recalculated
    assert ["unverified"] == h.metrics.released


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(TIMED_OUT, id="timeout"),
        pytest.param(UNAVAILABLE, id="503"),
        pytest.param(Unanswered(None, "ClientConnectorError: refused"), id="connection error"),
    ],
)
def test_unanswered_questions_hold_a_charge_three_deadlines_then_release_it(
    h: Harness, failure: Unanswered
) -> None:
    asked = h.verifying()
    charge = h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    # Recorded at 100: deadlines at 105 and 110 ask, get no answer, and hold on.
    for deadline in (105.0, 110.0):
        h.now[0] = deadline
        assert [] == h.ledger.expire()
        h.ledger.verified(charge, failure)
        assert {"cpu": q("1")} == h.ledger.held(QA)
        assert ([], []) == (h.recalculated, h.metrics.released)
    # 115: the third question, unanswered too: released.
    h.now[0] = 115.0
    assert [] == h.ledger.expire()
    assert {"cpu": q("1")} == h.ledger.held(QA)
    h.ledger.verified(charge, failure)
    assert [[charge], [charge], [charge]] == asked
    assert [[QA]] == h.recalculated
    assert ["unverified"] == h.metrics.released
    assert (0, {}) == (len(h.ledger), h.ledger.held(QA))
    assert 3 == MAX_UNANSWERED  # the bound this script walks through
    # Should its object show up after all, it is late (counted, its quota recalculated).
    h.ledger.observed(REF, "u1", "7")
    assert 1 == h.metrics.late


def test_unanswered_questions_by_the_thousand_log_one_line_a_minute_per_kind(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # A cold start under load: every charge's question times out. 40 charges, each asked
    # three times (held on twice, then released), all within one minute.
    h.verifying()
    refs = [ObjectRef(PODS, "a", f"p{i}") for i in range(40)]
    charges = [h.ledger.record(ref, f"u{i}", "", {QA: {"cpu": q("1")}})
               for i, ref in enumerate(refs)]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="tally.charges.ledger"):
        for deadline in (105.0, 110.0, 115.0):
            h.now[0] = deadline
            h.ledger.expire()
            for charge in charges:
                h.ledger.verified(charge, TIMED_OUT)
        assert ["unverified"] * 40 == h.metrics.released  # every release counted
        first = [r.getMessage() for r in caplog.records]
        # The first line of each kind in full, naming its object; the rest held back.
        assert 2 == len(first), first
        assert "pods a/p0 was stored" in first[0]
        assert "held on" in first[0]
        assert "pods a/p0 was stored" in first[1]
        assert "released unverified" in first[1]
        # A minute after the later first line (115 s): the rest summed up at the next expiry.
        h.now[0] = 115.0 + 60.0
        h.ledger.record(REF, "u-next", "", {QA: {"cpu": q("1")}})
        h.ledger.expire()
    summaries = [r.getMessage() for r in caplog.records][2:]
    assert 2 == len(summaries), summaries
    (held,) = [line for line in summaries if "held on" in line]
    (released,) = [line for line in summaries if "released unverified" in line]
    # 40 charges, 2 held-on lines each, one in full: 79 more; 40 releases, one in full: 39 more.
    assert held.startswith("charges: 79 more charges held on unanswered since the last")
    assert "pods a/p39 was stored" in held
    assert "(2 of 3)" in held
    assert released.startswith("charges: 39 more charges released unverified since the last")
    assert "pods a/p39 was stored" in released


def test_a_stored_answer_between_unanswered_ones_starts_the_count_again(h: Harness) -> None:
    asked = h.verifying()
    charge = h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    # Deadlines every 5 s from 105: two unanswered, then stored at 115 (the next question waits
    # 10 s: none at 120), then two unanswered at 125 and 130.
    for at, answer in [(105.0, TIMED_OUT), (110.0, TIMED_OUT), (115.0, STORED), (120.0, None),
                       (125.0, TIMED_OUT), (130.0, TIMED_OUT)]:  # fmt: skip
        h.now[0] = at
        assert [] == h.ledger.expire()
        if answer is not None:
            h.ledger.verified(charge, answer)
    assert 5 == len(asked)
    # Two unanswered in a row since the stored answer: held, and the stored answer released
    # nothing either.
    assert {"cpu": q("1")} == h.ledger.held(QA)
    assert ([], []) == (h.recalculated, h.metrics.released)
    # 135: the third in a row.
    h.now[0] = 135.0
    h.ledger.expire()
    h.ledger.verified(charge, TIMED_OUT)
    assert 6 == len(asked)
    assert [[QA]] == h.recalculated
    assert ["unverified"] == h.metrics.released


def test_a_stored_object_is_asked_about_ever_more_seldom_until_the_caches_show_it(
    h: Harness,
) -> None:
    # The caches minutes behind (a cold start at scale): each stored answer doubles the wait
    # before the next question, up to 8 timeouts (40 s).
    asked = h.verifying()
    charge = h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    asked_at: list[float] = []
    for _ in range(40):  # every deadline, 105 to 300
        h.advance(TIMEOUT)
        before = len(asked)
        h.ledger.expire()
        if len(asked) > before:
            asked_at.append(h.now[0])
            h.ledger.verified(charge, STORED)
    # Waits after each stored answer: 10, 20, 40, 40, 40 s.
    assert [105.0, 115.0, 135.0, 175.0, 215.0, 255.0, 295.0] == asked_at
    assert {"cpu": q("1")} == h.ledger.held(QA)
    assert [] == h.metrics.released
    h.ledger.observed(REF, "u1", "7")  # the caches caught up
    assert 0 == len(h.ledger)


def test_a_question_never_sent_is_no_strike(h: Harness) -> None:
    asked = h.verifying()
    charge = h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    # Ten deadlines whose questions found every slot taken: held all along, never released.
    for _ in range(10):
        h.advance(TIMEOUT)
        h.ledger.expire()
        h.ledger.verified(charge, Unasked("no slot within 4 s (10 questions in flight)"))
    assert 10 == len(asked)
    assert {"cpu": q("1")} == h.ledger.held(QA)
    assert ([], []) == (h.recalculated, h.metrics.released)
    # Then three unanswered in a row release it, as without them.
    for _ in range(3):
        h.advance(TIMEOUT)
        h.ledger.expire()
        h.ledger.verified(charge, TIMED_OUT)
    assert ["unverified"] == h.metrics.released


def test_a_charge_the_caches_confirm_after_unanswered_questions_is_confirmed(
    h: Harness,
) -> None:
    asked = h.verifying()
    charge = h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.advance(TIMEOUT)
    h.ledger.expire()
    h.ledger.verified(charge, TIMED_OUT)
    h.advance(TIMEOUT)
    h.ledger.expire()  # 110: asked again
    h.ledger.observed(REF, "u1", "7")  # the caches caught up
    h.ledger.verified(charge, TIMED_OUT)  # the second question's answer: it no longer matters
    assert 2 == len(asked)
    assert [10.0] == h.metrics.confirmed
    assert ([], []) == (h.recalculated, h.metrics.released)
    assert (0, {}) == (len(h.ledger), h.ledger.held(QA))


def test_a_question_never_answered_cannot_hold_a_charge_for_ever(h: Harness) -> None:
    asked = h.verifying()
    charge = h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.now[0] = 105.0
    h.ledger.expire()  # asked
    # 110: still out a whole timeout later: written off as unanswered (1), not asked again.
    h.now[0] = 110.0
    assert [] == h.ledger.expire()
    assert 1 == len(asked)
    # Its answer, arriving now, counts for nothing (it was counted when written off).
    h.ledger.verified(charge, TIMED_OUT)
    # 115 asks, 120 writes off (2), 125 asks, 130 writes off (3): released.
    released_at = None
    for deadline in (115.0, 120.0, 125.0, 130.0, 135.0):
        h.now[0] = deadline
        if h.ledger.expire():
            released_at = deadline
            break
    assert 130.0 == released_at
    assert 3 == len(asked)
    assert [[QA]] == h.recalculated
    assert ["unverified"] == h.metrics.released
    assert 0 == len(h.ledger)


def test_a_create_without_uid_is_released_at_its_deadline_unasked(h: Harness) -> None:
    asked = h.verifying()
    # A forged review (the API server always sets the uid) naming an existing object: no new
    # event of it will come, and asking the API would find it by name at every deadline.
    h.ledger.record(REF, "", "", {QA: {"cpu": q("1")}})
    asked_about = h.ledger.record(OTHER_REF, "u2", "", {QB: {"cpu": q("1")}})
    # Until its deadline, any object of its name confirms such a charge.
    third = ObjectRef(PODS, "a", "r")
    h.ledger.record(third, "", "", {QB: {"pods": q("1")}})
    h.advance(1)
    h.ledger.observed(third, "u-any", "3")
    assert [1.0] == h.metrics.confirmed

    h.advance(TIMEOUT - 1)  # 105: both remaining deadlines
    assert [QA] == h.ledger.expire()

    assert [[asked_about]] == asked  # only the charge with a uid was asked about
    assert [[QA]] == h.recalculated
    assert ["unconfirmed"] == h.metrics.released
    assert {} == h.ledger.held(QA)
    assert {"cpu": q("1")} == h.ledger.held(QB)


# -- one object, one create charge


@pytest.mark.parametrize(
    "second_uid",
    [
        pytest.param("u1", id="the same uid: a review judged twice"),
        pytest.param("", id="a review without uid for the same name"),
    ],
)
def test_two_create_charges_confirmed_by_one_object_recalculate_their_quotas(
    h: Harness, second_uid: str
) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"pods": q("1")}})
    h.advance(1)
    h.ledger.record(REF, second_uid, "", {QA: {"pods": q("1")}, QB: {"pods": q("1")}})
    h.ledger.record(OTHER_REF, "u2", "", {QB: {"pods": q("1")}})
    h.advance(1)

    h.ledger.observed(REF, "u1", "7")

    # Both charges are in the statuses; the object is one: recalculated from the caches,
    # which count it once.
    assert [[QA, QB]] == h.recalculated
    assert [2.0] == h.metrics.confirmed  # the first charge confirms the object
    assert ["duplicate"] == h.metrics.released  # the second charged it again
    assert {} == h.ledger.held(QA)
    assert {"pods": q("1")} == h.ledger.held(QB)  # OTHER_REF's, still pending
    assert not h.ledger.expects(REF)  # nothing remembered for a late object
    h.advance(TIMEOUT)
    assert [QB] == h.ledger.expire()


def test_one_create_charge_per_incarnation_is_not_a_duplicate(h: Harness) -> None:
    # The name's old incarnation's charge and the new one's: each object confirms its own.
    h.ledger.record(REF, "u-old", "", {QA: {"pods": q("1")}})
    h.ledger.record(REF, "u-new", "", {QA: {"pods": q("1")}})
    h.ledger.observed(REF, "u-new", "7")
    h.ledger.observed(REF, "u-old", "5")
    assert [] == h.recalculated
    assert [] == h.metrics.released
    assert 2 == len(h.metrics.confirmed)


# -- what the API's answer means


@pytest.mark.parametrize(
    ("uid", "replaces", "answer", "verdict"),
    [
        pytest.param("u1", "", Listed(ObjectVersion("u1", "7")), Verdict.STORED,
                     id="create stored"),
        pytest.param("u1", "", Listed(None), Verdict.NOT_STORED, id="create not stored"),
        pytest.param("u1", "", Listed(ObjectVersion("u0", "3")), Verdict.NOT_STORED,
                     id="create: another incarnation of the name"),
        pytest.param("u1", "41", Listed(ObjectVersion("u1", "42"), ObjectVersion("u1", "41")),
                     Verdict.STORED, id="update stored, the caches behind"),
        pytest.param("u1", "41", Listed(ObjectVersion("u1", "42")), Verdict.STORED,
                     id="update stored, not cached"),
        pytest.param("u1", "41", Listed(ObjectVersion("u1", "41"), ObjectVersion("u1", "41")),
                     Verdict.NOT_STORED, id="update not stored: still the replaced version"),
        pytest.param("u1", "41", Listed(ObjectVersion("u1", "43"), ObjectVersion("u1", "43")),
                     Verdict.NOT_STORED, id="update superseded: the caches hold that version"),
        pytest.param("u1", "41", Listed(None), Verdict.NOT_STORED, id="update: deleted since"),
        pytest.param("u1", "", Unanswered(403, "Forbidden"), Verdict.FORBIDDEN, id="403"),
        pytest.param("u1", "", Unanswered(401, "Unauthorized"), Verdict.FORBIDDEN, id="401"),
        pytest.param("u1", "", Unanswered(404, "Not Found"), Verdict.NOT_STORED,
                     id="404: the kind is no longer served"),
        pytest.param("u1", "", TIMED_OUT, Verdict.UNANSWERED, id="timeout"),
        pytest.param("u1", "", Unasked("no slot"), Verdict.UNASKED, id="never sent"),
        pytest.param("u1", "41", Unanswered(500, "Internal Server Error"), Verdict.UNANSWERED,
                     id="500"),
        pytest.param("u1", "", Unanswered(429, "Too Many Requests"), Verdict.UNANSWERED,
                     id="429"),
    ],
)  # fmt: skip
def test_decide(uid: str, replaces: str, answer: Answer, verdict: Verdict) -> None:
    assert verdict == decide(uid, replaces, answer)


@pytest.mark.parametrize(
    ("resource", "answer", "words"),
    [
        pytest.param("pods", FORBIDDEN, "403 Forbidden: tally's ServiceAccount needs list pods",
                     id="403 pods"),
        pytest.param("podsets.tally.dev", FORBIDDEN,
                     "403 Forbidden: tally's ServiceAccount needs list podsets.tally.dev",
                     id="403 a custom resource"),
        pytest.param("pods", Unanswered(401, "Unauthorized"),
                     "401 Unauthorized: the API server does not accept tally's credentials",
                     id="401"),
        pytest.param("pods", UNAVAILABLE, "503 Service Unavailable", id="503"),
        pytest.param("pods", TIMED_OUT, "no answer within 4 s", id="timeout"),
    ],
)  # fmt: skip
def test_describe_unanswered(resource: str, answer: Unanswered, words: str) -> None:
    assert words == describe_unanswered(resource, answer)


# -- expiry


def test_expire_releases_exactly_the_charges_past_their_deadline(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QB: {"cpu": q("1")}})  # deadline 105
    h.advance(1)
    h.ledger.record(OTHER_REF, "u2", "", {QA: {"cpu": q("2")}})  # deadline 106
    h.advance(1)
    third = ObjectRef(PODS, "a", "r")
    h.ledger.record(third, "u3", "", {QA: {"cpu": q("4")}})  # deadline 107

    assert [] == h.ledger.expire(104.9)
    assert [] == h.recalculated
    assert 3 == len(h.ledger)

    assert [QA, QB] == h.ledger.expire(106.0)

    assert [[QA, QB]] == h.recalculated
    assert ["unconfirmed", "unconfirmed"] == h.metrics.released
    assert 1 == len(h.ledger)
    assert h.ledger.expects(third)
    assert {"cpu": q("4")} == h.ledger.held(QA)
    assert {} == h.ledger.held(QB)


def test_expire_uses_the_clock_without_an_argument(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.advance(TIMEOUT - 0.1)
    assert [] == h.ledger.expire()
    h.advance(0.1)
    assert [QA] == h.ledger.expire()
    assert [[QA]] == h.recalculated
    assert 0 == len(h.ledger)


def test_expire_with_nothing_due_does_not_recalculate(h: Harness) -> None:
    assert [] == h.ledger.expire(1000.0)
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    assert [] == h.ledger.expire(100.0)
    assert [] == h.recalculated
    assert [] == h.metrics.released


def test_released_charge_is_remembered_for_its_late_object(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}, QB: {"cpu": q("1")}})
    h.advance(TIMEOUT)
    assert [QA, QB] == h.ledger.expire()
    assert 0 == len(h.ledger)
    assert h.ledger.expects(REF)  # remembered for a late object
    h.recalculated.clear()

    h.advance(1)
    h.ledger.observed(REF, "u1", "9")

    assert [[QA, QB]] == h.recalculated
    assert 1 == h.metrics.late
    assert [] == h.metrics.confirmed
    assert not h.ledger.expects(REF)

    h.ledger.observed(REF, "u1", "10")
    assert [[QA, QB]] == h.recalculated
    assert 1 == h.metrics.late


def test_observation_with_another_uid_is_not_late(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.advance(TIMEOUT)
    h.ledger.expire()
    h.recalculated.clear()

    h.ledger.observed(REF, "u-other", "9")

    assert [] == h.recalculated
    assert 0 == h.metrics.late
    assert h.ledger.expects(REF)


def test_memory_of_released_charges_ends_one_timeout_later(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.advance(TIMEOUT)
    h.ledger.expire()  # released at 105, remembered until 110
    h.recalculated.clear()

    h.advance(TIMEOUT - 0.1)
    assert [] == h.ledger.expire()
    assert h.ledger.expects(REF)
    h.advance(0.1)
    assert [] == h.ledger.expire()
    assert not h.ledger.expects(REF)

    h.ledger.observed(REF, "u1", "9")
    assert [] == h.recalculated
    assert 0 == h.metrics.late


def test_late_memory_of_one_object_keeps_its_other_charges(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.advance(1)
    h.ledger.record(REF, "u2", "", {QB: {"cpu": q("1")}})
    h.advance(TIMEOUT)
    assert [QA, QB] == h.ledger.expire()
    h.recalculated.clear()

    h.ledger.observed(REF, "u2", "9")
    assert [[QB]] == h.recalculated
    assert h.ledger.expects(REF)  # u1's charge is still remembered

    h.ledger.observed(REF, "u1", "10")
    assert [[QB], [QA]] == h.recalculated
    assert 2 == h.metrics.late
    assert not h.ledger.expects(REF)


# -- holds


def test_hold_counts_until_expired_and_no_observation_confirms_it(h: Harness) -> None:
    h.ledger.hold(QA, {"cpu": q("1")})
    h.ledger.record(REF, "", "", {QB: {"cpu": q("1")}})
    assert {"cpu": q("1")} == h.ledger.held(QA)
    assert 2 == len(h.ledger)

    h.ledger.observed(REF, "u1", "3")  # confirms the record, not the hold
    assert 1 == len(h.ledger)
    assert {"cpu": q("1")} == h.ledger.held(QA)

    h.advance(TIMEOUT)
    assert [QA] == h.ledger.expire()
    assert [[QA]] == h.recalculated
    assert ["unconfirmed"] == h.metrics.released
    assert 0 == len(h.ledger)
    assert {} == h.ledger.held(QA)


def test_hold_of_an_empty_amount_records_nothing(h: Harness) -> None:
    h.ledger.hold(QA, {})
    assert 0 == len(h.ledger)
    assert {} == h.ledger.held(QA)
    h.advance(TIMEOUT)
    assert [] == h.ledger.expire()
    assert [] == h.recalculated


def test_hold_copies_its_amount(h: Harness) -> None:
    amount = {"cpu": q("1")}
    h.ledger.hold(QA, amount)
    amount["memory"] = q("1Gi")
    assert {"cpu": q("1")} == h.ledger.held(QA)


# -- refused requests


def test_release_now_recalculates_and_records_nothing(h: Harness) -> None:
    h.ledger.release_now({QA: {"cpu": q("1")}, QB: {"pods": q("1")}})

    assert 0 == len(h.ledger)
    assert {} == h.ledger.held(QA)
    assert [[QA, QB]] == h.recalculated
    assert ["refused"] == h.metrics.released
    h.advance(TIMEOUT)
    assert [] == h.ledger.expire()
    assert [[QA, QB]] == h.recalculated


def test_release_now_of_nothing_does_nothing(h: Harness) -> None:
    h.ledger.release_now({})
    assert [] == h.recalculated
    assert [] == h.metrics.released


# -- deleted quotas


def test_forget_quota_keeps_the_other_quotas_amounts(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}, QB: {"cpu": q("2")}})

    h.ledger.forget_quota(QA)

    assert {} == h.ledger.held(QA)
    assert {"cpu": q("2")} == h.ledger.held(QB)
    assert 1 == len(h.ledger)
    assert h.ledger.expects(REF)
    h.advance(TIMEOUT)
    assert [QB] == h.ledger.expire()
    assert [[QB]] == h.recalculated


def test_forget_quota_drops_a_charge_on_it_alone(h: Harness) -> None:
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.ledger.record(OTHER_REF, "u2", "", {QB: {"cpu": q("2")}})

    h.ledger.forget_quota(QA)

    assert 1 == len(h.ledger)
    assert not h.ledger.expects(REF)
    assert h.ledger.expects(OTHER_REF)
    assert {} == h.ledger.held(QA)
    h.advance(TIMEOUT)
    assert [QB] == h.ledger.expire()
    assert [[QB]] == h.recalculated
    assert ["unconfirmed"] == h.metrics.released


def test_forget_quota_drops_a_hold_on_it(h: Harness) -> None:
    h.ledger.hold(QA, {"cpu": q("1")})
    h.ledger.forget_quota(QA)
    assert 0 == len(h.ledger)
    h.advance(TIMEOUT)
    assert [] == h.ledger.expire()
    assert [] == h.recalculated


# -- age, construction


def test_oldest_age(h: Harness) -> None:
    assert h.ledger.oldest_age() is None
    h.ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    h.advance(2)
    h.ledger.hold(QB, {"cpu": q("1")})
    h.advance(1)
    assert 3.0 == h.ledger.oldest_age()
    h.ledger.observed(REF, "u1", "4")
    assert 1.0 == h.ledger.oldest_age()
    h.advance(TIMEOUT)
    h.ledger.expire()
    assert h.ledger.oldest_age() is None


@pytest.mark.parametrize("timeout", [0, 0.0, -1.0])
def test_timeout_must_be_positive(timeout: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        ChargeLedger(timeout)


# -- the timer


async def test_timer_releases_on_time_until_stopped() -> None:
    ledger = ChargeLedger(0.05)
    recalculated: list[list[QuotaKey]] = []
    ledger.recalculate = lambda keys: recalculated.append(sorted(keys))
    ledger.start()
    try:
        ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
        await asyncio.sleep(0.2)
        assert [[QA]] == recalculated
        assert 0 == len(ledger)
    finally:
        ledger.stop()

    ledger.record(OTHER_REF, "u2", "", {QB: {"cpu": q("1")}})
    await asyncio.sleep(0.2)
    assert [[QA]] == recalculated
    assert 1 == len(ledger)


async def test_timer_started_late_releases_earlier_charges_and_rearms() -> None:
    ledger = ChargeLedger(0.05)
    recalculated: list[list[QuotaKey]] = []
    ledger.recalculate = lambda keys: recalculated.append(sorted(keys))
    ledger.record(REF, "u1", "", {QA: {"cpu": q("1")}})
    await asyncio.sleep(0.1)
    assert [] == recalculated  # no timer before start()

    ledger.start()
    try:
        await asyncio.sleep(0.02)
        assert [[QA]] == recalculated
        ledger.record(OTHER_REF, "u2", "", {QB: {"cpu": q("1")}})
        await asyncio.sleep(0.2)
        assert [[QA], [QB]] == recalculated
        assert 0 == len(ledger)
    finally:
        ledger.stop()


def test_amend_sets_and_drops_what_a_charge_holds() -> None:
    now = [100.0]
    ledger = ChargeLedger(5.0, clock=lambda: now[0])
    ref = ObjectRef(GroupResource("", "pods"), "a", "p")
    charge = ledger.record(ref, "u", "", {("a", "q1"): {"pods": Quantity.parse("1")}})
    ledger.amend(charge, ("a", "q2"), {"pods": Quantity.parse("1")})
    assert {"pods": Quantity.parse("1")} == ledger.held(("a", "q2"))
    ledger.amend(charge, ("a", "q1"), None)  # its write failed
    assert {} == ledger.held(("a", "q1"))
    assert {"pods": Quantity.parse("1")} == ledger.held(("a", "q2"))
    assert ["a-q2"] == ["-".join(key) for key in ledger.expire(now[0] + 5.0)]


def test_withdraw_forgets_a_charge_without_a_release() -> None:
    now = [100.0]
    metrics: list[str] = []
    ledger = ChargeLedger(5.0, clock=lambda: now[0])
    ledger.metrics.charge_released = metrics.append  # type: ignore[method-assign]
    ref = ObjectRef(GroupResource("", "pods"), "a", "p")
    charge = ledger.record(ref, "u", "", {("a", "q"): {"pods": Quantity.parse("1")}})
    ledger.withdraw(charge)
    assert (0, False, {}) == (len(ledger), ledger.expects(ref), ledger.held(("a", "q")))
    ledger.withdraw(charge)  # twice is harmless
    assert [] == ledger.expire(now[0] + 5.0)
    assert [] == metrics


# -- recalculations wait for admission's writes in flight


def test_a_sync_is_not_deferred_without_a_write_in_flight() -> None:
    h = Harness()
    assert not h.ledger.defer_sync(QA)
    h.ledger.writes_ended(h.ledger.writes_started([QA]))
    assert not h.ledger.defer_sync(QA)
    assert [] == h.recalculated  # nothing was deferred, nothing to run


def test_a_deferred_sync_runs_once_when_the_last_write_ends() -> None:
    h = Harness()
    first = h.ledger.writes_started([QA, QB])
    second = h.ledger.writes_started([QA])
    assert [QA, QB] == first
    assert h.ledger.defer_sync(QA)
    assert h.ledger.defer_sync(QA)  # asked twice: still one recalculation
    assert not h.ledger.defer_sync(("a", "other"))
    h.ledger.writes_ended(first)  # QA's second write is still in flight; QB was not deferred
    assert [] == h.recalculated
    assert h.ledger.defer_sync(QA)
    h.ledger.writes_ended(second)
    assert [[QA]] == h.recalculated
    assert not h.ledger.defer_sync(QA)


def test_a_cluster_quota_share_defers_the_whole_cluster_quotas_sync() -> None:
    # One status write carries every namespace's share: the ClusterQuota controller syncs the
    # whole ClusterQuota, under ("", "clusterquota:<name>").
    h = Harness()
    whole = cluster_quota_key("", "team")
    started = h.ledger.writes_started(
        [cluster_quota_key("a", "team"), cluster_quota_key("b", "team")]
    )
    assert [whole] == started
    assert sync_key(cluster_quota_key("a", "team")) == whole
    assert sync_key(QA) == QA
    assert h.ledger.defer_sync(whole)
    h.ledger.writes_ended(started)
    assert [[whole]] == h.recalculated


def test_a_deleted_quotas_deferred_sync_still_runs_and_the_maps_empty() -> None:
    h = Harness()
    started = h.ledger.writes_started([QA])
    assert h.ledger.defer_sync(QA)
    h.ledger.forget_quota(QA)
    h.ledger.writes_ended(started)
    assert [[QA]] == h.recalculated  # the controller then finds the quota gone
    assert ({}, set()) == (h.ledger._writing, h.ledger._deferred)
