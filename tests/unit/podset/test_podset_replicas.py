"""Sizing creates and deletes: ``slow_start_batch``, the burst cap, the pod built from a template.

Ported from kubernetes ``pkg/controller/replicaset/replica_set_test.go`` (TestSlowStartBatch,
TestControllerBurstReplicas' sizing) and ``pkg/controller/controller_utils_test.go``
(TestCreatePods, TestCreatePodsWithGenerateName); each case names its upstream test. Cases
marked "derived" work out upstream's loop by hand (batch sizes, error order). Not covered: the
create and delete calls themselves and their events (the controller's tests).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from tally.podset import replicas

pytestmark = pytest.mark.unit


class FakeErr(Exception):
    pass


class CallCounter:
    """Upstream TestSlowStartBatch's ``fn``: calls beyond ``call_limit`` fail."""

    def __init__(self, call_limit: int) -> None:
        self.call_limit = call_limit
        self.call_count = 0
        self.in_flight = 0
        self.in_flight_at_start: list[int] = []
        self.error = FakeErr("fake error")

    async def __call__(self) -> None:
        self.call_count += 1
        number = self.call_count
        self.in_flight += 1
        self.in_flight_at_start.append(self.in_flight)
        await asyncio.sleep(0)  # let the rest of the batch start: the calls overlap
        self.in_flight -= 1
        if number > self.call_limit:
            raise self.error


class TestSlowStartBatch:
    # upstream: TestSlowStartBatch
    @pytest.mark.parametrize(
        ("count", "call_limit", "want_successes", "want_error", "want_calls"),
        [
            # 1 (first batch): the function is called at least once
            pytest.param(10, 0, 0, True, 1, id="callLimit = 0 (all fail)"),
            # 1 (first batch) + 2 (2nd batch) + 4 (3rd batch) + 3 (4th batch) = 10
            pytest.param(10, 10, 10, False, 10, id="callLimit = count (all succeed)"),
            # 1 (first batch) + 2 (2nd batch) + 4 (3rd batch) = 7
            pytest.param(10, 5, 5, True, 7, id="callLimit < count (some succeed)"),
            # derived: an error at item 4 fails all of the 3rd batch (items 4-7) and stops there
            pytest.param(10, 3, 3, True, 7, id="error at item 4"),
            # derived: nothing to do calls nothing
            pytest.param(0, 0, 0, False, 0, id="count = 0"),
        ],
    )
    async def test_slow_start_batch(
        self, count: int, call_limit: int, want_successes: int, want_error: bool, want_calls: int
    ) -> None:
        fn = CallCounter(call_limit)
        successes, err = await replicas.slow_start_batch(count, 1, fn)
        assert want_successes == successes, "unexpected processed batch size"
        assert (fn.error if want_error else None) is err
        # slow_start_batch stops trying more calls after a batch fails
        assert want_calls == fn.call_count

    # derived from upstream's comment "1 + 2 + 4 + 3 = 10": each batch runs concurrently
    async def test_batches_double_and_overlap(self) -> None:
        fn = CallCounter(call_limit=10)
        await replicas.slow_start_batch(10, 1, fn)
        assert [1, 1, 2, 1, 2, 3, 4, 1, 2, 3] == fn.in_flight_at_start

    # derived: SlowStartInitialBatchSize's doc ("for a value of 10, batch sizes would be 10, 20")
    async def test_initial_batch_size(self) -> None:
        fn = CallCounter(call_limit=100)
        successes, err = await replicas.slow_start_batch(25, 10, fn)
        assert (25, None) == (successes, err)
        assert 10 == max(fn.in_flight_at_start[:10])
        assert 15 == max(fn.in_flight_at_start[10:])

    # derived: upstream returns the first error sent to its channel, i.e. the first to finish
    async def test_first_error_is_the_first_to_fail(self) -> None:
        slow, fast = FakeErr("slow"), FakeErr("fast")
        calls = 0

        async def fn() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                return
            if calls == 2:
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                raise slow
            raise fast

        successes, err = await replicas.slow_start_batch(3, 1, fn)
        assert (1, fast) == (successes, err)

    async def test_cancellation_propagates(self) -> None:
        async def fn() -> None:
            raise asyncio.CancelledError

        with pytest.raises(asyncio.CancelledError):
            await replicas.slow_start_batch(3, 1, fn)


