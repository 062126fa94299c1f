"""Which pods a PodSet deletes first when it has too many (upstream ``ActivePodsWithRanks``,
``getPodsToDelete`` and ``getPodsRankedByRelatedPodsOnSameNode``).

This module owns the scale-down order. The order is upstream's ``ActivePodsWithRanks.Less``;
pod ``a`` sorts before pod ``b`` (is deleted first) by the first rule that tells them apart:

1. Unassigned before assigned: only one of them has ``spec.nodeName``.
2. By phase: ``Pending`` < ``Unknown`` < ``Running``. Any other phase (missing, or terminal ones
   that active pods never have) ranks as ``Pending``, as upstream's map lookup does.
3. Not ready before ready.
4. Lower ``controller.kubernetes.io/pod-deletion-cost`` first (missing or invalid = 0).
5. Higher rank first. The rank of a pod is the number of active related pods on its node
   ("doubled up" pods go first); for a PodSet, which has no owner, related pods are usually
   none and every rank is 0.
6. Both ready: the one ready for a shorter time first. With ``now`` set, times are compared in
   log2 buckets of their age in nanoseconds (``logarithmicRankDiff``); the same bucket falls back
   to the UID, a pseudo-random but stable order among equivalent pods. A missing ready time counts
   as the most recent.
7. More container restarts first: the highest ``restartCount`` of regular containers, then of
   restartable init containers (sidecars). Plain counts, no buckets.
8. Newer ``creationTimestamp`` first, in log2 buckets as in 6 (UID on a tie); missing counts as
   newest.

If no rule applies the pods are equivalent. Feature gates are fixed at their current defaults:
``PodDeletionCost`` and ``LogarithmicScaleDown`` on.

Sorting: upstream uses ``sort.Sort`` (not stable) with ``Less``; here ``sorted`` (stable) with the
same comparison through ``functools.cmp_to_key``. Each pod's sort facts are read once, up front,
so a malformed pod fails with :class:`~tally.podset.podutil.InvalidObjectError` before sorting
starts rather than mid-comparison.

Left out: ``ActivePods`` and ``ByLogging`` (other orders), and the deletion age-ratio metric.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence

from tally.podset import podutil
from tally.podset.podutil import Obj

_PHASE_ORDINAL: Mapping[str, int] = {
    podutil.POD_PENDING: 0,
    podutil.POD_UNKNOWN: 1,
    podutil.POD_RUNNING: 2,
}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_DECIMAL = re.compile(r"[+-]?[0-9]+\Z")


def get_deletion_cost_from_pod_annotations(annotations: Mapping[str, str]) -> int:
    """The pod-deletion-cost annotation as an int32; 0 when absent.

    Upstream ``GetDeletionCostFromPodAnnotations``: a leading ``+`` or a leading zero
    (``"+10"``, ``"008"``) is invalid, ``"0"`` and negatives are fine, and the value must fit in
    an int32 (``strconv.ParseInt(value, 10, 32)``). Raises ``ValueError`` for an invalid value;
    the ranking treats that as 0, as upstream does.
    """
    value = annotations.get(podutil.POD_DELETION_COST_ANNOTATION)
    if value is None:
        return 0
    if not _valid_first_digit(value) or _DECIMAL.match(value) is None:
        raise ValueError(f"invalid value {value!r}")
    cost = int(value)
    if not _INT32_MIN <= cost <= _INT32_MAX:
        raise ValueError(f"value out of range: {value!r}")
    return cost


def _valid_first_digit(value: str) -> bool:
    if not value:
        return False
    return value[0] == "-" or value == "0" or "1" <= value[0] <= "9"


def _deletion_cost(pod: Obj) -> int:
    try:
        return get_deletion_cost_from_pod_annotations(
            podutil.get_string_map(pod, "metadata", "annotations")
        )
    except podutil.InvalidObjectError:
        raise
    except ValueError:
        return 0  # upstream ignores the error and uses the 0 it returns


def max_container_restarts(pod: Obj) -> tuple[int, int]:
    """``(regular, sidecar)``: the highest restart count among regular containers, and among
    init containers with ``restartPolicy: Always`` (upstream ``maxContainerRestarts``)."""
    regular = 0
    for status in podutil.get_list(pod, "status", "containerStatuses"):
        regular = max(regular, podutil.get_int(status, "restartCount"))
    sidecars = {
        podutil.get_str(container, "name")
        for container in podutil.get_list(pod, "spec", "initContainers")
        if podutil.get_str(container, "restartPolicy") == "Always"
    }
    sidecar = 0
    for status in podutil.get_list(pod, "status", "initContainerStatuses"):
        if podutil.get_str(status, "name") in sidecars:
            sidecar = max(sidecar, podutil.get_int(status, "restartCount"))
    return regular, sidecar


@dataclasses.dataclass(frozen=True)
class _Facts:
    """What the comparison reads from one pod, read once."""

    node_name: str
    phase_ordinal: int
    ready: bool
    deletion_cost: int
    ready_time: int | None
    restarts: tuple[int, int]
    created: int | None
    uid: str

    @classmethod
    def of(cls, pod: Obj) -> _Facts:
        return cls(
            node_name=podutil.get_str(pod, "spec", "nodeName"),
            phase_ordinal=_PHASE_ORDINAL.get(podutil.get_str(pod, "status", "phase"), 0),
            ready=podutil.is_pod_ready(pod),
            deletion_cost=_deletion_cost(pod),
            ready_time=podutil.pod_ready_time(pod),
            restarts=max_container_restarts(pod),
            created=podutil.parse_time(
                podutil.get_map(pod, "metadata").get("creationTimestamp"),
                field="metadata.creationTimestamp",
                owner=pod,
            ),
            uid=podutil.get_str(pod, "metadata", "uid"),
        )


def _after_or_zero(t1: int | None, t2: int | None) -> bool:
    """``t1`` is after ``t2``; a zero (missing) time counts as after any other."""
    if t1 is None or t2 is None:
        return t1 is None
    return t1 > t2


def _logarithmic_rank_diff(t1: int, t2: int, now: int) -> int:
    """Difference of the floor(log2(age in ns)) buckets of two times; -1 for a non-positive age."""
    d1, d2 = now - t1, now - t2
    r1 = int(math.log2(float(d1))) if d1 > 0 else -1
    r2 = int(math.log2(float(d2))) if d2 > 0 else -1
    return r1 - r2


def _compare_times(t1: int | None, t2: int | None, now: int | None, uid1: str, uid2: str) -> bool:
    """Rules 6 and 8 for two different times: more recent first, in log2 buckets."""
    if now is None or t1 is None or t2 is None:
        return _after_or_zero(t1, t2)
    rank_diff = _logarithmic_rank_diff(t1, t2, now)
    if rank_diff == 0:
        return uid1 < uid2
    return rank_diff < 0


def _less(a: _Facts, rank_a: int, b: _Facts, rank_b: int, now: int | None) -> bool:
    # 1. Unassigned < assigned.
    if a.node_name != b.node_name and (not a.node_name or not b.node_name):
        return not a.node_name
    # 2. Pending < Unknown < Running.
    if a.phase_ordinal != b.phase_ordinal:
        return a.phase_ordinal < b.phase_ordinal
    # 3. Not ready < ready.
    if a.ready != b.ready:
        return not a.ready
    # 4. Lower pod-deletion-cost < higher pod-deletion-cost.
    if a.deletion_cost != b.deletion_cost:
        return a.deletion_cost < b.deletion_cost
    # 5. Doubled up < not doubled up: more co-located related pods first.
    if rank_a != rank_b:
        return rank_a > rank_b
    # 6. Both ready: ready for empty time < less time < more time.
    if a.ready and b.ready and a.ready_time != b.ready_time:
        return _compare_times(a.ready_time, b.ready_time, now, a.uid, b.uid)
    # 7. Higher container restart counts < lower, regular containers before sidecars.
    if a.restarts[0] != b.restarts[0]:
        return a.restarts[0] > b.restarts[0]
    if a.restarts[1] != b.restarts[1]:
        return a.restarts[1] > b.restarts[1]
    # 8. Empty creation time < newer < older.
    if a.created != b.created:
        return _compare_times(a.created, b.created, now, a.uid, b.uid)
    return False


@dataclasses.dataclass
class ActivePodsWithRanks:
    """Pods with a rank each, sortable in deletion order (upstream ``ActivePodsWithRanks``)."""

    pods: Sequence[Obj]
    """The pods to order."""
    rank: Sequence[int]
    """One rank per pod (same length): see rule 5 of the module docstring."""
    now: dt.datetime | None
    """Reference time for the logarithmic comparisons (rules 6 and 8); ``None`` compares the
    plain times, as upstream does with a zero ``Now``."""

    def __post_init__(self) -> None:
        if len(self.pods) != len(self.rank):
            raise ValueError(
                f"pods and rank must have equal length, got {len(self.pods)} and {len(self.rank)}"
            )
        self._facts = [_Facts.of(pod) for pod in self.pods]
        self._now = podutil.to_unix_nanos(self.now) if self.now is not None else None

    def less(self, i: int, j: int) -> bool:
        """Whether pod ``i`` should be deleted before pod ``j`` (upstream ``Less``)."""
        return _less(self._facts[i], self.rank[i], self._facts[j], self.rank[j], self._now)

    def sorted_pods(self) -> list[Obj]:
        """The pods in deletion order, first to delete first."""

        def compare(i: int, j: int) -> int:
            if self.less(i, j):
                return -1
            if self.less(j, i):
                return 1
            return 0

        order = sorted(range(len(self.pods)), key=functools.cmp_to_key(compare))
        return [self.pods[i] for i in order]


def active_pods_with_ranks(
    pods: Sequence[Obj], ranks: Sequence[int], now: dt.datetime | None
) -> list[Obj]:
    """``pods`` in deletion order with the given ranks (``sort.Sort(ActivePodsWithRanks)``)."""
    return ActivePodsWithRanks(pods=pods, rank=ranks, now=now).sorted_pods()


def get_pods_ranked_by_related_pods_on_same_node(
    pods_to_rank: Sequence[Obj], related_pods: Iterable[Obj], now: dt.datetime | None
) -> ActivePodsWithRanks:
    """Rank each pod by the number of active ``related_pods`` on its node.

    Upstream ``getPodsRankedByRelatedPodsOnSameNode``. ``related_pods`` should generally be a
    superset of ``pods_to_rank``. Unassigned pods share the node name ``""``, so they rank by
    the number of active unassigned related pods, exactly as upstream counts them.
    """
    pods_on_node: dict[str, int] = {}
    for pod in related_pods:
        if podutil.is_pod_active(pod):
            node = podutil.get_str(pod, "spec", "nodeName")
            pods_on_node[node] = pods_on_node.get(node, 0) + 1
    ranks = [pods_on_node.get(podutil.get_str(pod, "spec", "nodeName"), 0) for pod in pods_to_rank]
    return ActivePodsWithRanks(pods=pods_to_rank, rank=ranks, now=now)


def get_pods_to_delete(
    filtered_pods: Sequence[Obj], related_pods: Iterable[Obj], diff: int, now: dt.datetime | None
) -> list[Obj]:
    """The ``diff`` pods to delete from ``filtered_pods`` (upstream ``getPodsToDelete``).

    No sorting when all of them go (``diff >= len(filtered_pods)``): they are returned in their
    given order, as upstream does. ``filtered_pods`` is not modified (upstream sorts its slice in
    place). ``diff`` is capped at ``len(filtered_pods)``; a negative one is an error.
    """
    if diff < 0:
        raise ValueError(f"diff must not be negative, got {diff}")
    if diff < len(filtered_pods):
        ranked = get_pods_ranked_by_related_pods_on_same_node(filtered_pods, related_pods, now)
        return ranked.sorted_pods()[:diff]
    return list(filtered_pods)
