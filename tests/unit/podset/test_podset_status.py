"""PodSet status: counters, the ReplicaFailure condition, the write check, availability.

Ported from kubernetes ``pkg/controller/replicaset/replica_set_utils_test.go``
(TestCalculateStatus, TestCalculateStatusConditions), ``replica_set_test.go`` (TestGetCondition,
TestSetCondition, TestRemoveCondition), ``pkg/controller/controller_utils_test.go``
(TestActivePodFiltering, TestCountTerminatingPods) and ``pkg/api/v1/pod/util_test.go``
(TestIsPodAvailable); each case names its upstream test. tally always reports
``terminatingReplicas``, as upstream does with its feature gate on, so the gate-off cases of
TestCalculateStatus are ported with the gate-on expectation. Cases marked "derived" follow
upstream code that has no test table of its own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest

import builders
from tally.podset import podutil, status

pytestmark = pytest.mark.unit

NOW = dt.datetime(2024, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
NOW_TEXT = "2024-06-01T12:00:00Z"
LABEL_MAP = {"name": "foo"}
FULL_LABEL_MAP = {"name": "foo", "type": "production"}


def _podset(
    replicas: int, selector: Mapping[str, str], min_ready_seconds: int = 0, **status_: Any
) -> dict[str, Any]:
    """Upstream's ``newReplicaSet``: the template always has labels name=foo, type=production."""
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": dict(selector)},
        "template": {"metadata": {"labels": dict(FULL_LABEL_MAP)}, "spec": {}},
    }
    if min_ready_seconds:
        spec["minReadySeconds"] = min_ready_seconds
    return {
        "metadata": {"name": "foobar", "namespace": "default", "uid": "uid-rs", "generation": 1},
        "spec": spec,
        "status": dict(status_),
    }


def _new_pod(
    name: str, podset: Mapping[str, Any], phase: str, ready_since: str | None = None
) -> dict[str, Any]:
    """Upstream's ``newPod``: the selector's labels; Running pods are Ready=True."""
    conditions = []
    if phase == "Running":
        conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready_since}]
    labels = podset["spec"]["selector"]["matchLabels"]
    return builders.pod(
        name, namespace="default", labels=labels, bare=True, phase=phase, conditions=conditions
    )


