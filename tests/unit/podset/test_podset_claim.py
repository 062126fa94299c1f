"""Claiming pods: keep, adopt, release, skip; the adoption recheck; the patch bodies.

Ported from kubernetes ``pkg/controller/controller_ref_manager_test.go`` (TestClaimPods,
TestGeneratePatchBytesForDelete) and the adoption checks of ``replica_set_test.go``
(TestDoNotAdoptOrCreateIfBeingDeleted, TestDoNotAdoptOrCreateIfBeingDeletedRace,
TestDoNotPatchPodWithOtherControlRef); each case names its upstream test. Upstream counts the
patches a fake pod control receives; here the plan lists the adoptions and releases, which are
exactly the patches the controller sends, and every adoption is taken to succeed, as with
upstream's ``FakePodControl``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

import builders
from tally.podset import claim, podutil

pytestmark = pytest.mark.unit

PRODUCTION = {"type": "production"}
TESTING = {"type": "testing"}
CONTROLLER_UID = "123"


def production_selector(labels: Mapping[str, str]) -> bool:
    """``labels.Set{"type": "production"}.AsSelector()``."""
    return labels.get("type") == "production"


def _owner(
    uid: str = CONTROLLER_UID, namespace: str = "default", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "foobar", "namespace": namespace, "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-02T03:04:05Z"
    return {"apiVersion": "tally.dev/v1alpha1", "kind": "PodSet", "metadata": meta}


def _new_pod(
    name: str, labels: Mapping[str, str], owner: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Upstream's ``newPod``: an owner, if given, is the pod's controller (NewControllerRef)."""
    return builders.pod(
        name,
        namespace="default",
        uid="uid-{name}",
        labels=labels,
        owner_references=None if owner is None else [claim.owner_reference_for(owner)],
        containers=[builders.container(None, image="foo/bar")],
    )


