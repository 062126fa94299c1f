"""Sizing a PodSet's creates and deletes: burst cap, slow-start batches, and the pod to create.

Upstream ``pkg/controller/replicaset/replica_set.go`` (``manageReplicas``' sizing,
``slowStartBatch``, ``BurstReplicas``) and ``pkg/controller/controller_utils.go``
(``SlowStartInitialBatchSize``, ``GetPodFromTemplate``). This module owns how many calls a sync
makes and in what groups, and the body of each pod it creates. The controller owns the calls
themselves, the expectations around them and the Events they produce.

The caller's contract around :func:`slow_start_batch`, as upstream's ``manageReplicas`` does it:

1. ``diff = manage_replicas_diff(len(active_pods), replicas)``; if negative, ``-diff`` pods are
   missing.
2. ``expect_creations(key, -diff)`` *before* the first ``await`` (see
   :mod:`tally.podset.expectations`).
3. ``successes, err = await slow_start_batch(-diff, SLOW_START_INITIAL_BATCH_SIZE, create_one)``,
   where ``create_one`` swallows the errors that count as success (the namespace is
   terminating: every create would fail, nothing is to be done).
4. Lower the expectations once for every create that failed or was never tried
   (``-diff - successes`` times ``creation_observed``): the informer will never observe them.

Left out: the deletes (one concurrent batch of at most :data:`BURST_REPLICAS`, chosen by
:mod:`tally.podset.ranking`) need no helper beyond :func:`manage_replicas_diff`.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

from tally.machinery import validation
from tally.podset import claim, podutil
from tally.podset.podutil import Obj

BURST_REPLICAS = 500
"""Most creates or deletes in one sync (upstream ``BurstReplicas``, "a realistic value ... based
off performance requirements for kubernetes 1.0"). A PodSet is suspended after this many, until
the watch events for them arrive (or the expectations expire), so one large scale-up cannot
monopolise a worker or the API server."""

SLOW_START_INITIAL_BATCH_SIZE = 1
"""Size of the first batch of creates; each successful batch doubles the next
(upstream ``SlowStartInitialBatchSize``).

Cost model, for ``N`` pods to create: once a quota (or anything else) denies every create, the
doomed calls per sync number ``min(N, SLOW_START_INITIAL_BATCH_SIZE)``, so a larger value means
more doomed API calls and Warning events per sync; the number of batches is
``1 + floor(log2(ceil(N / SLOW_START_INITIAL_BATCH_SIZE)))``, so a smaller value means more
round trips for a large scale-up. With 1: 500 pods take 9 batches (1, 2, 4, ..., 256, 245), and
a denied create costs one call per sync."""

# Event reasons and messages (upstream ``controller_utils.go``; the ``FailedCreate`` and
# ``FailedDelete`` reasons double as the ReplicaFailure condition reasons in tally.podset.status).
SUCCESSFUL_CREATE_POD_REASON = "SuccessfulCreate"
"""Normal event after a create: ``Created pod: <name>``."""
FAILED_CREATE_POD_REASON = "FailedCreate"
"""Warning event after a failed create: ``Error creating: <error>`` (not sent when the namespace
is terminating)."""
SUCCESSFUL_DELETE_POD_REASON = "SuccessfulDelete"
"""Normal event after a delete: ``Deleted pod: <name>``."""
FAILED_DELETE_POD_REASON = "FailedDelete"
"""Warning event after a failed delete (not NotFound): ``Error deleting: <error>``; the error
returned to the sync is then ``unable to delete pods: <error>``."""
NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"
"""``status.details.causes[].type`` of a create refused because the namespace is being deleted
(``v1.NamespaceTerminatingCause``): such a create counts as a success in slow start."""


def manage_replicas_diff(
    active_count: int, replicas: int, burst_replicas: int = BURST_REPLICAS
) -> int:
    """Active minus desired pods, capped at ``burst_replicas`` either way (``manageReplicas``).

    Negative: that many pods to create. Positive: that many to delete. Zero: nothing to do.
    """
    diff = active_count - replicas
    return max(-burst_replicas, min(burst_replicas, diff))


async def slow_start_batch(
    count: int, initial_batch_size: int, fn: Callable[[], Awaitable[None]]
) -> tuple[int, Exception | None]:
    """Call ``fn`` ``count`` times: in batches of 1, 2, 4, ... run concurrently, stopping early.

    Upstream ``slowStartBatch``: it starts slow to check for errors, then speeds up while the
    calls succeed. Batch sizes start at ``initial_batch_size`` and double after each batch, capped
    at what remains. If any call in a batch raises, the rest of that batch still finishes, and
    every later batch is skipped.

    Returns ``(successes, first_error)``: the number of calls that returned normally, and the
    exception of the first call to fail (in completion order, like upstream's channel), or
    ``None``. Only ``Exception`` counts as a failed call; cancellation and other
    ``BaseException`` propagate at once (cancelling the caller cancels the calls in flight).
    """
    if initial_batch_size < 1 and count > 0:
        raise ValueError(f"initial_batch_size must be at least 1, got {initial_batch_size}")
    remaining = count
    successes = 0
    batch_size = min(remaining, initial_batch_size)
    while batch_size > 0:
        errors = await _run_batch(batch_size, fn)
        successes += batch_size - len(errors)
        if errors:
            return successes, errors[0]
        remaining -= batch_size
        batch_size = min(2 * batch_size, remaining)
    return successes, None


async def _run_batch(size: int, fn: Callable[[], Awaitable[None]]) -> list[Exception]:
    """Run ``size`` calls concurrently; their exceptions in the order they were raised."""
    errors: list[Exception] = []

    async def call_once() -> None:
        try:
            await fn()
        except Exception as err:  # every failure counts, like an error sent to upstream's channel
            errors.append(err)

    await asyncio.gather(*(call_once() for _ in range(size)))
    return errors


def pods_prefix(controller_name: str) -> str:
    """``generateName`` for a controller's pods: ``<name>-`` (upstream ``getPodsPrefix``).

    The dash is dropped when ``<name>-`` would not be a valid pod name prefix (a DNS-1123
    subdomain, with the trailing dash allowed, at most 253 characters).
    """
    prefix = f"{controller_name}-"
    masked = prefix[:-1] + "a"  # ValidatePodName(prefix=true) masks the trailing dash
    if validation.is_dns1123_subdomain(masked):
        return controller_name
    return prefix


def pod_from_template(podset: Obj, generate_name: str | None = None) -> dict[str, Any]:
    """The pod a PodSet creates (upstream ``GetPodFromTemplate`` and ``createPods``' check).

    ``metadata``: ``generateName`` (``generate_name``, else :func:`pods_prefix` of the PodSet's
    name), the PodSet's namespace, copies of the template's labels, annotations and finalizers
    (each only when non-empty), and :func:`~tally.podset.claim.owner_reference_for` the PodSet.
    ``spec``: a deep copy of the template's spec. Nothing else of the template's metadata.

    Raises ``ValueError("unable to create pods, no labels")`` when the template has no labels,
    as upstream's ``createPods`` refuses such a pod: it could never be selected back.
    """
    template = podutil.get_map(podset, "spec", "template")
    labels = dict(podutil.get_string_map(template, "metadata", "labels"))
    if not labels:
        raise ValueError("unable to create pods, no labels")
    annotations = dict(podutil.get_string_map(template, "metadata", "annotations"))
    finalizers = list(podutil.get_list(template, "metadata", "finalizers"))
    if not all(isinstance(f, str) for f in finalizers):
        raise podutil.InvalidObjectError(
            f"{podutil.describe(podset)}: spec.template.metadata.finalizers must be strings"
        )
    name = podutil.get_str(podset, "metadata", "name")
    metadata: dict[str, Any] = {
        "generateName": generate_name if generate_name else pods_prefix(name),
    }
    namespace = podutil.get_str(podset, "metadata", "namespace")
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    if finalizers:
        metadata["finalizers"] = finalizers
    metadata["ownerReferences"] = [claim.owner_reference_for(podset)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": copy.deepcopy(dict(podutil.get_map(template, "spec"))),
    }
