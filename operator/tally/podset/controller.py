"""The PodSet controller: upstream's ReplicaSet controller, for ``podsets.tally.dev``.

Shape (sample-controller): event handlers work out PodSet keys (``namespace/name``)
and enqueue them; workers take keys off one rate-limited queue and run :meth:`sync_podset`,
which reads the caches, claims pods, manages replicas when the expectations are satisfied, and
writes status last (through the status subresource, with the resourceVersion read).

Why expectations (see :mod:`tally.podset.expectations`): the caches lag the API. Right after
creating 3 pods, a sync that counted pods from the cache would see too few and create 3 more.
So each sync that creates or deletes records how many events it expects, and the next syncs
only manage replicas once those events arrived (or 5 minutes passed).

Pure of Kopf and of the API client: everything that talks to the API server comes in through
the small protocols below (implemented over kubernetes-asyncio in :mod:`tally.podset.client`),
and time comes from a clock, so a test can drive a sync with plain data.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from tally.machinery.cache import Change, ChangeKind, RecentWrites, Store
from tally.machinery.errors import Conflict
from tally.machinery.selectors import LabelSelector, SelectorError, parse_label_selector
from tally.podset import claim as claims
from tally.podset import podutil, ranking, replicas, status
from tally.podset.expectations import UIDTrackingControllerExpectations
from tally.workqueue import (
    DEFAULT_STOP_TIMEOUT,
    MetricsProvider,
    RateLimitingQueue,
    WorkerPool,
    default_controller_rate_limiter,
)

logger = logging.getLogger(__name__)

Obj = Mapping[str, Any]

QUEUE_NAME: Final = "podset"
DEFAULT_WORKERS: Final = 5
"""Upstream ``--concurrent-replicaset-syncs`` default."""
MIN_READY_SKEW_S: Final = 1.0
"""Upstream adds a second when requeueing for minReadySeconds, "to avoid milliseconds skew"."""
RECENT_STATUS_WRITES: Final = 100
"""PodSets whose last status write is remembered (``status_writes``); one evicted early costs
at most a 409 and a retry."""


class PodControlError(Exception):
    """A pod create/delete/patch the API server refused; ``str()`` is its message."""

    def __init__(self, message: str, *, status: int = 0, causes: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.causes = frozenset(causes)


class PodControl(Protocol):
    """Writes to pods (upstream ``controller.PodControlInterface``)."""

    async def create_pod(self, namespace: str, pod: Mapping[str, Any]) -> Mapping[str, Any]: ...

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete with a UID precondition; a pod already gone raises with ``status`` 404."""
        ...

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """A strategic-merge patch (adoption and release of owner references)."""
        ...


