"""Which pods a PodSet owns: the decisions of upstream's controller-ref manager, without the I/O.

Upstream ``pkg/controller/controller_ref_manager.go`` (``ClaimObject``, ``ClaimPods``,
``AdoptPod``, ``ReleasePod``, ``RecheckDeletionTimestamp``) decides and patches in one loop. This
module owns the decisions and the patch bodies; the controller sends the patches and reads the
owner afresh. For each pod (upstream's ``ClaimObject``, in this order):

1. Its controller reference names another owner: **skip** it, whatever its labels.
2. Its controller reference names us (by UID) and the selector matches: **keep** it, even while
   we are being deleted (keeping takes no action).
3. It names us but the selector no longer matches: **release** it, unless we are being deleted
   (then ignore it).
4. It is an orphan: **adopt** it only if we are not being deleted, the selector matches, the pod
   itself is not being deleted, and it is in our namespace (a cluster-scoped owner, with no
   namespace, may adopt anywhere). Otherwise ignore it.

The claimed pods are the kept ones plus those whose adoption patch succeeds, in input order
(:meth:`ClaimPlan.claimed`). Before the first adoption of a sync the controller must re-read the
PodSet *uncached* (a quorum GET; upstream issue #42639) and pass it to :func:`can_adopt`: a
different UID (deleted and re-created under the same name) or a ``deletionTimestamp`` fails every
adoption of that sync with :func:`adopt_error`. Releases need no such check.

Patches (``Content-Type: application/strategic-merge-patch+json``, :data:`PATCH_CONTENT_TYPE`).
Upstream sends strategic-merge patches to pods, which the API server accepts because pods are a
built-in type with ``patchMergeKey: uid`` on ``ownerReferences``; it would reject a strategic
merge patch for a custom resource, which is why these are only ever sent to pods. There is no
``$setElementOrder`` in them: adoption merges one owner reference into the list by UID, and
release deletes one with a ``$patch: delete`` directive. Both also set ``metadata.uid`` to the
pod's own UID: that field is immutable, so if the pod was deleted and re-created under the same
name the patch fails validation (422) instead of touching the wrong pod. Upstream ignores 404 and
422 on release, and 404 on adoption.

Left out: the ``filters`` argument of ``ClaimPods`` and the claiming of ReplicaSets and
ControllerRevisions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tally.podset import podutil
from tally.podset.podutil import Obj

PODSET_API_VERSION = "tally.dev/v1alpha1"
"""``apiVersion`` of the PodSet custom resource, used when an object does not carry its own."""
PODSET_KIND = "PodSet"
"""``kind`` of the PodSet custom resource, used when an object does not carry its own."""
PATCH_CONTENT_TYPE = "application/strategic-merge-patch+json"
"""Content type of :func:`adopt_patch` and :func:`release_patch` (pods only, see above)."""

LabelMatcher = Callable[[Mapping[str, str]], bool]
"""The PodSet's label selector as a predicate over a pod's labels (built by
``tally.machinery.selectors``)."""


class ClaimAction(enum.Enum):
    """What to do with one pod."""

    KEEP = "keep"
    """Ours and matching: claimed, no action."""
    ADOPT = "adopt"
    """Matching orphan: claimed once :func:`adopt_patch` succeeds."""
    RELEASE = "release"
    """Ours but no longer matching: send :func:`release_patch`; not claimed."""
    SKIP = "skip"
    """Controlled by another owner: not ours to touch."""
    IGNORE = "ignore"
    """Nothing to do: a non-matching or terminating orphan, one in another namespace, or any
    adoption or release while we are being deleted."""


def controller_ref(obj: Obj) -> Mapping[str, Any] | None:
    """The first owner reference with ``controller: true`` (upstream ``GetControllerOf``)."""
    for index, ref in enumerate(podutil.get_list(obj, "metadata", "ownerReferences")):
        if not isinstance(ref, Mapping):
            raise podutil.InvalidObjectError(
                f"{podutil.describe(obj)}: metadata.ownerReferences[{index}] must be an object"
            )
        if ref.get("controller") is True:
            return ref
    return None


def is_controlled_by(obj: Obj, owner_uid: str) -> bool:
    """``obj``'s controller reference points at ``owner_uid`` (upstream ``IsControlledBy``)."""
    ref = controller_ref(obj)
    return ref is not None and ref.get("uid") == owner_uid


