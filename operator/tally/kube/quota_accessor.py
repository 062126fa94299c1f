"""The quota view admission decides on, and the compare-and-swap write that reserves usage.

Upstream's admission plugin reads quotas from an informer and keeps the quotas *it* wrote in a
small LRU ("updatedQuotas"): right after a reservation its own write is newer than what the
informer has delivered, and judging the next request against the older copy would admit past
the limit until the watch caught up. A copy from the LRU wins when its resourceVersion is newer
(resourceVersions are etcd revisions: integers, compared as such, as upstream's ``etcdVersioner``
does).

The informer here is the usage controller's quota store, synced before the webhook serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from kubernetes_asyncio import client

from tally.charges import ChargeLedger
from tally.charges.own_writes import OwnWrites
from tally.kube import rest
from tally.machinery.cache import RecentWrites, Store
from tally.machinery.errors import Conflict, NotFound
from tally.quota.identity import is_cluster_quota, quota_key
from tally.quota.quantity import Quantity

Obj = Mapping[str, Any]


UPDATED_QUOTAS_SIZE: Final = 100
"""Upstream's ``lru.New(100)`` for the updated-quotas cache."""


class UpdatedQuotas(RecentWrites):
    """Quotas this process wrote recently, preferred over older cached copies: upstream's
    ``updatedQuotas`` LRU (``lru.New(100)``) and ``checkCache``, over
    :class:`tally.machinery.cache.RecentWrites`."""

    def __init__(self, size: int = UPDATED_QUOTAS_SIZE) -> None:
        super().__init__(size)


class ClusterQuotaViews(Protocol):
    """The ClusterQuotas binding a namespace, as admission judges them
    (:class:`tally.clusterquota.admission.ClusterQuotaBinding`)."""

    def views(self, namespace: str) -> list[dict[str, Any]]: ...

    async def write(
        self,
        view: Obj,
        charged_by_namespace: Mapping[str, Mapping[str, Quantity]],
        given_back_by_namespace: Mapping[str, Mapping[str, Quantity]] | None = None,
    ) -> dict[str, Any]: ...

    async def refresh(self, view: Obj) -> None: ...


class KubeQuotaAccessor:
    """``QuotaAccessor`` over the controller's quota store and the API.

    It is also the controller's ``QuotaStatusWriter``: every status this process writes, from
    a reservation or a recalculation, lands in the updated-quotas LRU, so admission never
    judges against a copy older than our own last write.
    """

    def __init__(
        self,
        quotas: Store[Obj],
        api: client.ApiClient,
        charges: ChargeLedger | None = None,
        cluster_quotas: ClusterQuotaViews | None = None,
        controller_api: client.ApiClient | None = None,
        writes: OwnWrites | None = None,
    ) -> None:
        """``api``: admission's reads and writes; ``controller_api`` (default: ``api``): the
        controller's writes (:meth:`update_status`). Apart, so that a pod create that waits for
        this webhook never holds the connection the webhook's own write needs (see
        :func:`tally.kube.rest.make_api_client`). ``writes``: shared with the ClusterQuota
        writer; else one over ``charges``, where raises of usage this process did not write
        are held (:class:`~tally.charges.own_writes.OwnWrites`); None ignores them. Pass one only
        when other replicas' admission may charge the same quotas (leader election): with a
        single replica, a raise it did not write is someone editing the status, which the next
        recalculation corrects at once, as upstream's controller does."""
        self._quotas = quotas
        self._api = api
        self._controller_api = controller_api or api
        self.cluster_quotas = cluster_quotas
        """ClusterQuotas are judged beside the namespace's ResourceQuotas (None: none are)."""
        self._updated = UpdatedQuotas()
        # Copies read from the API after a lost compare-and-swap: for admission only. The
        # controller must not write over a copy its watch has not delivered yet: another
        # replica's raise in it would not be held (usage_raised sees it only with the event).
        self._refreshed = UpdatedQuotas()
        self.writes = writes if writes is not None else OwnWrites(charges)
        """Tells this process's status writes from other replicas' on the quota watch."""

    def newest(self, cached: Obj) -> Obj:
        """``cached``, or our own later write of the same quota if the cache lags behind it."""
        return self._updated.check_cache(cached)

    async def get_quotas(self, namespace: str) -> list[Obj]:
        """The namespace's quotas by name, each the newer of the cached and our written copy.

        No I/O: a namespace without quotas costs a dictionary lookup. The views of the
        ClusterQuotas selecting the namespace follow, by name.
        """
        quotas = sorted(
            (
                self._refreshed.check_cache(self._updated.check_cache(q))
                for q in self._quotas.in_namespace(namespace)
            ),
            key=quota_key,
        )
        if self.cluster_quotas is not None:
            quotas.extend(self.cluster_quotas.views(namespace))
        return quotas

    async def _put_status(self, quota: Obj, api: client.ApiClient) -> Obj:
        """PUT the status subresource carrying the resourceVersion read (compare and swap)."""
        namespace, name = key = quota_key(quota)
        path = rest.collection_path("", "v1", "resourcequotas", namespace) + f"/{name}/status"
        self.writes.writing(key)
        stored: Obj | None = None
        try:
            stored = await rest.put_json(api, path, quota)
        except client.ApiException as error:
            if error.status == 409:
                raise Conflict(f"{namespace}/{name}: {error.reason}") from error
            if error.status == 404:
                raise NotFound(f"{namespace}/{name}: {error.reason}") from error
            raise
        finally:
            self.writes.wrote(key, stored)
        self._updated.add(stored)
        return stored

    async def update_quota_status(
        self,
        quota: Obj,
        *,
        charged_by_namespace: Mapping[str, Mapping[str, Quantity]] | None = None,
        given_back_by_namespace: Mapping[str, Mapping[str, Quantity]] | None = None,
    ) -> Obj:
        """Admission's write (``QuotaAccessor``): the CAS status update, of the ResourceQuota
        or of the ClusterQuota a view stands for."""
        if is_cluster_quota(quota) and self.cluster_quotas is not None:
            return await self.cluster_quotas.write(
                quota, charged_by_namespace or {}, given_back_by_namespace
            )
        return await self._put_status(quota, self._api)

    async def refresh(self, quota: Obj) -> None:
        """Admission lost a write of ``quota``: read it from the API (a quorum read) so that
        the retry judges the copy that won, not the cache's, which may not have seen it yet.
        Kept like an own write: used while newer than the cache, dropped once it catches up."""
        if is_cluster_quota(quota) and self.cluster_quotas is not None:
            await self.cluster_quotas.refresh(quota)
            return
        namespace, name = quota_key(quota)
        path = rest.collection_path("", "v1", "resourcequotas", namespace) + f"/{name}"
        self._refreshed.add(await rest.get_json(self._api, path))

    async def update_status(self, quota_obj: Obj, status: Mapping[str, Mapping[str, str]]) -> None:
        """The controller's write (``QuotaStatusWriter``); a quota deleted meanwhile is done."""
        try:
            await self._put_status({**quota_obj, "status": status}, self._controller_api)
        except NotFound:
            return
