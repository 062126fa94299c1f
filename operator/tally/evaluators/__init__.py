"""Quota evaluators: what an object charges against a quota, per group/resource.

The package is pure (no I/O, no Kopf, no Kubernetes client). ``base`` holds the
:class:`Evaluator` protocol and shared helpers; ``pods``, ``services``, ``pvcs``,
``resourceclaims`` and ``generic`` the evaluators upstream has; ``podresources`` a pod's
effective requests and limits (upstream's ``resourcehelper.PodRequests``/``PodLimits``) and
``qos`` whether a pod is BestEffort (upstream's ``qos.GetPodQOS``), both of which the pod
evaluator reads; ``podsets`` tally's PodSet measures (a PodSet's template usage times its
replicas); ``measured`` a ClusterQuota measure's evaluator (CEL over any kind); ``registry``
the group/resource map and :func:`calculate_usage`. This module re-exports the names other
layers use, and is the one place that imports from all of them.
"""

from tally.evaluators.base import (
    Clock,
    ConstraintError,
    Evaluator,
    GroupResource,
    Obj,
    ObjectError,
    Operation,
    ScopeError,
    ScopeName,
    ScopeRequirement,
    calculate_usage_stats,
    object_count_resource_name,
    parse_scope_requirement,
    quota_scopes,
)
from tally.evaluators.generic import LEGACY_OBJECT_COUNT_ALIASES, ObjectCountEvaluator
from tally.evaluators.pods import PodEvaluator, PodProjection, project_pod, quota_v1_pod
from tally.evaluators.pvcs import PersistentVolumeClaimEvaluator
from tally.evaluators.registry import (
    IGNORED_RESOURCES,
    Registry,
    UsageError,
    calculate_quota_usage,
    calculate_usage,
    new_registry,
)
from tally.evaluators.services import ServiceEvaluator

__all__ = [
    "IGNORED_RESOURCES",
    "LEGACY_OBJECT_COUNT_ALIASES",
    "Clock",
    "ConstraintError",
    "Evaluator",
    "GroupResource",
    "Obj",
    "ObjectCountEvaluator",
    "ObjectError",
    "Operation",
    "PersistentVolumeClaimEvaluator",
    "PodEvaluator",
    "PodProjection",
    "Registry",
    "ScopeError",
    "ScopeName",
    "ScopeRequirement",
    "ServiceEvaluator",
    "UsageError",
    "calculate_quota_usage",
    "calculate_usage",
    "calculate_usage_stats",
    "new_registry",
    "object_count_resource_name",
    "parse_scope_requirement",
    "project_pod",
    "quota_scopes",
    "quota_v1_pod",
]
