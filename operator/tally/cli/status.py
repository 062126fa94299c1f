"""``kubectl tally status``: which quotas bind the namespaces asked about, and how full they are.

A ResourceQuota binds its own namespace; a ClusterQuota binds every namespace its
``spec.namespaceSelector`` selects (:mod:`tally.clusterquota.quota`). For each quota this module
reads what the usage controller wrote, never recomputing it: ``status.used`` against
``status.hard`` for a ResourceQuota, ``status.total`` for a ClusterQuota (whose limit is on the
total), plus each bound namespace's share from ``status.namespaces[]``. A quota whose status the
controller has not written yet shows its spec's limits with the use unknown.

A user who may not read ClusterQuotas (one holding only the built-in roles in their namespace)
reads the namespace's AppliedClusterQuotas instead (:mod:`tally.clusterquota.applied`): the same
limits and total, and that namespace's own share, which is all such a user is shown.

Pure: API JSON in, a :class:`StatusReport` out; :mod:`tally.cli.render` draws it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tally.clusterquota import quota as cluster_quota
from tally.evaluators.base import ScopeError, ScopeRequirement, quota_scopes
from tally.machinery.selectors import Operator
from tally.quota.identity import CLUSTER_QUOTA_KIND
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceListError, parse_resource_list

__all__ = [
    "RESOURCE_QUOTA",
    "NamespaceShare",
    "QuotaUse",
    "ResourceUse",
    "StatusReport",
    "applied_quota_use",
    "binding_cluster_quotas",
    "cluster_quota_use",
    "describe_scope",
    "resource_quota_use",
    "resource_uses",
    "status_report",
]

Obj = Mapping[str, Any]

RESOURCE_QUOTA: Final = "ResourceQuota"


@dataclass(frozen=True)
class ResourceUse:
    """One resource of one quota: what is used of what is allowed."""

    name: str
    hard: Quantity
    used: Quantity | None
    """None until the controller has written this name's use."""

    @property
    def percent(self) -> float | None:
        """``used / hard`` in percent; None when unknown or the limit is zero."""
        if self.used is None or self.hard.nanos <= 0:
            return None
        return self.used.nanos * 100 / self.hard.nanos

    @property
    def full(self) -> bool:
        """At or past the limit (a zero limit is full)."""
        return self.used is not None and self.used.nanos >= self.hard.nanos

    @property
    def headroom(self) -> Quantity | None:
        """``hard - used``: what may still be charged; negative when over (a limit lowered
        below what is used)."""
        return None if self.used is None else self.hard - self.used


@dataclass(frozen=True)
class NamespaceShare:
    """What one namespace a ClusterQuota binds uses of it (``status.namespaces[]``; a
    namespace that uses nothing is not listed there, and has an empty ``used`` here)."""

    namespace: str
    used: Mapping[str, Quantity]


