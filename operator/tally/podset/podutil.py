"""Readers of pod JSON shared by the PodSet core (upstream ``pkg/api/v1/pod/util.go`` and the pod
filters of ``pkg/controller/controller_utils.go``).

This module owns three small things the rest of :mod:`tally.podset` needs on every pod:

* **Field access with Go's zero values.** Pods arrive as Kubernetes API JSON: a missing field is
  what Go would decode as its zero value (``""``, ``0``, an empty map or list), so a missing
  ``spec.nodeName`` is an unscheduled pod and missing labels are no labels. A field of the wrong
  JSON type cannot occur upstream (decoding the object would fail before any controller saw it);
  here it raises :class:`InvalidObjectError`, a ``ValueError`` that names the object and the
  field, instead of an unrelated ``AttributeError`` deep inside a sort.
* **Time.** Timestamps are RFC 3339 strings (``metav1.Time``; a missing one is Go's zero time,
  written ``None`` here). They are parsed to integer nanoseconds since the Unix epoch, because
  upstream's logarithmic ranking buckets ``time.Duration`` values, which are nanoseconds: the same
  arithmetic in seconds would move every bucket boundary. ``now`` always comes in as an aware
  ``datetime`` from the caller, never from the system clock, so every decision is testable.
* **Pod predicates:** ready, available, active, terminal, terminating, and the pod key
  ``namespace/name`` that deletion expectations track.

Left out: container visitors, resource requests and everything else in ``podutil`` that the
ReplicaSet controller does not use.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

Obj: TypeAlias = Mapping[str, Any]
"""A Kubernetes object as API JSON (a pod, a PodSet, a condition): read-only, camelCase keys."""

POD_DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""Annotation that ranks pods for scale-down (``core.PodDeletionCost``): lower cost goes first."""

POD_READY = "Ready"
CONDITION_TRUE = "True"
POD_PENDING = "Pending"
POD_RUNNING = "Running"
POD_UNKNOWN = "Unknown"
POD_SUCCEEDED = "Succeeded"
POD_FAILED = "Failed"

_NANOS_PER_SECOND = 1_000_000_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# RFC 3339 as Go's time.Parse(time.RFC3339, ...) accepts it for metav1.Time: optional fraction
# (Go keeps nanoseconds), and either Z or a numeric offset.
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:[Zz]|([+-])(\d{2}):(\d{2}))\Z"
)


class InvalidObjectError(ValueError):
    """An object field has a JSON type or value the API server would never have sent."""


def describe(obj: Obj) -> str:
    """``Kind namespace/name`` for messages; whatever parts are present."""
    if not isinstance(obj, Mapping):
        return f"<{type(obj).__name__}>"
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else None
    name = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
    return f"{kind} {name}" if kind else name


def _walk(obj: Obj, path: Sequence[str]) -> object:
    current: object = obj
    for i, key in enumerate(path):
        if current is None:
            return None
        # Plain dicts (decoded JSON) first: an ABC's isinstance costs several times more.
        if type(current) is not dict and not isinstance(current, Mapping):
            where = ".".join(path[:i]) or "<object>"
            raise InvalidObjectError(
                f"{describe(obj)}: {where} must be an object, got {type(current).__name__}"
            )
        current = current.get(key)
    return current


def get_map(obj: Obj, *path: str) -> Mapping[str, Any]:
    """The object at ``path``; missing or null is an empty map (Go's nil map)."""
    value = _walk(obj, path)
    if value is None:
        return {}
    if type(value) is not dict and not isinstance(value, Mapping):
        raise InvalidObjectError(
            f"{describe(obj)}: {'.'.join(path)} must be an object, got {type(value).__name__}"
        )
    return value


def get_list(obj: Obj, *path: str) -> Sequence[Any]:
    """The list at ``path``; missing or null is an empty list (Go's nil slice)."""
    value = _walk(obj, path)
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidObjectError(
            f"{describe(obj)}: {'.'.join(path)} must be a list, got {type(value).__name__}"
        )
    return value


def get_str(obj: Obj, *path: str) -> str:
    """The string at ``path``; missing or null is ``""``."""
    value = _walk(obj, path)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidObjectError(
            f"{describe(obj)}: {'.'.join(path)} must be a string, got {type(value).__name__}"
        )
    return value


def get_int(obj: Obj, *path: str, default: int = 0) -> int:
    """The integer at ``path``; missing or null is ``default`` (Go's zero, or an API default)."""
    value = _walk(obj, path)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidObjectError(
            f"{describe(obj)}: {'.'.join(path)} must be an integer, got {type(value).__name__}"
        )
    return value


def get_string_map(obj: Obj, *path: str) -> Mapping[str, str]:
    """A ``map[string]string`` (labels, annotations); missing or null is empty."""
    value = get_map(obj, *path)
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidObjectError(
                f"{describe(obj)}: {'.'.join(path)} must map strings to strings, "
                f"got {key!r}: {item!r}"
            )
    return value


# --- time -----------------------------------------------------------------------------------


