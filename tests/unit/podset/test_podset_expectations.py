"""Controller expectations: counters, TTL expiry on a fake clock, key-tracked deletions.

Ported from kubernetes ``pkg/controller/controller_utils_test.go`` (TestControllerExpectations,
TestUIDExpectations) and the expectation checks of ``replica_set_test.go``
(TestDeletionTimestamp); each test names its upstream test. Upstream fires the observations from
goroutines to exercise its atomics; here everything runs on one thread by design (see the module
docstring), so the observations are plain calls. Not covered: when the controller sets or lowers
expectations (the controller's tests).
"""

from __future__ import annotations

import random

import pytest

from tally.podset import expectations

pytestmark = pytest.mark.unit


class FakeClock:
    """Monotonic seconds that move only when a test steps them."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.time = start

    def __call__(self) -> float:
        return self.time

    def step(self, seconds: float) -> None:
        self.time += seconds


def _store(ttl: float) -> tuple[expectations.ControllerExpectations, FakeClock]:
    clock = FakeClock()
    return expectations.ControllerExpectations(clock=clock, ttl=ttl), clock


# upstream: TestControllerExpectations
def test_controller_expectations() -> None:
    ttl = 30.0
    e, clock = _store(ttl)
    # In practice a controller never has both add and delete expectations, since it either
    # creates or deletes in one pass, and then sleeps until they are met or time out.
    adds, dels = 10, 30
    key = "default/foobar"

    # The controller fires off adds and deletes, then sets expectations.
    e.set_expectations(key, adds, dels)
    for _ in range(adds + 1):
        # In production: a failed create by the controller, or a create seen by the informer.
        e.creation_observed(key)

    # There are still delete expectations.
    assert not e.satisfied_expectations(key), "controller will sync before expectations are met"

    for _ in range(dels + 1):
        e.deletion_observed(key)

    # Expectations have been surpassed.
    exp = e.get_expectations(key)
    assert exp is not None
    assert (-1, -1) == exp.get_expectations()
    assert e.satisfied_expectations(key), "expectations are met but the controller will not sync"

    # Next round of sync: the old expectations are replaced.
    e.set_expectations(key, 1, 2)
    exp = e.get_expectations(key)
    assert exp is not None
    assert (1, 2) == exp.get_expectations()

    # Expectations have expired because of the TTL.
    clock.step(ttl + 1)
    assert e.satisfied_expectations(key), "expectations should have expired but didn't"


# upstream: TestControllerExpectations (the TTL boundary, from isExpired's strict ">")
def test_expectations_expire_only_after_the_ttl() -> None:
    e, clock = _store(expectations.EXPECTATIONS_TIMEOUT)
    e.expect_creations("ns/a", 1)
    clock.step(expectations.EXPECTATIONS_TIMEOUT)
    assert not e.satisfied_expectations("ns/a"), "exactly the TTL is not yet expired"
    clock.step(0.001)
    assert e.satisfied_expectations("ns/a")
    # An expired record is kept, as in upstream's production store; it is only treated as met.
    assert e.get_expectations("ns/a") is not None


# upstream: SatisfiedExpectations ("a new controller doesn't have expectations")
def test_no_record_is_satisfied_and_lowering_it_is_a_no_op() -> None:
    e, _ = _store(30)
    assert e.satisfied_expectations("ns/new")
    e.creation_observed("ns/new")
    e.raise_expectations("ns/new", 1, 1)
    assert e.get_expectations("ns/new") is None


# upstream: ExpectCreations / ExpectDeletions / RaiseExpectations / DeleteExpectations
def test_expect_raise_and_delete() -> None:
    e, _ = _store(30)
    e.expect_creations("ns/a", 2)
    e.raise_expectations("ns/a", 1, 0)
    exp = e.get_expectations("ns/a")
    assert exp is not None
    assert (3, 0) == exp.get_expectations()
    e.expect_deletions("ns/a", 4)  # replaces the record, creations included
    exp = e.get_expectations("ns/a")
    assert exp is not None
    assert (0, 4) == exp.get_expectations()
    e.delete_expectations("ns/a")
    assert e.get_expectations("ns/a") is None
    assert e.satisfied_expectations("ns/a")


# upstream: TestUIDExpectations
def test_uid_expectations() -> None:
    uid_exp = expectations.UIDTrackingControllerExpectations()
    replicas = [2, 1, 0, 5]  # upstream's newReplicationController(n); n does not matter here
    rc_to_pods: dict[str, list[str]] = {}
    rc_keys: list[str] = []
    for i, _ in enumerate(replicas):
        rc_name = f"rc-{i}"
        rc_key = f"default/{rc_name}"
        rc_keys.append(rc_key)
        pod_keys = [f"default/pod{j}-{rc_name}" for j in range(5)]
        rc_to_pods[rc_key] = pod_keys
        uid_exp.expect_deletions(rc_key, pod_keys)
    random.Random(42).shuffle(rc_keys)
    for rc_key in rc_keys:
        assert not uid_exp.satisfied_expectations(rc_key), (
            f"controller {rc_key} satisfied expectations before deletion"
        )
        for pod_key in rc_to_pods[rc_key]:
            uid_exp.deletion_observed(rc_key, pod_key)
        assert uid_exp.satisfied_expectations(rc_key), (
            f"controller {rc_key} didn't satisfy expectations after deletion"
        )
        uid_exp.delete_expectations(rc_key)
        assert uid_exp.get_uids(rc_key) is None, f"failed to delete uid expectations for {rc_key}"


# upstream: TestDeletionTimestamp (the expectation checks: a graceful delete, seen first as an
# update that sets deletionTimestamp and later as the delete itself, counts once)
def test_graceful_delete_and_final_delete_count_once() -> None:
    uid_exp = expectations.UIDTrackingControllerExpectations()
    rs_key = "default/foobar"
    uid_exp.expect_deletions(rs_key, ["default/pod0", "default/secondPod"])

    uid_exp.deletion_observed(rs_key, "default/pod0")  # update: deletionTimestamp set
    uid_exp.deletion_observed(rs_key, "default/pod0")  # the delete event, later
    exp = uid_exp.get_expectations(rs_key)
    assert exp is not None
    assert (0, 1) == exp.get_expectations(), "a second event for the same pod must not count"
    assert not uid_exp.satisfied_expectations(rs_key)

    uid_exp.deletion_observed(rs_key, "default/secondPod")
    assert uid_exp.satisfied_expectations(rs_key)
    assert frozenset() == uid_exp.get_uids(rs_key)


# upstream: DeletionObserved (only keys in the expected set lower the count)
def test_unexpected_deletion_lowers_nothing() -> None:
    uid_exp = expectations.UIDTrackingControllerExpectations()
    uid_exp.expect_deletions("ns/rs", ["ns/a"])
    uid_exp.deletion_observed("ns/rs", "ns/someone-elses")
    uid_exp.deletion_observed("ns/other-rs", "ns/a")
    exp = uid_exp.get_expectations("ns/rs")
    assert exp is not None
    assert (0, 1) == exp.get_expectations()
    assert frozenset({"ns/a"}) == uid_exp.get_uids("ns/rs")


# upstream: ExpectDeletions builds a set (duplicates count once) and clobbers the old keys
def test_expect_deletions_replaces_keys_and_counts_each_once() -> None:
    uid_exp = expectations.UIDTrackingControllerExpectations()
    uid_exp.expect_deletions("ns/rs", ["ns/a", "ns/b"])
    uid_exp.expect_deletions("ns/rs", ["ns/c", "ns/c"])
    exp = uid_exp.get_expectations("ns/rs")
    assert exp is not None
    assert (0, 1) == exp.get_expectations()
    assert frozenset({"ns/c"}) == uid_exp.get_uids("ns/rs")
    uid_exp.deletion_observed("ns/rs", "ns/a")  # clobbered: no longer expected
    assert not uid_exp.satisfied_expectations("ns/rs")


# upstream: TestUIDExpectations with controller_utils_test's fake clock stepped past the TTL
def test_uid_expectations_expire() -> None:
    clock = FakeClock()
    uid_exp = expectations.UIDTrackingControllerExpectations(
        expectations.ControllerExpectations(clock=clock, ttl=30)
    )
    uid_exp.expect_deletions("ns/rs", ["ns/a", "ns/b"])
    uid_exp.deletion_observed("ns/rs", "ns/a")  # the delete event for ns/b is dropped
    assert not uid_exp.satisfied_expectations("ns/rs")
    clock.step(31)
    assert uid_exp.satisfied_expectations("ns/rs"), "a dropped delete must not block forever"


# upstream: TestSyncReplicaSetDormancy (the expectation steps: create expectations, lowered by
# the informer or by a failed create)
def test_uid_tracking_creations_are_plain_counters() -> None:
    uid_exp = expectations.UIDTrackingControllerExpectations()
    uid_exp.expect_creations("default/foobar", 1)
    assert not uid_exp.satisfied_expectations("default/foobar")
    uid_exp.creation_observed("default/foobar")
    assert uid_exp.satisfied_expectations("default/foobar")
    uid_exp.set_expectations("default/foobar", 2, 0)
    uid_exp.lower_expectations("default/foobar", 1, 0)
    uid_exp.raise_expectations("default/foobar", 0, 1)
    exp = uid_exp.get_expectations("default/foobar")
    assert exp is not None
    assert (1, 1) == exp.get_expectations()
