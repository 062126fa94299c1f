"""Whether a pod's QoS class is BestEffort: ``pkg/apis/core/v1/helper/qos`` (``GetPodQOS``),
reduced to the one question quota asks (the ``BestEffort`` and ``NotBestEffort`` scopes).

Only cpu and memory decide; pod-level ``spec.resources``, when present, decide alone; a class
the API server recorded in ``status.qosClass`` is trusted as upstream trusts it.

Its own module because the QoS class is upstream's own package, computed from the same parsed
requests and limits as :mod:`tally.evaluators.podresources`, not part of the pod evaluator's
rules.
"""

from __future__ import annotations

from tally.evaluators.base import Obj, get_mapping, get_str
from tally.evaluators.podresources import PodResources
from tally.quota.resources import ResourceList

__all__ = ["is_best_effort"]


def _resource_qos_best_effort(requests: ResourceList, limits: ResourceList) -> bool | None:
    """``resourceQOS`` reduced to what quota needs: True BestEffort, False Guaranteed, None
    Burstable (only cpu and memory decide)."""
    if not requests and not limits:
        return True
    best_effort: bool | None = None
    for name in ("cpu", "memory"):
        request = requests.get(name)
        limit = limits.get(name)
        req = 0 if request is None else request.nanos
        lim = 0 if limit is None else limit.nanos
        if req != lim:
            return None
        zero = req == 0
        if best_effort is None:
            best_effort = zero
        elif best_effort != zero:
            return None
    return best_effort


def is_best_effort(pod: Obj, res: PodResources | None = None) -> bool:
    """The pod's QoS class is BestEffort (``qos.GetPodQOS``); ``res``: its resources, when
    already parsed."""
    qos_class = get_str(get_mapping(pod, "status"), "qosClass", "status.qosClass")
    if qos_class:
        # The API server records the class at creation; upstream GetPodQOS trusts it.
        return qos_class == "BestEffort"
    res = res or PodResources.parse(pod)
    if res.pod_requests is not None:
        # Pod-level resources decide alone when spec.resources is present.
        return _resource_qos_best_effort(res.pod_requests, res.pod_limits or {}) is True
    classes = {
        _resource_qos_best_effort(c.requests, c.limits)
        for c in (*res.init_containers, *res.containers)
    }
    if not classes:
        return True
    return classes == {True}