def to_unix_nanos(moment: dt.datetime) -> int:
    """Nanoseconds since the Unix epoch of an aware ``datetime`` (exact, no float rounding)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"a timezone-aware datetime is required, got naive {moment!r}")
    delta = moment - _EPOCH
    seconds = delta.days * 86_400 + delta.seconds
    return seconds * _NANOS_PER_SECOND + delta.microseconds * 1_000


def parse_time(value: object, *, field: str = "timestamp", owner: Obj | None = None) -> int | None:
    """Parse a ``metav1.Time`` JSON value to Unix nanoseconds; ``None``/``""`` is the zero time.

    Raises :class:`InvalidObjectError` (naming ``owner`` and ``field``) for anything the API
    server could not have produced.
    """
    if value is None or value == "":
        return None
    where = f"{describe(owner)}: " if owner is not None else ""
    if not isinstance(value, str):
        raise InvalidObjectError(f"{where}{field} must be an RFC 3339 string, got {value!r}")
    match = _RFC3339.match(value)
    if match is None:
        raise InvalidObjectError(f"{where}{field} is not an RFC 3339 time: {value!r}")
    year, month, day, hour, minute, second, fraction, sign, off_h, off_m = match.groups()
    try:
        moment = dt.datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=dt.UTC
        )
    except ValueError as err:
        raise InvalidObjectError(f"{where}{field} is not a valid time: {value!r}") from err
    nanos = to_unix_nanos(moment)
    if fraction:
        nanos += int(fraction.ljust(9, "0"))
    if sign:
        offset = (int(off_h) * 60 + int(off_m)) * 60 * _NANOS_PER_SECOND
        nanos += -offset if sign == "+" else offset
    return nanos


def format_time(moment: dt.datetime) -> str:
    """``metav1.Time`` JSON: RFC 3339 in UTC, whole seconds (upstream drops the fraction)."""
    if moment.tzinfo is None:
        raise ValueError(f"a timezone-aware datetime is required, got naive {moment!r}")
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- pods -----------------------------------------------------------------------------------


def pod_key(pod: Obj) -> str:
    """``namespace/name``: the key deletion expectations track (upstream ``PodKey``)."""
    return f"{get_str(pod, 'metadata', 'namespace')}/{get_str(pod, 'metadata', 'name')}"


def pod_conditions(pod: Obj) -> list[Mapping[str, Any]]:
    """``status.conditions``, each checked to be an object."""
    conditions = get_list(pod, "status", "conditions")
    for index, condition in enumerate(conditions):
        if not isinstance(condition, Mapping):
            raise InvalidObjectError(
                f"{describe(pod)}: status.conditions[{index}] must be an object"
            )
    return list(conditions)


def get_pod_ready_condition(pod: Obj) -> Mapping[str, Any] | None:
    """The first condition of type ``Ready`` (upstream ``GetPodReadyCondition``), or ``None``."""
    for condition in pod_conditions(pod):
        if condition.get("type") == POD_READY:
            return condition
    return None


def is_pod_ready(pod: Obj) -> bool:
    """The pod's ``Ready`` condition is ``True`` (upstream ``IsPodReady``)."""
    condition = get_pod_ready_condition(pod)
    return condition is not None and condition.get("status") == CONDITION_TRUE


def pod_ready_time(pod: Obj) -> int | None:
    """When a ready pod became ready (Unix ns), ``None`` if not ready or unknown.

    Upstream ``podReadyTime``: the ``lastTransitionTime`` of the first ``Ready=True`` condition.
    """
    if not is_pod_ready(pod):
        return None
    for condition in pod_conditions(pod):
        if condition.get("type") == POD_READY and condition.get("status") == CONDITION_TRUE:
            return parse_time(
                condition.get("lastTransitionTime"),
                field="status.conditions[Ready].lastTransitionTime",
                owner=pod,
            )
    return None  # pragma: no cover - is_pod_ready found one


def is_pod_available(pod: Obj, min_ready_seconds: int, now: dt.datetime) -> bool:
    """Ready for at least ``min_ready_seconds`` (upstream ``IsPodAvailable``).

    Available when ready and either ``min_ready_seconds == 0`` or the ``Ready`` condition's
    ``lastTransitionTime`` is set and ``lastTransitionTime + min_ready_seconds <= now``. Current
    upstream compares with ``<=``; releases before it used a strict ``Before``.
    """
    if not is_pod_ready(pod):
        return False
    if min_ready_seconds == 0:
        return True
    condition = get_pod_ready_condition(pod)
    assert condition is not None  # is_pod_ready found it
    since = parse_time(
        condition.get("lastTransitionTime"),
        field="status.conditions[Ready].lastTransitionTime",
        owner=pod,
    )
    if since is None:
        return False
    return since + min_ready_seconds * _NANOS_PER_SECOND <= to_unix_nanos(now)


def is_pod_terminal(pod: Obj) -> bool:
    """Phase ``Succeeded`` or ``Failed`` (upstream ``IsPodTerminal``)."""
    return get_str(pod, "status", "phase") in (POD_SUCCEEDED, POD_FAILED)


def is_being_deleted(obj: Obj) -> bool:
    """``metadata.deletionTimestamp`` is set."""
    return _walk(obj, ("metadata", "deletionTimestamp")) not in (None, "")


def is_pod_active(pod: Obj) -> bool:
    """Not terminal and not being deleted (upstream ``IsPodActive``)."""
    return not is_pod_terminal(pod) and not is_being_deleted(pod)


def is_pod_terminating(pod: Obj) -> bool:
    """Being deleted but not yet terminal (upstream ``IsPodTerminating``)."""
    return not is_pod_terminal(pod) and is_being_deleted(pod)


def filter_active_pods(pods: Iterable[Obj]) -> list[Obj]:
    """The pods that are :func:`is_pod_active`, in order (upstream ``FilterActivePods``)."""
    return [pod for pod in pods if is_pod_active(pod)]


def filter_terminating_pods(pods: Iterable[Obj]) -> list[Obj]:
    """The pods that are :func:`is_pod_terminating` (upstream ``FilterTerminatingPods``)."""
    return [pod for pod in pods if is_pod_terminating(pod)]
