"""What quota admission needs of ClusterQuotas: the views that bind a namespace, and the
compare-and-swap write of a charge made on a view.

Admission judges a request against every quota that binds it, all or nothing: the
ResourceQuotas of its namespace and, here, a view of each ClusterQuota selecting that namespace
(:func:`tally.clusterquota.quota.as_resource_quota`: the spec, and the *total* as
``status.used``). When a pass charged a view, :meth:`ClusterQuotaBinding.write` turns the
view's new ``status.used`` into the ClusterQuota's status (the total, and the namespace's share
grown by the same amount) and writes it carrying the resourceVersion the view was read at: a
concurrent charge from another namespace's pass, or another replica, makes it fail with
:class:`~tally.machinery.errors.Conflict`, and admission retries against a fresh view, as for a
ResourceQuota. Never over the limit, however many passes race.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from tally.clusterquota import quota as cluster
from tally.machinery.cache import Store
from tally.machinery.errors import Conflict
from tally.quota.resources import ResourceList, ResourceListError, parse_resource_list

Obj = Mapping[str, Any]


class Selection(Protocol):
    def selecting(self, namespace: str) -> list[Obj]:
        """The ClusterQuotas (newest copies) selecting ``namespace``."""
        ...


class StatusWriter(Protocol):
    def freshest(self, cached: Obj) -> Obj: ...

    async def put_status(self, cq: Obj) -> Obj: ...

    async def refresh(self, name: str) -> None: ...


class ClusterQuotaBinding:
    """The ClusterQuota half of quota admission's ``QuotaAccessor`` (see module doc)."""

    def __init__(
        self, selection: Selection, cluster_quotas: Store[Obj], writer: StatusWriter
    ) -> None:
        self._selection = selection
        self._cluster_quotas = cluster_quotas
        self._writer = writer

    def views(self, namespace: str) -> list[dict[str, Any]]:
        return [
            cluster.as_resource_quota(self._writer.freshest(cq), namespace)
            for cq in self._selection.selecting(namespace)
        ]

    async def refresh(self, view: Obj) -> None:
        """Read the ClusterQuota ``view`` stands for from the API; the next views use it.
        Not when a newer copy than the view's is known already (the write that won was this
        process's, the usage controller's say, or the watch has delivered it): the retry
        judges that one, and a read of the object, as large as its list of namespaces, would
        only repeat it."""
        metadata = view.get("metadata") or {}
        name = str(metadata.get("name") or "")
        cached = self._cluster_quotas.get("", name)
        known = (self._writer.freshest(cached).get("metadata") or {}) if cached is not None else {}
        if cached is not None and known.get("resourceVersion") != metadata.get("resourceVersion"):
            return
        await self._writer.refresh(name)

    async def write(
        self,
        view: Obj,
        charged_by_namespace: Mapping[str, ResourceList],
        given_back_by_namespace: Mapping[str, ResourceList] | None = None,
    ) -> dict[str, Any]:
        """Write the charge ``view`` carries (its ``status.used`` is the new total; each
        namespace's share grows by ``charged_by_namespace`` and lowers by
        ``given_back_by_namespace``, :func:`~tally.clusterquota.quota.charged_status`); returns
        the view of the stored ClusterQuota."""
        metadata = view.get("metadata") or {}
        name, namespace = str(metadata.get("name") or ""), str(metadata.get("namespace") or "")
        cached = self._cluster_quotas.get("", name)
        if cached is None:
            raise LookupError(f'clusterquotas.tally.dev "{name}" not found')
        current = self._writer.freshest(cached)
        version = str((current.get("metadata") or {}).get("resourceVersion") or "")
        if version != str(metadata.get("resourceVersion") or ""):
            # Changed since the view was read: the API server would refuse the same way.
            raise Conflict(f"clusterquotas/{name}: changed since it was read")
        try:
            total = parse_resource_list((view.get("status") or {}).get("used"), "status.used")
        except ResourceListError as error:
            raise ValueError(f"cluster quota {name}: {error}") from None
        status = cluster.charged_status(
            current, charged_by_namespace, total, given_back_by_namespace
        )
        stored = await self._writer.put_status({**current, "status": status})
        return cluster.as_resource_quota(stored, namespace)
