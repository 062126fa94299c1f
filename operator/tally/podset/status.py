"""A PodSet's status: what a sync computes, when it is worth writing, and when to look again.

Upstream ``pkg/controller/replicaset/replica_set_utils.go`` (``calculateStatus``,
``updateReplicaSetStatus``' no-op check, ``NewReplicaSetCondition``/``GetCondition``/
``SetCondition``/``RemoveCondition``) and the ``minReadySeconds`` requeues of ``replica_set.go``.
This module owns the status fields and the ``ReplicaFailure`` condition; the controller writes
the result through the status subresource.

* :func:`calculate_status` starts from a copy of the current status and sets ``replicas`` (active
  claimed pods), ``fullyLabeledReplicas`` (those whose labels include every template label),
  ``readyReplicas``, ``availableReplicas`` (ready for ``minReadySeconds``) and
  ``terminatingReplicas`` (claimed pods being deleted, not yet terminal). It leaves
  ``observedGeneration`` alone, exactly as upstream's ``calculateStatus`` does: the generation is
  stamped only when the status is written (:func:`with_observed_generation`), so a failed or
  skipped write never claims a spec was seen.
* ``ReplicaFailure``: on a manage error, when the condition is absent, it is added with status
  ``True``, reason ``FailedCreate`` (too few pods) or ``FailedDelete`` (too many), the error's
  text as message and ``now`` as ``lastTransitionTime``. An existing one is left as it is, message
  and time included, even if the new error differs. When a sync manages without error (or does
  not manage at all), the condition is removed.
* :func:`status_needs_update` is upstream's steady-state check: no write when every counter, the
  conditions, and ``observedGeneration == metadata.generation`` are already current.

Deliberate difference: upstream reports ``terminatingReplicas`` only with the
``DeploymentReplicaSetTerminatingReplicas`` feature gate (and omits it otherwise); tally always
reports it. Left out: ``status.selector`` (the string form the scale subresource needs), which the
controller sets from the spec; it is carried over untouched here.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tally.podset import podutil
from tally.podset.podutil import (
    Obj,
    filter_active_pods,
    filter_terminating_pods,
    is_pod_active,
    is_pod_available,
    is_pod_ready,
    is_pod_terminating,
)

__all__ = [
    "FAILED_CREATE_REASON",
    "FAILED_DELETE_REASON",
    "REPLICA_FAILURE",
    "calculate_status",
    "filter_active_pods",
    "filter_terminating_pods",
    "get_condition",
    "is_pod_active",
    "is_pod_available",
    "is_pod_ready",
    "is_pod_terminating",
    "new_condition",
    "next_available_check",
    "remove_condition",
    "set_condition",
    "status_needs_update",
    "with_observed_generation",
]

REPLICA_FAILURE = "ReplicaFailure"
"""Condition type set when creating or deleting pods failed (``ReplicaSetReplicaFailure``)."""
FAILED_CREATE_REASON = "FailedCreate"
"""Condition reason (and Warning event reason) when pods could not be created."""
FAILED_DELETE_REASON = "FailedDelete"
"""Condition reason (and Warning event reason) when pods could not be deleted."""

_COUNTERS = ("replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas")


def new_condition(
    condition_type: str, status: str, reason: str, message: str, now: dt.datetime
) -> dict[str, Any]:
    """A PodSet condition (upstream ``NewReplicaSetCondition``); empty reason/message omitted."""
    condition: dict[str, Any] = {
        "type": condition_type,
        "status": status,
        "lastTransitionTime": podutil.format_time(now),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _conditions(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    conditions = status.get("conditions")
    if conditions is None:
        return []
    if not isinstance(conditions, list) or not all(isinstance(c, Mapping) for c in conditions):
        raise podutil.InvalidObjectError("status.conditions must be a list of objects")
    return conditions


def get_condition(status: Mapping[str, Any], condition_type: str) -> Mapping[str, Any] | None:
    """The first condition of ``condition_type`` (upstream ``GetCondition``), or ``None``."""
    for condition in _conditions(status):
        if condition.get("type") == condition_type:
            return condition
    return None


def set_condition(status: dict[str, Any], condition: Mapping[str, Any]) -> None:
    """Add or replace ``condition`` in ``status`` (upstream ``SetCondition``; mutates ``status``).

    Nothing changes when a condition of that type already has the same status and reason, so
    its ``lastTransitionTime`` and message stay. Otherwise it replaces the old one, at the end.
    """
    current = get_condition(status, condition["type"])
    if (
        current is not None
        and current.get("status") == condition.get("status")
        and current.get("reason") == condition.get("reason")
    ):
        return
    kept = [c for c in _conditions(status) if c.get("type") != condition["type"]]
    status["conditions"] = [*kept, dict(condition)]


def remove_condition(status: dict[str, Any], condition_type: str) -> None:
    """Drop every condition of ``condition_type`` (upstream ``RemoveCondition``; mutates).

    An empty list is dropped too: upstream's nil slice, omitted from the JSON.
    """
    kept = [c for c in _conditions(status) if c.get("type") != condition_type]
    if kept:
        status["conditions"] = kept
    else:
        status.pop("conditions", None)


def _fully_labeled(template_labels: Mapping[str, str], pod: Obj) -> bool:
    labels = podutil.get_string_map(pod, "metadata", "labels")
    return all(labels.get(key) == value for key, value in template_labels.items())


def calculate_status(
    podset: Obj,
    filtered_pods: Sequence[Obj],
    manage_error: BaseException | str | None,
    now: dt.datetime,
    *,
    terminating_pods: Sequence[Obj] = (),
) -> dict[str, Any]:
    """The new status of ``podset`` (upstream ``calculateStatus``); ``podset`` is not modified.

    ``filtered_pods`` are the active pods the PodSet claimed this sync; ``terminating_pods`` the
    ones it controls and selects that are being deleted (see
    :func:`~tally.podset.claim.filter_claimed_pods` and :func:`filter_terminating_pods`).
    ``manage_error`` is what managing replicas failed with, or ``None``. ``now`` decides
    availability and stamps a new condition.
    """
    new_status: dict[str, Any] = copy.deepcopy(dict(podutil.get_map(podset, "status")))
    template_labels = podutil.get_string_map(podset, "spec", "template", "metadata", "labels")
    min_ready_seconds = podutil.get_int(podset, "spec", "minReadySeconds")
    fully_labeled = ready = available = 0
    for pod in filtered_pods:
        if _fully_labeled(template_labels, pod):
            fully_labeled += 1
        if is_pod_ready(pod):
            ready += 1
            if is_pod_available(pod, min_ready_seconds, now):
                available += 1

    failure = get_condition(podutil.get_map(podset, "status"), REPLICA_FAILURE)
    if manage_error is not None and failure is None:
        diff = len(filtered_pods) - podutil.get_int(podset, "spec", "replicas", default=1)
        reason = ""
        if diff < 0:
            reason = FAILED_CREATE_REASON
        elif diff > 0:
            reason = FAILED_DELETE_REASON
        set_condition(
            new_status, new_condition(REPLICA_FAILURE, "True", reason, str(manage_error), now)
        )
    elif manage_error is None and failure is not None:
        remove_condition(new_status, REPLICA_FAILURE)

    new_status["replicas"] = len(filtered_pods)
    new_status["fullyLabeledReplicas"] = fully_labeled
    new_status["readyReplicas"] = ready
    new_status["availableReplicas"] = available
    new_status["terminatingReplicas"] = len(terminating_pods)
    return new_status


def status_needs_update(podset: Obj, new_status: Mapping[str, Any]) -> bool:
    """Whether ``new_status`` differs from what ``podset`` shows (``updateReplicaSetStatus``).

    No write when the four counters and ``terminatingReplicas`` are equal, the conditions are
    equal, and ``status.observedGeneration`` already equals ``metadata.generation``. Missing
    counters are 0 and missing ``terminatingReplicas`` differs from 0, as in Go; missing and empty
    condition lists are the same (both are omitted from JSON).
    """
    old = podutil.get_map(podset, "status")
    for counter in _COUNTERS:
        if podutil.get_int(old, counter) != podutil.get_int(new_status, counter):
            return True
    if old.get("terminatingReplicas") != new_status.get("terminatingReplicas"):
        return True
    if podutil.get_int(podset, "metadata", "generation") != podutil.get_int(
        old, "observedGeneration"
    ):
        return True
    return _conditions(old) != _conditions(new_status)


def with_observed_generation(podset: Obj, new_status: Mapping[str, Any]) -> dict[str, Any]:
    """``new_status`` stamped with ``metadata.generation``, ready to write.

    Upstream saves "the generation number we acted on" only in the write path, so that a retried
    update does not wrongly claim to have seen a later spec.
    """
    status = dict(new_status)
    status["observedGeneration"] = podutil.get_int(podset, "metadata", "generation")
    return status


def next_available_check(
    pods: Iterable[Obj], min_ready_seconds: int, now: dt.datetime
) -> float | None:
    """Seconds until the earliest ready-but-not-yet-available pod becomes available.

    ``None`` when ``min_ready_seconds <= 0`` or no pod is waiting. A ready pod without a
    ``lastTransitionTime`` never becomes available (:func:`is_pod_available`) and is not waited
    for. The controller requeues the PodSet after this delay so ``availableReplicas`` catches up
    without a pod event; upstream does the same with ``AddAfter(minReadySeconds)`` (plus a second
    "to avoid milliseconds skew") from its pod update handler and at the end of a sync.
    """
    if min_ready_seconds <= 0:
        return None
    now_ns = podutil.to_unix_nanos(now)
    earliest: int | None = None
    for pod in pods:
        if not is_pod_ready(pod) or is_pod_available(pod, min_ready_seconds, now):
            continue
        since = podutil.pod_ready_time(pod)
        if since is None:
            continue
        due = since + min_ready_seconds * 1_000_000_000
        earliest = due if earliest is None else min(earliest, due)
    if earliest is None:
        return None
    return (earliest - now_ns) / 1_000_000_000
