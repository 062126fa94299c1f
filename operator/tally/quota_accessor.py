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

import time
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from tally import kube
from tally.admission.accessor import UpdatedQuotas
from tally.cache import Store
from tally.errors import Conflict

Obj = Mapping[str, Any]


def _key(quota: Obj) -> tuple[str, str]:
    metadata = quota.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


class KubeQuotaAccessor:
    """``QuotaAccessor`` over the controller's quota store and the API.

    It is also the controller's ``QuotaStatusWriter``: every status this process writes, from
    a reservation or a recalculation, lands in the updated-quotas LRU, so admission never
    judges against a copy older than our own last write.
    """

    def __init__(self, quotas: Store[Obj], api: client.ApiClient) -> None:
        self._quotas = quotas
        self._api = api
        self._updated = UpdatedQuotas()
        # Monotonic time of admission's last reservation per quota (see the controller's
        # RESERVATION_GRACE_S). Entries are small and bounded by the number of quotas.
        self._reserved_at: dict[tuple[str, str], float] = {}

    def newest(self, cached: Obj) -> Obj:
        """``cached``, or our own later write of the same quota if the cache lags behind it."""
        return self._updated.check_cache(cached)

    async def get_quotas(self, namespace: str) -> list[Obj]:
        """The namespace's quotas by name, each the newer of the cached and our written copy.

        No I/O: a namespace without quotas costs a dictionary lookup.
        """
        return sorted(
            (self._updated.check_cache(q) for q in self._quotas.in_namespace(namespace)),
            key=_key,
        )

    async def _put_status(self, quota: Obj) -> Obj:
        """PUT the status subresource carrying the resourceVersion read (compare and swap)."""
        namespace, name = _key(quota)
        path = kube.collection_path("", "v1", "resourcequotas", namespace) + f"/{name}/status"
        try:
            stored = await kube.put_json(self._api, path, quota)
        except client.ApiException as error:
            if error.status == 409:
                raise Conflict(f"{namespace}/{name}: {error.reason}") from error
            raise
        self._updated.add(stored)
        return stored

    async def update_quota_status(self, quota: Obj) -> Obj:
        """Admission's write (``QuotaAccessor``): the CAS status update, remembered as a
        reservation so the controller does not erase it before the object is cached."""
        stored = await self._put_status(quota)
        self._reserved_at[_key(stored)] = time.monotonic()
        return stored

    def reservation_observed(self, key: tuple[str, str]) -> None:
        """A watch event showed usage of this quota raised: possibly another replica's
        reservation, which this process must not erase either (``usage_raised``)."""
        self._reserved_at[key] = time.monotonic()

    def since_reservation(self, key: tuple[str, str]) -> float | None:
        at = self._reserved_at.get(key)
        return None if at is None else time.monotonic() - at

    async def update_status(self, quota_obj: Obj, status: Mapping[str, Mapping[str, str]]) -> None:
        """The controller's write (``QuotaStatusWriter``); a quota deleted meanwhile is done."""
        try:
            await self._put_status({**quota_obj, "status": status})
        except client.ApiException as error:
            if error.status != 404:
                raise
