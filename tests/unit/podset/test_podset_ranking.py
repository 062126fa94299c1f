"""Scale-down order: ``ActivePodsWithRanks.less`` and ``get_pods_to_delete``.

Ported from kubernetes ``pkg/controller/controller_utils_test.go``
(TestSortingActivePodsWithRanks, TestSortingActivePods) and
``pkg/controller/replicaset/replica_set_test.go`` (TestGetPodsToDelete); each case names its
upstream test. Feature gates are fixed at their defaults, so upstream's case that disables
``PodDeletionCost`` is not ported. Cases marked "derived" follow upstream code that has no test
table of its own (the deletion-cost parser, sidecar restarts).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Mapping
from typing import Any

import pytest

import builders
from tally.podset import podutil, ranking

pytestmark = pytest.mark.unit

NOW = dt.datetime(2024, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
THEN_1_MONTH = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)  # now.AddDate(0, -1, 0)
THEN_2_HOURS = NOW - dt.timedelta(hours=2)
THEN_5_HOURS = NOW - dt.timedelta(hours=5)
THEN_8_HOURS = NOW - dt.timedelta(hours=8)


def _ts(moment: dt.datetime | None) -> str | None:
    return podutil.format_time(moment) if moment is not None else None


def _ranked_pod(
    name: str,
    node: str,
    phase: str,
    ready: bool,
    restarts: int,
    ready_since: dt.datetime | None,
    created: dt.datetime | None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Upstream TestSortingActivePodsWithRanks' ``pod`` helper: a timestamp and annotations
    not given are there as ``None`` (Go's nil)."""
    return builders.pod(
        name,
        metadata={
            "creationTimestamp": _ts(created),
            "annotations": dict(annotations) if annotations else None,
        },
        bare=True,
        node_name=node,
        phase=phase,
        conditions=[{"type": "Ready", "status": "True", "lastTransitionTime": _ts(ready_since)}]
        if ready
        else None,
        container_statuses=[{"restartCount": restarts}] if ready else None,
    )


COST = podutil.POD_DELETION_COST_ANNOTATION
UNSCHEDULED = _ranked_pod("unscheduled", "", "Pending", False, 0, None, None)
SCHEDULED_PENDING = _ranked_pod("pending", "node", "Pending", False, 0, None, None)
UNKNOWN_PHASE = _ranked_pod("unknown-phase", "node", "Unknown", False, 0, None, None)
RUNNING_NOT_READY = _ranked_pod("not-ready", "node", "Running", False, 0, None, None)
READY_NO_LTT = _ranked_pod("ready-no-last-transition-time", "node", "Running", True, 0, None, None)
READY_NOW = _ranked_pod("ready-now", "node", "Running", True, 0, NOW, NOW)
READY_THEN = _ranked_pod("ready-then", "node", "Running", True, 0, THEN_1_MONTH, THEN_1_MONTH)
READY_NOW_HIGH_RESTARTS = _ranked_pod(
    "ready-high-restarts", "node", "Running", True, 9001, NOW, NOW
)
READY_NOW_CREATED_THEN = _ranked_pod(
    "ready-now-created-then", "node", "Running", True, 0, NOW, THEN_1_MONTH
)
LOW_COST = _ranked_pod(
    "low-deletion-cost", "node", "Running", True, 0, NOW, THEN_1_MONTH, {COST: "10"}
)
HIGH_COST = _ranked_pod(
    "high-deletion-cost", "node", "Running", True, 0, NOW, THEN_1_MONTH, {COST: "100"}
)
UNSCHEDULED_5_HOURS = _ranked_pod(
    "unscheduled-5-hours", "", "Pending", False, 0, THEN_5_HOURS, THEN_5_HOURS
)
UNSCHEDULED_8_HOURS = _ranked_pod(
    "unscheduled-10-hours", "", "Pending", False, 0, THEN_8_HOURS, THEN_8_HOURS
)
READY_2_HOURS = _ranked_pod("ready-2-hours", "", "Running", True, 0, THEN_2_HOURS, THEN_1_MONTH)
READY_5_HOURS = _ranked_pod("ready-5-hours", "", "Running", True, 0, THEN_5_HOURS, THEN_1_MONTH)
READY_10_HOURS = _ranked_pod("ready-10-hours", "", "Running", True, 0, THEN_8_HOURS, THEN_1_MONTH)