class TestManageReplicasDiff:
    # upstream: manageReplicas' sizing; TestControllerBurstReplicas (burst cap both ways)
    @pytest.mark.parametrize(
        ("active", "desired", "burst", "want"),
        [
            pytest.param(0, 5, replicas.BURST_REPLICAS, -5, id="too-few"),
            pytest.param(5, 2, replicas.BURST_REPLICAS, 3, id="too-many"),
            pytest.param(3, 3, replicas.BURST_REPLICAS, 0, id="just-right"),
            pytest.param(0, 1000, replicas.BURST_REPLICAS, -500, id="create-capped-at-burst"),
            pytest.param(1000, 0, replicas.BURST_REPLICAS, 500, id="delete-capped-at-burst"),
            pytest.param(0, 12, 5, -5, id="small-burst"),
        ],
    )
    def test_diff(self, active: int, desired: int, burst: int, want: int) -> None:
        assert want == replicas.manage_replicas_diff(active, desired, burst)


def _podset(**template_meta: Any) -> dict[str, Any]:
    """Upstream's ``newReplicationController`` template, as a PodSet."""
    return {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "PodSet",
        "metadata": {"name": "foobar", "namespace": "default", "uid": "uid-foobar"},
        "spec": {
            "replicas": 1,
            "template": {
                "metadata": {"labels": {"name": "foo", "type": "production"}, **template_meta},
                "spec": {
                    "containers": [{"image": "foo/bar", "imagePullPolicy": "IfNotPresent"}],
                    "restartPolicy": "Always",
                    "dnsPolicy": "Default",
                    "nodeSelector": {"baz": "blah"},
                },
            },
        },
    }


OWNER_REF = {
    "apiVersion": "tally.dev/v1alpha1",
    "kind": "PodSet",
    "name": "foobar",
    "uid": "uid-foobar",
    "controller": True,
    "blockOwnerDeletion": True,
}


class TestPodFromTemplate:
    # upstream: TestCreatePods (labels and spec from the template, generateName "<name>-")
    def test_create_pods(self) -> None:
        podset = _podset()
        pod = replicas.pod_from_template(podset)
        assert "foobar-" == pod["metadata"]["generateName"]
        assert {"name": "foo", "type": "production"} == pod["metadata"]["labels"]
        assert podset["spec"]["template"]["spec"] == pod["spec"]
        assert [OWNER_REF] == pod["metadata"]["ownerReferences"]
        assert "default" == pod["metadata"]["namespace"]
        assert "name" not in pod["metadata"]

    # upstream: TestCreatePodsWithGenerateName
    def test_create_pods_with_generate_name(self) -> None:
        pod = replicas.pod_from_template(_podset(), "hello-")
        assert "hello-" == pod["metadata"]["generateName"]
        assert [OWNER_REF] == pod["metadata"]["ownerReferences"]

    # upstream: GetPodFromTemplate copies annotations and finalizers, nothing else of metadata
    def test_annotations_and_finalizers_are_copied(self) -> None:
        podset = _podset(annotations={"a": "b"}, finalizers=["f1"], name="ignored")
        pod = replicas.pod_from_template(podset)
        assert {"a": "b"} == pod["metadata"]["annotations"]
        assert ["f1"] == pod["metadata"]["finalizers"]
        assert "name" not in pod["metadata"]
        pod["spec"]["containers"][0]["image"] = "changed"
        pod["metadata"]["annotations"]["a"] = "changed"
        assert "foo/bar" == podset["spec"]["template"]["spec"]["containers"][0]["image"]
        assert {"a": "b"} == podset["spec"]["template"]["metadata"]["annotations"]

    # upstream: createPods ("unable to create pods, no labels")
    def test_no_labels_is_refused(self) -> None:
        podset = copy.deepcopy(_podset())
        podset["spec"]["template"]["metadata"]["labels"] = {}
        with pytest.raises(ValueError, match=r"^unable to create pods, no labels$"):
            replicas.pod_from_template(podset)

    # upstream: getPodsPrefix (drop the dash when "<name>-" is not a valid name prefix)
    @pytest.mark.parametrize(
        ("name", "want"),
        [
            pytest.param("foobar", "foobar-", id="dash"),
            pytest.param("a" * 252, "a" * 252 + "-", id="252-chars"),
            pytest.param("a" * 253, "a" * 253, id="253-chars-no-room-for-dash"),
        ],
    )
    def test_pods_prefix(self, name: str, want: str) -> None:
        assert want == replicas.pods_prefix(name)