def _deleting(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["deletionTimestamp"] = "2024-01-02T03:04:05Z"
    return pod


def _in_namespace(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    pod["metadata"]["namespace"] = namespace
    return pod


OWNER = _owner()
OWNER_DELETING = _owner(deleting=True)
OTHER_OWNER = _owner(uid="AAAAA")


class TestClaimPods:
    # upstream: TestClaimPods
    @pytest.mark.parametrize(
        ("owner", "pods", "want_claimed", "want_patches", "finalizers"),
        [
            # Upstream's controller here has an empty UID (a Go zero value); a PodSet always has
            # one, and owner_reference_for refuses an empty one, so this one has "456".
            pytest.param(
                _owner(uid="456"),
                [_new_pod("pod1", PRODUCTION), _new_pod("pod2", TESTING)],
                ["pod1"],
                1,
                (),
                id="Claim pods with correct label",
            ),
            pytest.param(
                OWNER_DELETING,
                [_new_pod("pod1", PRODUCTION), _new_pod("pod2", PRODUCTION)],
                [],
                0,
                (),
                id="Controller marked for deletion can not claim pods",
            ),
            pytest.param(
                OWNER_DELETING,
                [_new_pod("pod1", PRODUCTION, OWNER_DELETING), _new_pod("pod2", PRODUCTION)],
                ["pod1"],
                0,
                (),
                id="Controller marked for deletion can not claim new pods",
            ),
            pytest.param(
                OWNER,
                [_new_pod("pod1", PRODUCTION, OWNER), _new_pod("pod2", PRODUCTION, OTHER_OWNER)],
                ["pod1"],
                0,
                (),
                id="Controller can not claim pods owned by another controller",
            ),
            pytest.param(
                OWNER,
                [_new_pod("pod1", PRODUCTION, OWNER), _new_pod("pod2", TESTING, OWNER)],
                ["pod1"],
                1,
                (),
                id="Controller releases claimed pods when selector doesn't match",
            ),
            pytest.param(
                OWNER,
                [
                    _deleting(_new_pod("pod1", PRODUCTION, OWNER)),
                    _deleting(_new_pod("pod2", PRODUCTION)),
                ],
                ["pod1"],
                0,
                (),
                id="Controller does not claim orphaned pods marked for deletion",
            ),
            pytest.param(
                OWNER,
                [
                    _new_pod("pod1", PRODUCTION, OWNER),
                    _new_pod("pod2", TESTING, OWNER),
                    _new_pod("pod3", PRODUCTION),
                ],
                ["pod1", "pod3"],
                2,
                ("foo-finalizer", "bar-finalizer"),
                id="Controller claims or release pods according to selector with finalizers",
            ),
            pytest.param(
                OWNER,
                [
                    _new_pod("pod1", PRODUCTION),
                    _in_namespace(_new_pod("pod2", PRODUCTION), "fakens"),
                ],
                ["pod1"],
                1,
                (),
                id="Controller does not claim pods of different namespace",
            ),
            pytest.param(
                _owner(namespace=""),
                [
                    _new_pod("pod1", PRODUCTION),
                    _in_namespace(_new_pod("pod2", PRODUCTION), "fakens"),
                ],
                ["pod1", "pod2"],
                2,
                (),
                id="Cluster scoped controller claims pods of specified namespace",
            ),
        ],
    )
    def test_claim_pods(
        self,
        owner: dict[str, Any],
        pods: list[dict[str, Any]],
        want_claimed: list[str],
        want_patches: int,
        finalizers: tuple[str, ...],
    ) -> None:
        plan = claim.claim_pods(owner, production_selector, pods)
        patches = [claim.adopt_patch(owner, pod, finalizers) for pod in plan.adopt] + [
            claim.release_patch(pod, [owner["metadata"]["uid"]], finalizers) for pod in plan.release
        ]
        adopted = [podutil.pod_key(pod) for pod in plan.adopt]  # FakePodControl: all succeed
        assert want_claimed == [pod["metadata"]["name"] for pod in plan.claimed(adopted)]
        assert want_patches == len(patches), "ClaimPods issues the wrong number of patches"
        for patch in patches:
            text = claim.patch_bytes(patch).decode()
            assert owner["metadata"]["uid"] in text, "patch doesn't contain the controller UID"
            for finalizer in finalizers:
                assert finalizer in text, f"patch doesn't contain finalizer {finalizer}"

    # upstream: TestDoNotPatchPodWithOtherControlRef and ClaimObject's branches, one by one
    @pytest.mark.parametrize(
        ("owner", "pod", "want"),
        [
            pytest.param(
                OWNER, _new_pod("p", PRODUCTION, OTHER_OWNER), "SKIP", id="other-controller"
            ),
            pytest.param(OWNER, _new_pod("p", TESTING, OTHER_OWNER), "SKIP", id="other-no-match"),
            pytest.param(OWNER, _new_pod("p", PRODUCTION, OWNER), "KEEP", id="ours-matching"),
            pytest.param(
                OWNER_DELETING, _new_pod("p", PRODUCTION, OWNER), "KEEP", id="ours-deleting"
            ),
            pytest.param(OWNER, _new_pod("p", TESTING, OWNER), "RELEASE", id="ours-not-matching"),
            pytest.param(
                OWNER_DELETING,
                _new_pod("p", TESTING, OWNER),
                "IGNORE",
                id="no-release-while-deleting",
            ),
            pytest.param(OWNER, _new_pod("p", PRODUCTION), "ADOPT", id="orphan-matching"),
            pytest.param(OWNER, _new_pod("p", TESTING), "IGNORE", id="orphan-not-matching"),
            pytest.param(
                OWNER_DELETING, _new_pod("p", PRODUCTION), "IGNORE", id="no-adopt-while-deleting"
            ),
            pytest.param(
                OWNER, _deleting(_new_pod("p", PRODUCTION)), "IGNORE", id="orphan-deleting"
            ),
        ],
    )
    def test_classify_pod(self, owner: dict[str, Any], pod: dict[str, Any], want: str) -> None:
        assert claim.ClaimAction[want] is claim.classify_pod(owner, production_selector, pod)

    # upstream: ClaimObject only looks at the *controller* reference; other owners are fine
    def test_non_controller_owner_reference_is_an_orphan(self) -> None:
        pod = _new_pod("p", PRODUCTION)
        pod["metadata"]["ownerReferences"] = [{**claim.owner_reference_for(OTHER_OWNER)}]
        pod["metadata"]["ownerReferences"][0]["controller"] = False
        assert claim.controller_ref(pod) is None
        assert claim.ClaimAction.ADOPT is claim.classify_pod(OWNER, production_selector, pod)

    # upstream: the claimed list keeps input order, and a failed adoption is not claimed
    def test_claimed_keeps_order_and_drops_failed_adoptions(self) -> None:
        pods = [
            _new_pod("a", PRODUCTION),
            _new_pod("b", PRODUCTION, OWNER),
            _new_pod("c", PRODUCTION),
        ]
        plan = claim.claim_pods(OWNER, production_selector, pods)
        assert ["a", "c"] == [pod["metadata"]["name"] for pod in plan.adopt]
        assert ["b"] == [pod["metadata"]["name"] for pod in plan.claimed()]
        assert ["b", "c"] == [pod["metadata"]["name"] for pod in plan.claimed(["default/c"])]

    # upstream: FilterClaimedPods (the terminating pods that status counts)
    def test_filter_claimed_pods(self) -> None:
        pods = [
            _new_pod("ours", PRODUCTION, OWNER),
            _new_pod("ours-relabelled", TESTING, OWNER),
            _new_pod("theirs", PRODUCTION, OTHER_OWNER),
            _new_pod("orphan", PRODUCTION),
        ]
        got = claim.filter_claimed_pods(CONTROLLER_UID, production_selector, pods)
        assert ["ours"] == [pod["metadata"]["name"] for pod in got]


class TestCanAdopt:
    # upstream: RecheckDeletionTimestamp with claimPods' canAdoptFunc
    def test_fresh_owner_allows_adoption(self) -> None:
        assert claim.can_adopt(OWNER, CONTROLLER_UID) is None

    # upstream: TestDoNotAdoptOrCreateIfBeingDeletedRace (the cache says alive, the API deleted)
    def test_deleted_owner_fails_adoption(self) -> None:
        err = claim.can_adopt(OWNER_DELETING, CONTROLLER_UID)
        assert err is not None
        assert "default/foobar has just been deleted at 2024-01-02 03:04:05 +0000 UTC" == str(err)

    # upstream: claimPods' canAdoptFunc ("original %v %v/%v is gone: got uid %v, wanted %v")
    def test_recreated_owner_fails_adoption(self) -> None:
        err = claim.can_adopt(_owner(uid="new"), "old")
        assert err is not None
        assert (
            "can't recheck DeletionTimestamp: original PodSet default/foobar is gone: "
            "got uid new, wanted old"
        ) == str(err)

    # upstream: AdoptPod wraps the canAdopt error for every adoption of the sync
    def test_adopt_error_message(self) -> None:
        err = claim.adopt_error(_new_pod("pod1", PRODUCTION), claim.AdoptionError("boom"))
        assert "can't adopt Pod default/pod1 (uid-pod1): boom" == str(err)

    # upstream: RecheckDeletionTimestamp when the GET itself fails
    def test_recheck_failed_message(self) -> None:
        err = claim.recheck_failed(LookupError('podsets.tally.dev "foobar" not found'))
        assert 'can\'t recheck DeletionTimestamp: podsets.tally.dev "foobar" not found' == str(err)


class TestPatches:
    # upstream: TestGeneratePatchBytesForDelete
    @pytest.mark.parametrize(
        ("owner_uids", "dependent_uid", "finalizers", "want"),
        [
            pytest.param(
                ["ss1"],
                "ss2",
                [],
                b'{"metadata":{"uid":"ss2","ownerReferences":[{"$patch":"delete","uid":"ss1"}]}}',
                id="check the structure of patch bytes",
            ),
            pytest.param(
                ['ss1"hello'],
                "ss2",
                [],
                b'{"metadata":{"uid":"ss2","ownerReferences":'
                b'[{"$patch":"delete","uid":"ss1\\"hello"}]}}',
                id="check if parent uid is escaped",
            ),
            pytest.param(
                ["ss1"],
                'ss2"hello',
                [],
                b'{"metadata":{"uid":"ss2\\"hello","ownerReferences":'
                b'[{"$patch":"delete","uid":"ss1"}]}}',
                id="check if revision uid uid is escaped",
            ),
            pytest.param(
                ["ss1", "ss2"],
                "ss2",
                [],
                b'{"metadata":{"uid":"ss2","ownerReferences":'
                b'[{"$patch":"delete","uid":"ss1"},{"$patch":"delete","uid":"ss2"}]}}',
                id="check the structure of patch bytes with multiple owners",
            ),
            pytest.param(
                ["ss1", "ss2"],
                "ss2",
                ["f1"],
                b'{"metadata":{"uid":"ss2","ownerReferences":'
                b'[{"$patch":"delete","uid":"ss1"},{"$patch":"delete","uid":"ss2"}],'
                b'"$deleteFromPrimitiveList/finalizers":["f1"]}}',
                id="check the structure of patch bytes with a finalizer and multiple owners",
            ),
        ],
    )
    def test_release_patch_bytes(
        self, owner_uids: list[str], dependent_uid: str, finalizers: list[str], want: bytes
    ) -> None:
        pod = {"metadata": {"uid": dependent_uid}}
        assert want == claim.patch_bytes(claim.release_patch(pod, owner_uids, finalizers))

    # upstream: AdoptPod's patch (the format string of older releases, the struct today)
    def test_adopt_patch_bytes(self) -> None:
        want = (
            b'{"metadata":{"ownerReferences":[{"apiVersion":"tally.dev/v1alpha1","kind":"PodSet",'
            b'"name":"foobar","uid":"123","controller":true,"blockOwnerDeletion":true}],'
            b'"uid":"uid-pod1"}}'
        )
        assert want == claim.patch_bytes(claim.adopt_patch(OWNER, _new_pod("pod1", PRODUCTION)))

    def test_adopt_patch_with_finalizers(self) -> None:
        body = claim.adopt_patch(OWNER, _new_pod("pod1", PRODUCTION), ["f1"])
        assert ["f1"] == json.loads(claim.patch_bytes(body))["metadata"]["finalizers"]

    # upstream: NewControllerRef
    def test_owner_reference_for(self) -> None:
        assert {
            "apiVersion": "tally.dev/v1alpha1",
            "kind": "PodSet",
            "name": "foobar",
            "uid": "123",
            "controller": True,
            "blockOwnerDeletion": True,
        } == claim.owner_reference_for({"metadata": {"name": "foobar", "uid": "123"}})
        with pytest.raises(podutil.InvalidObjectError, match=r"metadata.uid"):
            claim.owner_reference_for({"metadata": {"name": "foobar"}})