class TestSortingActivePodsWithRanks:
    # upstream: TestSortingActivePodsWithRanks, equalityTests (ranks 1 and 1)
    @pytest.mark.parametrize(
        ("p1", "p2"),
        [
            pytest.param(UNSCHEDULED, UNSCHEDULED, id="unscheduled"),
            pytest.param(SCHEDULED_PENDING, SCHEDULED_PENDING, id="scheduled-pending"),
            pytest.param(UNKNOWN_PHASE, UNKNOWN_PHASE, id="unknown-phase"),
            pytest.param(RUNNING_NOT_READY, RUNNING_NOT_READY, id="running-not-ready"),
            pytest.param(
                READY_NOW_CREATED_THEN, READY_NOW_CREATED_THEN, id="ready-now-created-then"
            ),
            pytest.param(READY_NOW, READY_NOW, id="ready-now"),
            pytest.param(READY_THEN, READY_THEN, id="ready-then"),
            pytest.param(READY_NOW_HIGH_RESTARTS, READY_NOW_HIGH_RESTARTS, id="high-restarts"),
            pytest.param(
                UNSCHEDULED_5_HOURS, UNSCHEDULED_8_HOURS, id="created-5h-vs-8h-same-bucket"
            ),
            pytest.param(READY_5_HOURS, READY_10_HOURS, id="ready-5h-vs-8h-same-bucket"),
        ],
    )
    def test_equal(self, p1: dict[str, Any], p2: dict[str, Any]) -> None:
        ranked = ranking.ActivePodsWithRanks(pods=[p1, p2], rank=[1, 1], now=NOW)
        assert not ranked.less(0, 1), "expected the pods to be equivalent"
        assert not ranked.less(1, 0), "expected the pods to be equivalent"

    # upstream: TestSortingActivePodsWithRanks, inequalityTests
    @pytest.mark.parametrize(
        ("lesser", "lesser_rank", "greater", "greater_rank"),
        [
            pytest.param(UNSCHEDULED, 1, SCHEDULED_PENDING, 2, id="unscheduled-lt-scheduled"),
            pytest.param(UNSCHEDULED, 2, SCHEDULED_PENDING, 1, id="unscheduled-lt-scheduled-rank"),
            pytest.param(SCHEDULED_PENDING, 1, UNKNOWN_PHASE, 2, id="pending-lt-unknown"),
            pytest.param(UNKNOWN_PHASE, 1, RUNNING_NOT_READY, 2, id="unknown-lt-running"),
            pytest.param(RUNNING_NOT_READY, 1, READY_NO_LTT, 1, id="not-ready-lt-ready"),
            pytest.param(READY_NO_LTT, 1, READY_NOW, 1, id="no-ready-time-lt-ready-now"),
            pytest.param(READY_NOW, 2, READY_NO_LTT, 1, id="higher-rank-first"),
            pytest.param(READY_NOW, 1, READY_THEN, 1, id="ready-now-lt-ready-then"),
            pytest.param(READY_NOW, 2, READY_THEN, 1, id="higher-rank-before-ready-time"),
            pytest.param(READY_NOW_HIGH_RESTARTS, 1, READY_NOW, 1, id="more-restarts-first"),
            pytest.param(READY_NOW, 2, READY_NOW_HIGH_RESTARTS, 1, id="rank-before-restarts"),
            pytest.param(READY_NOW, 1, READY_NOW_CREATED_THEN, 1, id="newer-first"),
            pytest.param(READY_NOW_CREATED_THEN, 2, READY_NOW, 1, id="rank-before-creation"),
            pytest.param(LOW_COST, 2, HIGH_COST, 1, id="deletion-cost-before-rank"),
            pytest.param(READY_2_HOURS, 1, READY_5_HOURS, 1, id="ready-2h-lt-5h-buckets"),
        ],
    )
    def test_less(
        self,
        lesser: dict[str, Any],
        lesser_rank: int,
        greater: dict[str, Any],
        greater_rank: int,
    ) -> None:
        ranked = ranking.ActivePodsWithRanks(
            pods=[lesser, greater], rank=[lesser_rank, greater_rank], now=NOW
        )
        assert ranked.less(0, 1), "expected the first pod to be deleted first"
        assert not ranked.less(1, 0), "expected the second pod not to be deleted first"

    # derived from compareMaxContainerRestarts: sidecar restarts break a tie of regular ones
    def test_sidecar_restarts_break_ties(self) -> None:
        def with_sidecar(name: str, restarts: int) -> dict[str, Any]:
            pod = _ranked_pod(name, "node", "Running", True, 3, NOW, NOW)
            pod["spec"]["initContainers"] = [
                {"name": "proxy", "restartPolicy": "Always"},
                {"name": "init"},
            ]
            pod["status"]["initContainerStatuses"] = [
                {"name": "proxy", "restartCount": restarts},
                {"name": "init", "restartCount": 100},  # not a sidecar: ignored
            ]
            return pod

        ranked = ranking.ActivePodsWithRanks(
            pods=[with_sidecar("busy", 7), with_sidecar("calm", 1)], rank=[0, 0], now=NOW
        )
        assert ranked.less(0, 1)
        assert not ranked.less(1, 0)

    # derived from logarithmicRankDiff: same bucket falls back to the UID
    def test_same_bucket_orders_by_uid(self) -> None:
        a = _ranked_pod("a", "node", "Running", True, 0, THEN_5_HOURS, THEN_1_MONTH)
        b = _ranked_pod("b", "node", "Running", True, 0, THEN_8_HOURS, THEN_1_MONTH)
        a["metadata"]["uid"] = "zzz"
        b["metadata"]["uid"] = "aaa"
        ranked = ranking.ActivePodsWithRanks(pods=[a, b], rank=[0, 0], now=NOW)
        assert ranked.less(1, 0), "same log2 bucket: the smaller UID goes first"
        assert not ranked.less(0, 1)
        # Without a reference time the plain times compare: the more recent goes first.
        plain = ranking.ActivePodsWithRanks(pods=[a, b], rank=[0, 0], now=None)
        assert plain.less(0, 1)

    # derived from logarithmicRankDiff: the buckets are of time.Duration, i.e. nanoseconds.
    # 35 s and 68 s are both in [2**35, 2**36) ns, but in different buckets of whole seconds.
    def test_buckets_are_nanoseconds(self) -> None:
        younger = _ranked_pod(
            "35s", "node", "Pending", False, 0, None, NOW - dt.timedelta(seconds=35)
        )
        older = _ranked_pod(
            "68s", "node", "Pending", False, 0, None, NOW - dt.timedelta(seconds=68)
        )
        younger["metadata"]["uid"] = "b"
        older["metadata"]["uid"] = "a"
        ranked = ranking.ActivePodsWithRanks(pods=[younger, older], rank=[0, 0], now=NOW)
        assert ranked.less(1, 0), "same nanosecond bucket: the UID decides"
        assert not ranked.less(0, 1)

    # upstream: TestSortingActivePods' order, which ActivePodsWithRanks keeps (equal ranks)
    def test_full_order(self) -> None:
        def running(name: str, ltt: dt.datetime | None, restarts: list[int]) -> dict[str, Any]:
            pod = _ranked_pod(name, "foo", "Running", True, 0, ltt, None)
            pod["status"]["containerStatuses"] = [{"restartCount": r} for r in restarts]
            return pod

        lower_restarts = running("lowerContainerRestartCount", THEN_1_MONTH, [2, 1])
        lower_restarts["metadata"]["creationTimestamp"] = _ts(NOW)
        oldest = running("oldest", THEN_1_MONTH, [2, 1])
        oldest["metadata"]["creationTimestamp"] = _ts(THEN_1_MONTH)
        pods = [
            _ranked_pod("unscheduled", "", "Pending", False, 0, None, None),
            _ranked_pod("scheduledButPending", "bar", "Pending", False, 0, None, None),
            _ranked_pod("unknownPhase", "foo", "Unknown", False, 0, None, None),
            _ranked_pod("runningButNotReady", "foo", "Running", False, 0, None, None),
            running("runningNoLastTransitionTime", None, [3, 0]),
            running("runningWithLastTransitionTime", NOW, [3, 0]),
            running("runningLongerTime", THEN_1_MONTH, [3, 0]),
            lower_restarts,
            oldest,
        ]
        want = [pod["metadata"]["name"] for pod in pods]
        rng = random.Random(7)
        for _ in range(20):
            shuffled = rng.sample(pods, len(pods))
            ranked = ranking.ActivePodsWithRanks(pods=shuffled, rank=[0] * len(pods), now=NOW)
            assert want == [pod["metadata"]["name"] for pod in ranked.sorted_pods()]

    # upstream: sort.Sort(ActivePodsWithRanks) as getPodsToDelete calls it
    def test_active_pods_with_ranks_sorts(self) -> None:
        got = ranking.active_pods_with_ranks([READY_THEN, UNSCHEDULED, READY_NOW], [0, 0, 0], NOW)
        assert ["unscheduled", "ready-now", "ready-then"] == [p["metadata"]["name"] for p in got]

    # derived from GetDeletionCostFromPodAnnotations: an invalid cost ranks as 0
    def test_invalid_deletion_cost_is_zero(self) -> None:
        invalid = _ranked_pod("invalid", "node", "Running", True, 0, NOW, NOW, {COST: "+10"})
        zero = _ranked_pod("zero", "node", "Running", True, 0, NOW, NOW, {COST: "0"})
        negative = _ranked_pod("negative", "node", "Running", True, 0, NOW, NOW, {COST: "-1"})
        ranked = ranking.ActivePodsWithRanks(pods=[invalid, zero, negative], rank=[0] * 3, now=NOW)
        assert not ranked.less(0, 1)
        assert not ranked.less(1, 0)
        assert ranked.less(2, 0)

    def test_malformed_pod_is_a_clear_error(self) -> None:
        bad_time = _ranked_pod("bad", "node", "Running", True, 0, NOW, NOW)
        bad_time["metadata"]["creationTimestamp"] = "yesterday"
        with pytest.raises(podutil.InvalidObjectError, match=r"creationTimestamp"):
            ranking.ActivePodsWithRanks(pods=[bad_time], rank=[0], now=NOW)
        bad_labels = _ranked_pod("bad", "node", "Running", True, 0, NOW, NOW)
        bad_labels["metadata"]["annotations"] = ["not", "a", "map"]
        with pytest.raises(podutil.InvalidObjectError, match=r"metadata.annotations"):
            ranking.ActivePodsWithRanks(pods=[bad_labels], rank=[0], now=NOW)
        with pytest.raises(ValueError, match=r"equal length"):
            ranking.ActivePodsWithRanks(pods=[READY_NOW], rank=[], now=NOW)