@dataclass(frozen=True)
class QuotaUse:
    kind: str
    """:data:`RESOURCE_QUOTA` or :data:`CLUSTER_QUOTA_KIND`."""
    name: str
    namespace: str | None
    """A ResourceQuota's namespace; None for a ClusterQuota."""
    scopes: tuple[str, ...]
    resources: tuple[ResourceUse, ...]
    shares: tuple[NamespaceShare, ...] = ()
    """ClusterQuota: the namespaces asked about that it binds, with their use."""
    namespace_count: int | None = None
    """ClusterQuota: how many namespaces it selects (``status.namespaceCount``)."""
    problem: str = ""
    """Why the quota could not be read whole (a value that does not parse), or ""."""
    not_computed: str = ""
    """ClusterQuota: what tally could not compute the usage of (its ``UsageComputed``
    condition's message while that is ``False``: some values are stale), or ""."""

    @property
    def title(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class StatusReport:
    namespaces: tuple[str, ...] | None
    """The namespaces asked about; None for all of them (``-A``)."""
    quotas: tuple[QuotaUse, ...]


def describe_scope(scope: ScopeRequirement) -> str:
    """``NotBestEffort``, ``PriorityClass In (high, low)``: how ``kubectl describe`` and a
    reader write a scope, not Go's ``%v``."""
    if scope.operator is Operator.EXISTS:
        return str(scope.scope_name)
    values = f" ({', '.join(scope.values)})" if scope.values else ""
    return f"{scope.scope_name} {scope.operator}{values}"


def resource_uses(hard: Mapping[str, Quantity], used: Mapping[str, Quantity]) -> list[ResourceUse]:
    """One :class:`ResourceUse` per hard name, sorted by name."""
    return [ResourceUse(name, hard[name], used.get(name)) for name in sorted(hard)]


def _parsed(raw: object, field: str) -> tuple[dict[str, Quantity], str]:
    try:
        return parse_resource_list(raw, field), ""
    except ResourceListError as error:
        return {}, str(error)


def _section(obj: Obj, *path: str) -> Mapping[str, Any]:
    for key in path:
        value = obj.get(key) if isinstance(obj, Mapping) else None
        obj = value if isinstance(value, Mapping) else {}
    return obj


def _scopes(quota_like: Obj) -> tuple[tuple[str, ...], str]:
    try:
        return tuple(describe_scope(s) for s in quota_scopes(quota_like)), ""
    except (ScopeError, ValueError) as error:
        return (), str(error)


def resource_quota_use(rq: Obj) -> QuotaUse:
    """A ResourceQuota as the controller wrote it: ``status.hard`` and ``status.used``
    (``spec.hard`` with the use unknown before its first sync)."""
    metadata = _section(rq, "metadata")
    status = _section(rq, "status")
    if status.get("hard") is not None:
        hard, hard_problem = _parsed(status.get("hard"), "status.hard")
    else:
        hard, hard_problem = _parsed(_section(rq, "spec").get("hard"), "spec.hard")
    used, used_problem = _parsed(status.get("used"), "status.used")
    scopes, scope_problem = _scopes(rq)
    return QuotaUse(
        kind=RESOURCE_QUOTA,
        name=str(metadata.get("name") or ""),
        namespace=str(metadata.get("namespace") or ""),
        scopes=scopes,
        resources=tuple(resource_uses(hard, used)),
        problem="; ".join(p for p in (hard_problem, used_problem, scope_problem) if p),
    )


def cluster_quota_use(cq: Obj, bound: Iterable[str]) -> QuotaUse:
    """A ClusterQuota as the controller wrote it: ``status.total`` (``spec.quota.hard`` with
    the use unknown before its first sync), and the share of each ``bound`` namespace."""
    total = _section(cq, "status", "total")
    if total.get("hard") is not None:
        hard, hard_problem = _parsed(total.get("hard"), "status.total.hard")
    else:
        hard, hard_problem = _parsed(cluster_quota.spec_quota(cq).get("hard"), "spec.quota.hard")
    used, used_problem = _parsed(total.get("used"), "status.total.used")
    by_namespace = cluster_quota.namespace_used(cq)
    scopes, scope_problem = _scopes({"spec": cluster_quota.spec_quota(cq)})
    count = _section(cq, "status").get("namespaceCount")
    computed = cluster_quota.condition(cq, cluster_quota.USAGE_COMPUTED)
    not_computed = ""
    if computed is not None and computed.get("status") == "False":
        not_computed = str(computed.get("message") or computed.get("reason") or "")
    return QuotaUse(
        kind=CLUSTER_QUOTA_KIND,
        name=cluster_quota.name_of(cq),
        namespace=None,
        scopes=scopes,
        resources=tuple(resource_uses(hard, used)),
        shares=tuple(
            NamespaceShare(namespace, by_namespace.get(namespace, {}))
            for namespace in sorted(bound)
        ),
        namespace_count=count if isinstance(count, int) else None,
        problem="; ".join(p for p in (hard_problem, used_problem, scope_problem) if p),
        not_computed=not_computed,
    )


def applied_quota_use(acq: Obj) -> QuotaUse:
    """An AppliedClusterQuota (what tally shows one namespace of a ClusterQuota selecting it):
    the ClusterQuota's limits and total, and that namespace's share; no namespace count (it
    is not shown to the namespace)."""
    metadata = _section(acq, "metadata")
    namespace = str(metadata.get("namespace") or "")
    total = _section(acq, "status", "total")
    quota = _section(acq, "spec", "quota")
    if total.get("hard") is not None:
        hard, hard_problem = _parsed(total.get("hard"), "status.total.hard")
    else:
        hard, hard_problem = _parsed(quota.get("hard"), "spec.quota.hard")
    used, used_problem = _parsed(total.get("used"), "status.total.used")
    share, share_problem = _parsed(_section(acq, "status", "namespace").get("used"),
                                   "status.namespace.used")  # fmt: skip
    scopes, scope_problem = _scopes({"spec": quota})
    computed = cluster_quota.condition(acq, cluster_quota.USAGE_COMPUTED)
    not_computed = ""
    if computed is not None and computed.get("status") == "False":
        not_computed = str(computed.get("reason") or "")
    problems = (hard_problem, used_problem, share_problem, scope_problem)
    return QuotaUse(
        kind=CLUSTER_QUOTA_KIND,
        name=str(metadata.get("name") or ""),
        namespace=None,
        scopes=scopes,
        resources=tuple(resource_uses(hard, used)),
        shares=(NamespaceShare(namespace, share),),
        problem="; ".join(p for p in problems if p),
        not_computed=not_computed,
    )


def binding_cluster_quotas(
    cluster_quotas: Iterable[Obj], namespace_labels: Mapping[str, Mapping[str, str]]
) -> list[tuple[Obj, list[str]]]:
    """Each ClusterQuota that selects at least one of the namespaces (name to labels), with
    those it selects, sorted; ordered by name. One whose selector does not parse selects
    nothing (tally's controller and admission ignore it too)."""
    result: list[tuple[Obj, list[str]]] = []
    for cq in sorted(cluster_quotas, key=cluster_quota.name_of):
        try:
            selector = cluster_quota.selector(cq)
        except cluster_quota.InvalidClusterQuota:
            continue
        bound = cluster_quota.selected_namespaces(selector, namespace_labels.items())
        if bound:
            result.append((cq, bound))
    return result


def status_report(
    namespaces: Sequence[str] | None,
    resource_quotas: Iterable[Obj],
    cluster_quotas: Iterable[Obj],
    namespace_labels: Mapping[str, Mapping[str, str]],
    applied: Iterable[Obj] = (),
) -> StatusReport:
    """Every ResourceQuota given (sorted by namespace and name), then every ClusterQuota that
    binds one of ``namespace_labels``' namespaces (by name), or, where the ClusterQuotas could
    not be read, every AppliedClusterQuota given (by name)."""
    rqs = sorted(
        (resource_quota_use(rq) for rq in resource_quotas),
        key=lambda q: (q.namespace or "", q.name),
    )
    cqs = [
        cluster_quota_use(cq, bound)
        for cq, bound in binding_cluster_quotas(cluster_quotas, namespace_labels)
    ]
    cqs += sorted((applied_quota_use(acq) for acq in applied), key=lambda q: q.name)
    return StatusReport(
        namespaces=None if namespaces is None else tuple(namespaces),
        quotas=tuple(rqs + cqs),
    )