def _terminating(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["deletionTimestamp"] = NOW_TEXT
    return pod


NOT_FULLY_LABELLED = _podset(1, LABEL_MAP)
FULLY_LABELLED = _podset(2, FULL_LABEL_MAP)  # 2 replicas for the condition tests
LONG_MIN_READY = _podset(1, FULL_LABEL_MAP, min_ready_seconds=3600)


def _counts(
    replicas: int, fully: int, ready: int, available: int, terminating: int = 0
) -> dict[str, int]:
    return {
        "replicas": replicas,
        "fullyLabeledReplicas": fully,
        "readyReplicas": ready,
        "availableReplicas": available,
        "terminatingReplicas": terminating,
    }


class TestCalculateStatus:
    # upstream: TestCalculateStatus
    @pytest.mark.parametrize(
        ("podset", "active", "terminating", "want"),
        [
            pytest.param(
                FULLY_LABELLED,
                [_new_pod("pod1", FULLY_LABELLED, "Running")],
                [],
                _counts(1, 1, 1, 1),
                id="1 fully labelled pod",
            ),
            pytest.param(
                NOT_FULLY_LABELLED,
                [_new_pod("pod1", NOT_FULLY_LABELLED, "Running")],
                [],
                _counts(1, 0, 1, 1),
                id="1 not fully labelled pod",
            ),
            pytest.param(
                FULLY_LABELLED,
                [
                    _new_pod("pod1", FULLY_LABELLED, "Running"),
                    _new_pod("pod2", FULLY_LABELLED, "Running"),
                ],
                [],
                _counts(2, 2, 2, 2),
                id="2 fully labelled pods (with DeploymentPodReplacementPolicy)",
            ),
            pytest.param(
                NOT_FULLY_LABELLED,
                [
                    _new_pod("pod1", NOT_FULLY_LABELLED, "Running"),
                    _new_pod("pod2", NOT_FULLY_LABELLED, "Running"),
                ],
                [],
                _counts(2, 0, 2, 2),
                id="2 not fully labelled pods",
            ),
            pytest.param(
                NOT_FULLY_LABELLED,
                [
                    _new_pod("pod1", NOT_FULLY_LABELLED, "Running"),
                    _new_pod("pod2", FULLY_LABELLED, "Running"),
                ],
                [],
                _counts(2, 1, 2, 2),
                id="1 fully labelled pod, 1 not fully labelled pod",
            ),
            pytest.param(
                FULLY_LABELLED,
                [_new_pod("pod1", FULLY_LABELLED, "Pending")],
                [],
                _counts(1, 1, 0, 0),
                id="1 non-ready pod",
            ),
            pytest.param(
                LONG_MIN_READY,
                [_new_pod("pod1", LONG_MIN_READY, "Running")],
                [],
                _counts(1, 1, 1, 0),
                id="1 ready but non-available pod",
            ),
            pytest.param(
                FULLY_LABELLED,
                [_new_pod("pod1", FULLY_LABELLED, "Running")],
                [
                    _terminating(_new_pod("pod2", FULLY_LABELLED, "Running")),
                    _terminating(_new_pod("pod3", FULLY_LABELLED, "Running")),
                ],
                _counts(1, 1, 1, 1, terminating=2),
                id="1 fully labelled pods and 2 terminating with DeploymentPodReplacementPolicy",
            ),
        ],
    )
    def test_calculate_status(
        self,
        podset: dict[str, Any],
        active: list[dict[str, Any]],
        terminating: list[dict[str, Any]],
        want: dict[str, int],
    ) -> None:
        got = status.calculate_status(podset, active, None, NOW, terminating_pods=terminating)
        assert want == got

    # upstream: calculateStatus starts from rs.Status and leaves ObservedGeneration alone
    def test_other_fields_are_kept_and_input_untouched(self) -> None:
        podset = _podset(1, FULL_LABEL_MAP, observedGeneration=7)
        podset["status"]["selector"] = "name=foo"
        got = status.calculate_status(podset, [_new_pod("p", podset, "Running")], None, NOW)
        assert 7 == got["observedGeneration"]
        assert "name=foo" == got["selector"]
        assert {"observedGeneration": 7, "selector": "name=foo"} == podset["status"]

    # upstream: TestIsPodAvailable, via calculateStatus (ready for minReadySeconds, "<=" now)
    @pytest.mark.parametrize(
        ("ready_for", "want_available"),
        [
            pytest.param(3601, 1, id="ready-longer"),
            pytest.param(3600, 1, id="ready-exactly-min-ready-seconds"),
            pytest.param(3599, 0, id="ready-shorter"),
        ],
    )
    def test_available_after_min_ready_seconds(self, ready_for: int, want_available: int) -> None:
        since = podutil.format_time(NOW - dt.timedelta(seconds=ready_for))
        got = status.calculate_status(
            LONG_MIN_READY, [_new_pod("p", LONG_MIN_READY, "Running", since)], None, NOW
        )
        assert want_available == got["availableReplicas"]


class TestCalculateStatusConditions:
    RS = _podset(2, LABEL_MAP)
    FAILURE_RS = _podset(10, LABEL_MAP, conditions=[{"type": "ReplicaFailure", "status": "True"}])

    # upstream: TestCalculateStatusConditions
    @pytest.mark.parametrize(
        ("podset", "pod_count", "manage_error", "want"),
        [
            pytest.param(
                RS,
                1,
                "fake manageReplicasErr",
                [
                    {
                        "type": "ReplicaFailure",
                        "status": "True",
                        "lastTransitionTime": NOW_TEXT,
                        "reason": "FailedCreate",
                        "message": "fake manageReplicasErr",
                    }
                ],
                id="manageReplicasErr != nil && failureCond == nil, diff < 0",
            ),
            pytest.param(
                RS,
                3,
                "fake manageReplicasErr",
                [
                    {
                        "type": "ReplicaFailure",
                        "status": "True",
                        "lastTransitionTime": NOW_TEXT,
                        "reason": "FailedDelete",
                        "message": "fake manageReplicasErr",
                    }
                ],
                id="manageReplicasErr != nil && failureCond == nil, diff > 0",
            ),
            pytest.param(
                FAILURE_RS, 1, None, None, id="manageReplicasErr == nil && failureCond != nil"
            ),
            pytest.param(
                FAILURE_RS,
                1,
                "fake manageReplicasErr",
                [{"type": "ReplicaFailure", "status": "True"}],
                id="manageReplicasErr != nil && failureCond != nil",
            ),
            pytest.param(RS, 1, None, None, id="manageReplicasErr == nil && failureCond == nil"),
        ],
    )
    def test_conditions(
        self,
        podset: dict[str, Any],
        pod_count: int,
        manage_error: str | None,
        want: list[dict[str, Any]] | None,
    ) -> None:
        pods = [_new_pod(f"pod{i}", podset, "Running") for i in range(pod_count)]
        error = RuntimeError(manage_error) if manage_error is not None else None
        got = status.calculate_status(podset, pods, error, NOW)
        assert want == got.get("conditions")


CONDITION_IMAGE_PULL_BACK_OFF = {
    "type": "ImagePullBackOff",
    "status": "True",
    "reason": "NonExistentImage",
}
CONDITION_REPLICA_FAILURE = {"type": "ReplicaFailure", "status": "True", "reason": "OtherFailure"}
CONDITION_REPLICA_FAILURE_2 = {
    "type": "ReplicaFailure",
    "status": "True",
    "reason": "AnotherFailure",
}


class TestConditionHelpers:
    # upstream: TestGetCondition
    @pytest.mark.parametrize(
        ("condition_type", "exists"),
        [
            pytest.param("ReplicaFailure", True, id="condition exists"),
            pytest.param("ImagePullBackOff", False, id="condition does not exist"),
        ],
    )
    def test_get_condition(self, condition_type: str, exists: bool) -> None:
        example = {"conditions": [CONDITION_REPLICA_FAILURE]}
        assert exists == (status.get_condition(example, condition_type) is not None)

    # upstream: TestSetCondition
    @pytest.mark.parametrize(
        ("before", "condition", "want"),
        [
            pytest.param(
                {},
                CONDITION_REPLICA_FAILURE,
                {"conditions": [CONDITION_REPLICA_FAILURE]},
                id="set for the first time",
            ),
            pytest.param(
                {"conditions": [CONDITION_IMAGE_PULL_BACK_OFF]},
                CONDITION_REPLICA_FAILURE,
                {"conditions": [CONDITION_IMAGE_PULL_BACK_OFF, CONDITION_REPLICA_FAILURE]},
                id="simple set",
            ),
            pytest.param(
                {"conditions": [CONDITION_REPLICA_FAILURE]},
                CONDITION_REPLICA_FAILURE_2,
                {"conditions": [CONDITION_REPLICA_FAILURE_2]},
                id="overwrite",
            ),
        ],
    )
    def test_set_condition(
        self, before: dict[str, Any], condition: dict[str, Any], want: dict[str, Any]
    ) -> None:
        got = {key: list(value) for key, value in before.items()}
        status.set_condition(got, condition)
        assert want == got

    # upstream: TestRemoveCondition
    @pytest.mark.parametrize(
        ("before", "condition_type", "want"),
        [
            pytest.param({}, "ReplicaFailure", {}, id="remove from empty status"),
            pytest.param(
                {"conditions": [CONDITION_REPLICA_FAILURE]},
                "ReplicaFailure",
                {},
                id="simple remove",
            ),
            pytest.param(
                {"conditions": [CONDITION_REPLICA_FAILURE]},
                "ImagePullBackOff",
                {"conditions": [CONDITION_REPLICA_FAILURE]},
                id="doesn't remove anything",
            ),
        ],
    )
    def test_remove_condition(
        self, before: dict[str, Any], condition_type: str, want: dict[str, Any]
    ) -> None:
        got = {key: list(value) for key, value in before.items()}
        status.remove_condition(got, condition_type)
        assert want == got

    # upstream: SetCondition keeps an existing condition with the same status and reason
    def test_set_condition_same_status_and_reason_keeps_old(self) -> None:
        old = {**CONDITION_REPLICA_FAILURE, "message": "old", "lastTransitionTime": "t0"}
        got: dict[str, Any] = {"conditions": [old]}
        status.set_condition(got, {**CONDITION_REPLICA_FAILURE, "message": "new"})
        assert {"conditions": [old]} == got


def _written(generation: int = 1, observed: int = 1, **counts: Any) -> dict[str, Any]:
    current = {**_counts(2, 2, 2, 2), "observedGeneration": observed, **counts}
    return {"metadata": {"generation": generation}, "status": current}


class TestStatusNeedsUpdate:
    # derived from updateReplicaSetStatus' steady-state check
    @pytest.mark.parametrize(
        ("podset", "new_status", "want"),
        [
            pytest.param(_written(), _counts(2, 2, 2, 2), False, id="steady-state"),
            pytest.param(
                _written(generation=2), _counts(2, 2, 2, 2), True, id="generation-not-observed"
            ),
            pytest.param(_written(), _counts(3, 2, 2, 2), True, id="replicas-changed"),
            pytest.param(_written(), _counts(2, 1, 2, 2), True, id="fully-labeled-changed"),
            pytest.param(_written(), _counts(2, 2, 1, 2), True, id="ready-changed"),
            pytest.param(_written(), _counts(2, 2, 2, 1), True, id="available-changed"),
            pytest.param(
                _written(), _counts(2, 2, 2, 2, terminating=1), True, id="terminating-changed"
            ),
            pytest.param(
                {"metadata": {"generation": 1}, "status": {"observedGeneration": 1}},
                _counts(0, 0, 0, 0),
                True,
                id="terminating-nil-vs-zero",
            ),
            pytest.param(
                _written(conditions=[]),
                _counts(2, 2, 2, 2),
                False,
                id="empty-vs-missing-conditions",
            ),
            pytest.param(
                _written(conditions=[CONDITION_REPLICA_FAILURE]),
                _counts(2, 2, 2, 2),
                True,
                id="condition-removed",
            ),
        ],
    )
    def test_status_needs_update(
        self, podset: dict[str, Any], new_status: dict[str, Any], want: bool
    ) -> None:
        assert want == status.status_needs_update(podset, new_status)

    # upstream: updateReplicaSetStatus sets ObservedGeneration = rs.Generation when writing
    def test_with_observed_generation(self) -> None:
        podset = _written(generation=5, observed=4)
        got = status.with_observed_generation(podset, _counts(2, 2, 2, 2))
        assert 5 == got["observedGeneration"]
        assert not status.status_needs_update({**podset, "status": got}, got)


class TestPodPredicates:
    # upstream: TestIsPodAvailable (pod ready `before` seconds ago)
    @pytest.mark.parametrize(
        ("ready", "before", "min_ready_seconds", "want"),
        [
            pytest.param(False, 0, 0, False, id="not-ready"),
            pytest.param(True, 0, 1, False, id="ready-now-min-ready-1"),
            pytest.param(True, 0, 0, True, id="ready-now-min-ready-0"),
            pytest.param(True, 51, 50, True, id="ready-51s-min-ready-50"),
            pytest.param(True, 50, 50, True, id="ready-50s-min-ready-50"),
        ],
    )
    def test_is_pod_available(
        self, ready: bool, before: int, min_ready_seconds: int, want: bool
    ) -> None:
        since = podutil.format_time(NOW - dt.timedelta(seconds=before))
        pod = {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if ready else "False",
                        "lastTransitionTime": since,
                    }
                ]
            }
        }
        assert want == status.is_pod_available(pod, min_ready_seconds, NOW)

    # upstream: TestActivePodFiltering
    def test_filter_active_pods(self) -> None:
        phases = {"pod-1": "Succeeded", "pod-2": "Failed", "pod-3": "", "pod-4": "", "pod-5": ""}
        pods = [{"metadata": {"name": n}, "status": {"phase": p}} for n, p in phases.items()]
        got = [p["metadata"]["name"] for p in status.filter_active_pods(pods)]
        assert ["pod-3", "pod-4", "pod-5"] == got

    # upstream: TestCountTerminatingPods
    def test_filter_terminating_pods(self) -> None:
        podset = _podset(0, LABEL_MAP)
        pods = [_new_pod(f"pod{i}", podset, "Running") for i in range(7)]
        pods[0]["status"]["phase"] = "Succeeded"
        pods[1]["status"]["phase"] = "Failed"
        pods[2]["status"]["phase"] = "Pending"
        _terminating(pods[2])
        _terminating(pods[3])
        assert 2 == len(status.filter_terminating_pods(pods))
        assert not status.is_pod_active(pods[3])

    def test_malformed_status_is_a_clear_error(self) -> None:
        with pytest.raises(podutil.InvalidObjectError, match=r"spec.replicas"):
            status.calculate_status({"spec": {"replicas": "three"}}, [], RuntimeError("x"), NOW)
        bad = _podset(1, LABEL_MAP)
        bad_pod = _new_pod("p", bad, "Running", "not a time")
        with pytest.raises(podutil.InvalidObjectError, match=r"lastTransitionTime"):
            status.calculate_status(
                _podset(1, LABEL_MAP, min_ready_seconds=5), [bad_pod], None, NOW
            )


class TestNextAvailableCheck:
    # derived from IsPodAvailable and the minReadySeconds requeue (AddAfter) of replica_set.go
    @pytest.mark.parametrize(
        ("ready_since", "min_ready_seconds", "want"),
        [
            pytest.param([10], 30, 20.0, id="one-waiting"),
            pytest.param([10, 25], 30, 5.0, id="earliest-wins"),
            pytest.param([30, 40], 30, None, id="all-available"),
            pytest.param([10], 0, None, id="no-min-ready-seconds"),
            pytest.param([None], 30, None, id="no-ready-time-never-available"),
            pytest.param([], 30, None, id="no-pods"),
        ],
    )
    def test_next_available_check(
        self, ready_since: list[int | None], min_ready_seconds: int, want: float | None
    ) -> None:
        podset = _podset(1, FULL_LABEL_MAP, min_ready_seconds=min_ready_seconds)
        pods = [
            _new_pod(
                f"p{i}",
                podset,
                "Running",
                None if ago is None else podutil.format_time(NOW - dt.timedelta(seconds=ago)),
            )
            for i, ago in enumerate(ready_since)
        ]
        pods.append(_new_pod("not-ready", podset, "Pending"))
        assert want == status.next_available_check(pods, min_ready_seconds, NOW)