class TestGetDeletionCost:
    # derived from GetDeletionCostFromPodAnnotations (validFirstDigit + ParseInt(value, 10, 32))
    @pytest.mark.parametrize(
        ("value", "want"),
        [
            pytest.param(None, 0, id="missing"),
            pytest.param("10", 10, id="positive"),
            pytest.param("0", 0, id="zero"),
            pytest.param("-5", -5, id="negative"),
            pytest.param("-08", -8, id="negative-leading-zero-parses"),
            pytest.param("2147483647", 2**31 - 1, id="int32-max"),
            pytest.param("-2147483648", -(2**31), id="int32-min"),
        ],
    )
    def test_valid(self, value: str | None, want: int) -> None:
        annotations = {} if value is None else {COST: value}
        assert want == ranking.get_deletion_cost_from_pod_annotations(annotations)

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param("+10", id="plus-sign"),
            pytest.param("008", id="leading-zero"),
            pytest.param("", id="empty"),
            pytest.param("-", id="sign-only"),
            pytest.param("2147483648", id="over-int32"),
            pytest.param("1_000", id="underscore"),
            pytest.param(" 1", id="space"),
            pytest.param("1.5", id="decimal"),
            pytest.param("\u0661", id="non-ascii-digit"),
        ],
    )
    def test_invalid(self, value: str) -> None:
        with pytest.raises(ValueError, match=r"value"):
            ranking.get_deletion_cost_from_pod_annotations({COST: value})