def owner_reference_for(podset: Obj) -> dict[str, Any]:
    """The controller reference a PodSet puts on its pods (upstream ``NewControllerRef``).

    Keys in upstream's JSON order. ``apiVersion`` and ``kind`` come from the object when it
    carries them, else :data:`PODSET_API_VERSION` and :data:`PODSET_KIND`.
    """
    uid = podutil.get_str(podset, "metadata", "uid")
    name = podutil.get_str(podset, "metadata", "name")
    if not uid or not name:
        raise podutil.InvalidObjectError(
            f"{podutil.describe(podset)}: an owner needs metadata.name and metadata.uid"
        )
    return {
        "apiVersion": podutil.get_str(podset, "apiVersion") or PODSET_API_VERSION,
        "kind": podutil.get_str(podset, "kind") or PODSET_KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def classify_pod(owner: Obj, matches: LabelMatcher, pod: Obj) -> ClaimAction:
    """The :class:`ClaimAction` for one pod (upstream ``ClaimObject``; rules in the module doc)."""
    owner_uid = podutil.get_str(owner, "metadata", "uid")
    owner_deleting = podutil.is_being_deleted(owner)
    labels = podutil.get_string_map(pod, "metadata", "labels")
    ref = controller_ref(pod)
    if ref is not None:
        if ref.get("uid") != owner_uid:
            return ClaimAction.SKIP
        if matches(labels):
            # Claiming what we already own takes no action, so it is allowed while deleting.
            return ClaimAction.KEEP
        return ClaimAction.IGNORE if owner_deleting else ClaimAction.RELEASE
    # An orphan.
    if owner_deleting or not matches(labels):
        return ClaimAction.IGNORE
    if podutil.is_being_deleted(pod):
        return ClaimAction.IGNORE
    owner_namespace = podutil.get_str(owner, "metadata", "namespace")
    if owner_namespace and owner_namespace != podutil.get_str(pod, "metadata", "namespace"):
        return ClaimAction.IGNORE
    return ClaimAction.ADOPT


@dataclasses.dataclass(frozen=True)
class ClaimPlan:
    """The decision for every pod, in input order (what upstream's ``ClaimPods`` would do)."""

    decisions: tuple[tuple[Obj, ClaimAction], ...]
    """Each pod with its action."""

    def _with(self, action: ClaimAction) -> list[Obj]:
        return [pod for pod, decided in self.decisions if decided is action]

    @property
    def keep(self) -> list[Obj]:
        """Pods already ours."""
        return self._with(ClaimAction.KEEP)

    @property
    def adopt(self) -> list[Obj]:
        """Orphans to adopt (check :func:`can_adopt` first)."""
        return self._with(ClaimAction.ADOPT)

    @property
    def release(self) -> list[Obj]:
        """Pods to release."""
        return self._with(ClaimAction.RELEASE)

    @property
    def skip(self) -> list[Obj]:
        """Pods controlled by someone else."""
        return self._with(ClaimAction.SKIP)

    def claimed(self, adopted: Iterable[str] = ()) -> list[Obj]:
        """Kept pods plus the adopted ones, in input order.

        ``adopted`` holds the :func:`~tally.podset.podutil.pod_key` of every pod whose adoption
        patch succeeded; by default none did (nothing was tried yet).
        """
        done = set(adopted)
        return [
            pod
            for pod, action in self.decisions
            if action is ClaimAction.KEEP
            or (action is ClaimAction.ADOPT and podutil.pod_key(pod) in done)
        ]


def claim_pods(owner: Obj, matches: LabelMatcher, pods: Iterable[Obj]) -> ClaimPlan:
    """Classify every pod for ``owner`` (upstream ``ClaimPods``' loop, without the patches)."""
    return ClaimPlan(tuple((pod, classify_pod(owner, matches, pod)) for pod in pods))


def filter_claimed_pods(owner_uid: str, matches: LabelMatcher, pods: Iterable[Obj]) -> list[Obj]:
    """Pods controlled by ``owner_uid`` whose labels match (upstream ``FilterClaimedPods``).

    Used for the terminating pods counted in ``status.terminatingReplicas``, which are never
    adopted or released.
    """
    return [
        pod
        for pod in pods
        if is_controlled_by(pod, owner_uid)
        and matches(podutil.get_string_map(pod, "metadata", "labels"))
    ]


# --- adoption precondition -------------------------------------------------------------------


class AdoptionError(Exception):
    """Adoption is not allowed in this sync; the message is upstream's."""


def _go_time(value: object) -> str:
    """A timestamp the way Go's ``%v`` prints a ``*metav1.Time``."""
    nanos = podutil.parse_time(value, field="metadata.deletionTimestamp")
    if nanos is None:
        return "<nil>"
    seconds, fraction = divmod(nanos, 1_000_000_000)
    moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if fraction:
        text += "." + f"{fraction:09d}".rstrip("0")
    return text + " +0000 UTC"


def recheck_failed(error: BaseException) -> AdoptionError:
    """The error when the uncached GET of the owner itself failed (``RecheckDeletionTimestamp``)."""
    return AdoptionError(f"can't recheck DeletionTimestamp: {error}")


def can_adopt(
    fresh_owner: Obj, expected_uid: str, *, kind: str = PODSET_KIND
) -> AdoptionError | None:
    """Whether adoptions may go ahead, given the owner as just read *uncached*.

    ``None`` when the fresh object has ``expected_uid`` (the UID of the object this sync works
    on) and no ``deletionTimestamp``. Otherwise the error upstream's ``canAdoptFunc`` returns:

    * ``can't recheck DeletionTimestamp: original PodSet ns/name is gone: got uid X, wanted Y``
    * ``ns/name has just been deleted at 2024-01-02 03:04:05 +0000 UTC``
    """
    namespace = podutil.get_str(fresh_owner, "metadata", "namespace")
    name = podutil.get_str(fresh_owner, "metadata", "name")
    uid = podutil.get_str(fresh_owner, "metadata", "uid")
    if uid != expected_uid:
        return recheck_failed(
            Exception(
                f"original {kind} {namespace}/{name} is gone: got uid {uid}, wanted {expected_uid}"
            )
        )
    if podutil.is_being_deleted(fresh_owner):
        deleted_at = _go_time(podutil.get_map(fresh_owner, "metadata").get("deletionTimestamp"))
        return AdoptionError(f"{namespace}/{name} has just been deleted at {deleted_at}")
    return None


def adopt_error(pod: Obj, error: BaseException) -> AdoptionError:
    """What each adoption returns once :func:`can_adopt` failed (upstream ``AdoptPod``)."""
    meta = podutil.get_map(pod, "metadata")
    return AdoptionError(
        f"can't adopt Pod {meta.get('namespace') or ''}/{meta.get('name') or ''} "
        f"({meta.get('uid') or ''}): {error}"
    )


# --- patch bodies ----------------------------------------------------------------------------


def adopt_patch(podset: Obj, pod: Obj, finalizers: Sequence[str] = ()) -> dict[str, Any]:
    """Strategic-merge patch that makes ``podset`` the controller of ``pod``.

    Upstream ``ownerRefControllerPatch``::

        {"metadata": {"ownerReferences": [{"apiVersion": ..., "kind": ..., "name": ...,
                                           "uid": ..., "controller": true,
                                           "blockOwnerDeletion": true}],
                      "uid": "<pod uid>"}}

    plus ``"finalizers"`` when given (the ReplicaSet controller gives none). The API server
    rejects it if another owner reference already has ``controller: true``.
    """
    metadata: dict[str, Any] = {
        "ownerReferences": [owner_reference_for(podset)],
        "uid": podutil.get_str(pod, "metadata", "uid"),
    }
    if finalizers:
        metadata["finalizers"] = list(finalizers)
    return {"metadata": metadata}


def release_patch(
    pod: Obj, owner_uids: Sequence[str], finalizers: Sequence[str] = ()
) -> dict[str, Any]:
    """Strategic-merge patch that removes the owner references with ``owner_uids`` from ``pod``.

    Upstream ``GenerateDeleteOwnerRefStrategicMergeBytes``::

        {"metadata": {"uid": "<pod uid>",
                      "ownerReferences": [{"$patch": "delete", "uid": "<owner uid>"}]}}

    plus ``"$deleteFromPrimitiveList/finalizers"`` when finalizers are given.
    """
    metadata: dict[str, Any] = {
        "uid": podutil.get_str(pod, "metadata", "uid"),
        "ownerReferences": [{"$patch": "delete", "uid": uid} for uid in owner_uids] or None,
    }
    if finalizers:
        metadata["$deleteFromPrimitiveList/finalizers"] = list(finalizers)
    return {"metadata": metadata}


def patch_bytes(body: Mapping[str, Any]) -> bytes:
    """Compact JSON in the key order given, as Go's ``json.Marshal`` writes these structs."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