class PodSetClient(Protocol):
    async def get_podset(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """An uncached read (the recheck before adopting); None when gone."""
        ...

    async def update_status(
        self, podset: Mapping[str, Any], new_status: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        """Write status with the resourceVersion read; the stored PodSet. Raises ``Conflict``
        on 409."""
        ...


class EventRecorder(Protocol):
    def event(self, obj: Obj, type_: str, reason: str, message: str) -> None:
        """Record a Kubernetes Event about ``obj`` (fire and forget)."""
        ...


def podset_key(obj: Obj) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}"


def format_label_selector(raw: Mapping[str, Any]) -> str:
    """``metav1.LabelSelectorAsSelector(...).String()``: requirements sorted by key.

    The scale subresource publishes this string in ``status.selector``; an HPA parses it back.
    """
    parts: list[tuple[str, str]] = []
    for key, value in (raw.get("matchLabels") or {}).items():
        parts.append((key, f"{key}={value}"))
    for expression in raw.get("matchExpressions") or []:
        key = expression.get("key", "")
        operator = expression.get("operator", "")
        values = ",".join(sorted(expression.get("values") or []))
        if operator == "In":
            parts.append((key, f"{key} in ({values})"))
        elif operator == "NotIn":
            parts.append((key, f"{key} notin ({values})"))
        elif operator == "Exists":
            parts.append((key, key))
        elif operator == "DoesNotExist":
            parts.append((key, f"!{key}"))
    return ",".join(text for _, text in sorted(parts))


_KEPT_METADATA: Final = (
    "name", "namespace", "uid", "labels", "ownerReferences",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
)  # fmt: skip
"""What the view keeps of a pod's metadata. Its resourceVersion is left out, so that an update
changing nothing the controller reads keeps the view as it was (:func:`reproject_pod_view`):
no sync reads it (a pod's deletion and adoption are conditioned on its uid, as upstream's), and
the store keeps each entry's version beside the view."""
_ABSENT: Final = object()


def controlled_by_another_kind(pod: Obj) -> bool:
    """Whether the pod's controller reference names a kind other than PodSet (a ReplicaSet's,
    a Job's, ...: nearly every pod of a real cluster). No PodSet adopts such a pod, reads its
    status or ranks it; only its identity, labels, owners and deletion matter, for as long as
    that reference stays. Malformed owner references are not judged here: the pod keeps the
    whole view and the controller's own reads say what is wrong."""
    try:
        ref = claims.controller_ref(pod)
    except podutil.InvalidObjectError:
        return False
    return ref is not None and ref.get("kind") != claims.PODSET_KIND


def pod_view(pod: Obj) -> dict[str, Any]:
    """What the PodSet controller keeps of a pod: identity, labels, ownership, lifecycle.

    The deletion ranking reads the deletion-cost annotation, the node, the phase, the Ready
    condition, restart counts and timestamps; claiming reads labels and owner references.
    Everything else (the pod spec, most of the status) stays out of the cache. Of a pod another
    kind controls (:func:`controlled_by_another_kind`) only the metadata claiming and the
    event handlers read is kept: a kubelet's status updates of it then change nothing here.
    A pod whose controller reference names another kind but a PodSet's uid (only a forged
    reference does) is seen by that PodSet without its status, hence as not ready.
    """
    metadata = pod.get("metadata") or {}
    if type(metadata) is dict and controlled_by_another_kind(pod):
        return {"metadata": {key: metadata[key] for key in _KEPT_METADATA if key in metadata}}
    spec = pod.get("spec") or {}
    pod_status = pod.get("status") or {}
    annotations = metadata.get("annotations") or {}
    kept_metadata = {key: metadata[key] for key in _KEPT_METADATA if key in metadata}
    cost = annotations.get(podutil.POD_DELETION_COST_ANNOTATION)
    if cost is not None:
        kept_metadata["annotations"] = {podutil.POD_DELETION_COST_ANNOTATION: cost}
    kept_status: dict[str, Any] = {}
    if "phase" in pod_status:
        kept_status["phase"] = pod_status["phase"]
    ready = [c for c in pod_status.get("conditions") or [] if c.get("type") == podutil.POD_READY]
    if ready:
        kept_status["conditions"] = ready
    for key in ("containerStatuses", "initContainerStatuses"):
        if pod_status.get(key):
            kept_status[key] = [
                {"name": s.get("name"), "restartCount": s.get("restartCount", 0)}
                for s in pod_status[key]
            ]
    view: dict[str, Any] = {"metadata": kept_metadata, "status": kept_status}
    if spec.get("nodeName"):
        view["spec"] = {"nodeName": spec["nodeName"]}
    return view


def reproject_pod_view(previous: dict[str, Any], pod: Obj) -> dict[str, Any]:
    """The view of ``pod``, an update of the pod ``previous`` is the view of: ``previous``
    itself when nothing the view keeps changed (a kubelet's status update changing no
    condition, count or phase the controller reads; of a pod another kind controls, any status
    update), else the new :func:`pod_view`. Keeping the same view spares the collector a
    long-lived object per update, and tells :meth:`PodSetController.on_pod` that the update
    changes nothing a sync reads."""
    # Equal owner references make the previous view one of a pod another kind controls too.
    metadata, kept = pod.get("metadata"), previous.get("metadata")
    if (
        type(metadata) is dict
        and type(kept) is dict
        and controlled_by_another_kind(pod)
        and all(metadata.get(key, _ABSENT) == kept.get(key, _ABSENT) for key in _KEPT_METADATA)
    ):
        return previous
    view = pod_view(pod)
    # The status first: what a kubelet's update changes when it changes the view at all.
    if view.get("status") == previous.get("status") and view == previous:
        return previous
    return view


class PodSetController:
    """Upstream's ``ReplicaSetController``, for PodSets, driven by tally's caches."""

    def __init__(
        self,
        podsets: Store[Obj],
        pods: Store[Obj],
        pod_control: PodControl,
        client: PodSetClient,
        recorder: EventRecorder,
        *,
        workers: int = DEFAULT_WORKERS,
        burst_replicas: int = replicas.BURST_REPLICAS,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        metrics_provider: MetricsProvider | None = None,
    ) -> None:
        self.podsets = podsets
        """PodSet objects (whole: few and small)."""
        self.pods = pods
        """Pods as :func:`pod_view` keeps them."""
        self.pod_control = pod_control
        self.client = client
        self.recorder = recorder
        self.burst_replicas = burst_replicas
        self.clock = clock
        self.expectations = UIDTrackingControllerExpectations()
        self.status_writes = RecentWrites(RECENT_STATUS_WRITES)
        """PodSets as this process's status writes stored them, until the cache catches up:
        a sync that follows a status write at once (a scale-up re-queues its key all along)
        would otherwise read the cached copy from before that write and fail its own write
        on conflict, one more request under the PodSet client's rate limit."""
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(
            default_controller_rate_limiter(), name=QUEUE_NAME, metrics_provider=metrics_provider
        )
        # A pod write the API server refused (a quota, a namespace terminating) is retried
        # and logged in one line: the PodSet's ReplicaFailure condition and its Warning Event
        # already say it to the user, as upstream's; a traceback per retry says nothing more.
        self._pool = WorkerPool(
            self.queue,
            self.sync_podset,
            workers=workers,
            name=QUEUE_NAME,
            expected=(Conflict, PodControlError),
        )

    # -- lifecycle

    def start(self) -> None:
        self._pool.start()

    async def stop(self, grace_period: float = DEFAULT_STOP_TIMEOUT) -> None:
        """Stop the workers; syncs still running after ``grace_period`` seconds are cancelled
        (0: at once, when leadership is lost)."""
        await self._pool.stop(grace_period=grace_period)

    # -- PodSet events

    def on_podset(self, change: Change[Obj]) -> None:
        if change.kind is ChangeKind.DELETED:
            # A new PodSet with the same name must start with clean expectations.
            self.expectations.delete_expectations(podset_key(change.old or {}))
            self.queue.add(podset_key(change.old or {}))
            return
        self.queue.add(podset_key(change.new or {}))

    # -- pod events (upstream addPod / updatePod / deletePod)

    def on_pod(self, change: Change[Obj]) -> None:
        if change.kind is ChangeKind.DELETED:
            self._delete_pod(change.old or {})
        elif change.kind is ChangeKind.ADDED:
            self._add_pod(change.new or {})
        elif change.old is not change.new:
            self._update_pod(change.old or {}, change.new or {})
        # else: the view was kept (reproject_pod_view), so the update changes nothing a sync
        # reads; upstream's updatePod would queue the owner for a sync that does nothing new.

    def _resolve(self, namespace: str, ref: Mapping[str, Any] | None) -> Obj | None:
        """The PodSet a controller reference points at, if it is ours and still the same."""
        if ref is None or ref.get("kind") != claims.PODSET_KIND:
            return None
        podset = self.podsets.get(namespace, str(ref.get("name") or ""))
        if podset is None or podutil.get_str(podset, "metadata", "uid") != ref.get("uid"):
            return None
        return podset

    def _matching_podsets(self, pod: Obj) -> list[Obj]:
        namespace = podutil.get_str(pod, "metadata", "namespace")
        labels = podutil.get_string_map(pod, "metadata", "labels")
        found = []
        for podset in self.podsets.in_namespace(namespace):
            selector = _selector(podset)
            if selector is not None and not selector.is_empty() and selector.matches(labels):
                found.append(podset)
        return found

    def _add_pod(self, pod: Obj) -> None:
        if podutil.is_being_deleted(pod):
            # On a restart a pod may already be terminating: that is a deletion, not a creation
            # (upstream: "so that a pod never stays in the creation expectations").
            self._delete_pod(pod)
            return
        namespace = podutil.get_str(pod, "metadata", "namespace")
        ref = claims.controller_ref(pod)
        if ref is not None:
            podset = self._resolve(namespace, ref)
            if podset is not None:
                key = podset_key(podset)
                self.expectations.creation_observed(key)
                self.queue.add(key)
            return
        # An orphan: wake every PodSet that might adopt it. Orphans never lower expectations.
        for podset in self._matching_podsets(pod):
            self.queue.add(podset_key(podset))

    def _update_pod(self, old: Obj, new: Obj) -> None:
        namespace = podutil.get_str(new, "metadata", "namespace")
        labels_changed = podutil.get_string_map(old, "metadata", "labels") != (
            podutil.get_string_map(new, "metadata", "labels")
        )
        if podutil.is_being_deleted(new):
            # A graceful delete shows first as an update; count it as the deletion now so the
            # PodSet can replace the pod without waiting for the grace period.
            self._delete_pod(new)
            if labels_changed:
                self._delete_pod(old)
            return
        old_ref, new_ref = claims.controller_ref(old), claims.controller_ref(new)
        if old_ref != new_ref and old_ref is not None:
            podset = self._resolve(namespace, old_ref)
            if podset is not None:
                self.queue.add(podset_key(podset))
        if new_ref is not None:
            podset = self._resolve(namespace, new_ref)
            if podset is not None:
                key = podset_key(podset)
                self.queue.add(key)
                min_ready = podutil.get_int(podset, "spec", "minReadySeconds")
                if min_ready > 0 and not podutil.is_pod_ready(old) and podutil.is_pod_ready(new):
                    # Becomes available only after minReadySeconds: look again then.
                    self.queue.add_after(key, min_ready + MIN_READY_SKEW_S)
            return
        if labels_changed or old_ref != new_ref:
            for podset in self._matching_podsets(new):
                self.queue.add(podset_key(podset))

    def _delete_pod(self, pod: Obj) -> None:
        namespace = podutil.get_str(pod, "metadata", "namespace")
        podset = self._resolve(namespace, claims.controller_ref(pod))
        if podset is None:
            return  # orphans being deleted interest nobody
        key = podset_key(podset)
        self.expectations.deletion_observed(key, podutil.pod_key(pod))
        self.queue.add(key)

    # -- sync

    async def sync_podset(self, key: str) -> None:
        """Reconcile one PodSet (upstream ``syncReplicaSet``)."""
        namespace, _, name = key.partition("/")
        podset = self.podsets.get(namespace, name)
        if podset is None:
            self.expectations.delete_expectations(key)
            return
        podset = self.status_writes.check_cache(podset)
        selector = _selector(podset)
        if selector is None:
            # An invalid selector cannot be fixed by retrying; the webhook refuses new ones.
            logger.error("%s: invalid selector; not syncing", key)
            return
        needs_sync = self.expectations.satisfied_expectations(key)
        all_pods = list(self.pods.in_namespace(namespace))
        active = podutil.filter_active_pods(all_pods)
        filtered, claim_error = await self._claim_pods(podset, selector, active)

        manage_error: Exception | None = None
        if needs_sync and not podutil.is_being_deleted(podset):
            manage_error = await self._manage_replicas(filtered, podset, key)

        now = self.clock()
        uid = podutil.get_str(podset, "metadata", "uid")
        terminating = claims.filter_claimed_pods(
            uid, selector.matches, podutil.filter_terminating_pods(all_pods)
        )
        new_status = status.calculate_status(
            podset, filtered, manage_error, now, terminating_pods=terminating
        )
        new_status["selector"] = format_label_selector(podutil.get_map(podset, "spec", "selector"))
        if status.status_needs_update(podset, new_status) or (
            podutil.get_map(podset, "status").get("selector") != new_status["selector"]
        ):
            stored = await self.client.update_status(
                podset, status.with_observed_generation(podset, new_status)
            )
            self.status_writes.add(stored)
        if manage_error is None and claim_error is None:
            delay = status.next_available_check(
                filtered, podutil.get_int(podset, "spec", "minReadySeconds"), now
            )
            if delay is not None:
                self.queue.add_after(key, delay + MIN_READY_SKEW_S)
        if manage_error is not None:
            raise manage_error
        if claim_error is not None:
            raise claim_error

    async def _claim_pods(
        self, podset: Obj, selector: LabelSelector, pods: list[Obj]
    ) -> tuple[list[Obj], Exception | None]:
        """Keep, adopt and release pods (upstream ``ClaimPods``); the claimed ones."""
        plan = claims.claim_pods(podset, selector.matches, pods)
        errors: list[Exception] = []
        adopted: list[str] = []
        if plan.adopt:
            # Before the first adoption, make sure the PodSet is still the one we read and not
            # being deleted: adopting into a dying owner would hand pods to the GC.
            namespace = podutil.get_str(podset, "metadata", "namespace")
            name = podutil.get_str(podset, "metadata", "name")
            fresh = await self.client.get_podset(namespace, name)
            uid = podutil.get_str(podset, "metadata", "uid")
            refusal = (
                claims.can_adopt(fresh, uid)
                if fresh is not None
                else claims.recheck_failed(Exception(f"original PodSet {namespace}/{name} is gone"))
            )
            for pod in plan.adopt:
                if refusal is not None:
                    errors.append(claims.adopt_error(pod, refusal))
                    continue
                try:
                    await self.pod_control.patch_pod(
                        namespace,
                        podutil.get_str(pod, "metadata", "name"),
                        claims.adopt_patch(podset, pod),
                    )
                except PodControlError as error:
                    if error.status != 404:
                        errors.append(error)
                    continue
                adopted.append(podutil.pod_key(pod))
        for pod in plan.release:
            try:
                await self.pod_control.patch_pod(
                    podutil.get_str(pod, "metadata", "namespace"),
                    podutil.get_str(pod, "metadata", "name"),
                    claims.release_patch(pod, [podutil.get_str(podset, "metadata", "uid")]),
                )
            except PodControlError as error:
                if error.status not in (404, 422):
                    errors.append(error)
        return plan.claimed(adopted), (errors[0] if errors else None)

    async def _manage_replicas(
        self, filtered: list[Obj], podset: Obj, key: str
    ) -> Exception | None:
        """Create or delete pods towards ``spec.replicas`` (upstream ``manageReplicas``)."""
        wanted = podutil.get_int(podset, "spec", "replicas", default=1)
        diff = replicas.manage_replicas_diff(len(filtered), wanted, self.burst_replicas)
        namespace = podutil.get_str(podset, "metadata", "namespace")
        if diff < 0:
            count = -diff
            # Set before the calls, lowered after: a create's event may arrive before the call
            # returns, and must find the expectation already there.
            self.expectations.expect_creations(key, count)
            try:
                template_pod = replicas.pod_from_template(podset)
            except ValueError as error:
                self.expectations.lower_expectations(key, count, 0)
                return error

            async def create() -> None:
                try:
                    created = await self.pod_control.create_pod(namespace, template_pod)
                except PodControlError as error:
                    if replicas.NAMESPACE_TERMINATING_CAUSE in error.causes:
                        return  # every create fails while the namespace goes away
                    self.recorder.event(
                        podset, "Warning", replicas.FAILED_CREATE_POD_REASON,
                        f"Error creating: {error}",
                    )  # fmt: skip
                    raise
                self.recorder.event(
                    podset, "Normal", replicas.SUCCESSFUL_CREATE_POD_REASON,
                    f"Created pod: {podutil.get_str(created, 'metadata', 'name')}",
                )  # fmt: skip

            successes, first_error = await replicas.slow_start_batch(
                count, replicas.SLOW_START_INITIAL_BATCH_SIZE, create
            )
            # Creates that failed or were never tried will not be observed: lower now.
            for _ in range(count - successes):
                self.expectations.creation_observed(key)
            return first_error
        if diff > 0:
            to_delete = ranking.get_pods_to_delete(filtered, [], diff, self.clock())
            # Tracked by pod key, so a graceful delete and the final delete count once.
            self.expectations.expect_deletions(key, [podutil.pod_key(p) for p in to_delete])
            errors: list[Exception] = []

            async def delete(pod: Obj) -> None:
                pod_name = podutil.get_str(pod, "metadata", "name")
                try:
                    await self.pod_control.delete_pod(
                        namespace, pod_name, podutil.get_str(pod, "metadata", "uid")
                    )
                except PodControlError as error:
                    # Will not be observed: lower now.
                    self.expectations.deletion_observed(key, podutil.pod_key(pod))
                    if error.status != 404:
                        self.recorder.event(
                            podset, "Warning", replicas.FAILED_DELETE_POD_REASON,
                            f"Error deleting: {error}",
                        )  # fmt: skip
                        errors.append(error)
                    return
                self.recorder.event(
                    podset, "Normal", replicas.SUCCESSFUL_DELETE_POD_REASON,
                    f"Deleted pod: {pod_name}",
                )  # fmt: skip

            await asyncio.gather(*(delete(pod) for pod in to_delete))
            return errors[0] if errors else None
        return None


def _selector(podset: Obj) -> LabelSelector | None:
    try:
        return parse_label_selector(podutil.get_map(podset, "spec").get("selector"))
    except SelectorError:
        return None