def _rs_pod(name: str, phase: str, node: str = "", ready: str | None = None) -> dict[str, Any]:
    """Upstream replica_set_test's ``newPod``: Running pods get ``Ready=True`` unless overridden."""
    conditions = []
    if phase == "Running":
        conditions = [{"type": "Ready", "status": ready or "True"}]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"nodeName": node},
        "status": {"phase": phase, "conditions": conditions},
    }


UNSCHEDULED_PENDING_POD = _rs_pod("unscheduled-pending-pod", "Pending")
SCHEDULED_PENDING_POD = _rs_pod("scheduled-pending-pod", "Pending", "fake-node")
RUNNING_NOT_READY_POD = _rs_pod("scheduled-running-not-ready-pod", "Running", "fake-node", "False")
READY_ON_NODE_1 = _rs_pod("scheduled-running-ready-pod-on-node-1", "Running", "fake-node-1")
READY_ON_NODE_2 = _rs_pod("scheduled-running-ready-pod-on-node-2", "Running", "fake-node-2")


class TestGetPodsToDelete:
    # upstream: TestGetPodsToDelete (related defaults to pods when None)
    @pytest.mark.parametrize(
        ("pods", "related", "diff", "want"),
        [
            pytest.param([], None, 0, [], id="len(pods) = 0 (i.e., diff = 0 too)"),
            pytest.param(
                [RUNNING_NOT_READY_POD, READY_ON_NODE_1],
                None,
                2,
                [RUNNING_NOT_READY_POD, READY_ON_NODE_1],
                id="diff = len(pods)",
            ),
            pytest.param(
                [READY_ON_NODE_1, RUNNING_NOT_READY_POD],
                None,
                1,
                [RUNNING_NOT_READY_POD],
                id="diff < len(pods)",
            ),
            pytest.param(
                [
                    READY_ON_NODE_1,
                    READY_ON_NODE_1,
                    READY_ON_NODE_2,
                    RUNNING_NOT_READY_POD,
                    SCHEDULED_PENDING_POD,
                    UNSCHEDULED_PENDING_POD,
                ],
                None,
                6,
                [
                    READY_ON_NODE_1,
                    READY_ON_NODE_1,
                    READY_ON_NODE_2,
                    RUNNING_NOT_READY_POD,
                    SCHEDULED_PENDING_POD,
                    UNSCHEDULED_PENDING_POD,
                ],
                id="various pod phases and conditions, diff = len(pods)",
            ),
            pytest.param(
                [
                    READY_ON_NODE_1,
                    READY_ON_NODE_1,
                    READY_ON_NODE_2,
                    RUNNING_NOT_READY_POD,
                    SCHEDULED_PENDING_POD,
                    UNSCHEDULED_PENDING_POD,
                ],
                [],
                6,
                [
                    READY_ON_NODE_1,
                    READY_ON_NODE_1,
                    READY_ON_NODE_2,
                    RUNNING_NOT_READY_POD,
                    SCHEDULED_PENDING_POD,
                    UNSCHEDULED_PENDING_POD,
                ],
                id="various pod phases and conditions, diff = len(pods), relatedPods empty",
            ),
            pytest.param(
                [SCHEDULED_PENDING_POD, UNSCHEDULED_PENDING_POD],
                None,
                1,
                [UNSCHEDULED_PENDING_POD],
                id="scheduled vs unscheduled, diff < len(pods)",
            ),
            pytest.param(
                [READY_ON_NODE_1, RUNNING_NOT_READY_POD, RUNNING_NOT_READY_POD],
                None,
                2,
                [RUNNING_NOT_READY_POD, RUNNING_NOT_READY_POD],
                id="ready vs not-ready, diff < len(pods)",
            ),
            pytest.param(
                [READY_ON_NODE_1, READY_ON_NODE_2],
                [READY_ON_NODE_1, READY_ON_NODE_2, READY_ON_NODE_2],
                1,
                [READY_ON_NODE_2],
                id="ready and colocated with another ready pod vs not colocated, diff < len(pods)",
            ),
            pytest.param(
                [SCHEDULED_PENDING_POD, RUNNING_NOT_READY_POD],
                None,
                1,
                [SCHEDULED_PENDING_POD],
                id="pending vs running, diff < len(pods)",
            ),
            pytest.param(
                [
                    READY_ON_NODE_1,
                    READY_ON_NODE_2,
                    RUNNING_NOT_READY_POD,
                    SCHEDULED_PENDING_POD,
                    UNSCHEDULED_PENDING_POD,
                ],
                None,
                3,
                [UNSCHEDULED_PENDING_POD, SCHEDULED_PENDING_POD, RUNNING_NOT_READY_POD],
                id="various pod phases and conditions, diff < len(pods)",
            ),
        ],
    )
    def test_get_pods_to_delete(
        self,
        pods: list[dict[str, Any]],
        related: list[dict[str, Any]] | None,
        diff: int,
        want: list[dict[str, Any]],
    ) -> None:
        got = ranking.get_pods_to_delete(pods, pods if related is None else related, diff, NOW)
        assert [p["metadata"]["name"] for p in want] == [p["metadata"]["name"] for p in got]

    # upstream: getPodsToDelete sorts its argument in place; here it is left alone
    def test_input_is_not_modified(self) -> None:
        pods = [READY_ON_NODE_1, RUNNING_NOT_READY_POD]
        ranking.get_pods_to_delete(pods, pods, 1, NOW)
        assert [READY_ON_NODE_1, RUNNING_NOT_READY_POD] == pods

    # upstream: getPodsRankedByRelatedPodsOnSameNode counts only active related pods
    def test_inactive_related_pods_do_not_rank(self) -> None:
        finished = _rs_pod("finished", "Succeeded", "fake-node-2")
        deleting = _rs_pod("deleting", "Running", "fake-node-2")
        deleting["metadata"]["deletionTimestamp"] = _ts(NOW)
        ranked = ranking.get_pods_ranked_by_related_pods_on_same_node(
            [READY_ON_NODE_1, READY_ON_NODE_2], [READY_ON_NODE_1, finished, deleting], NOW
        )
        assert [1, 0] == list(ranked.rank)

    def test_negative_diff_is_an_error(self) -> None:
        with pytest.raises(ValueError, match=r"negative"):
            ranking.get_pods_to_delete([READY_ON_NODE_1], [], -1, NOW)
