"""Where quota admission reads quotas and writes their status: upstream's ``QuotaAccessor``.

Admission needs three things from the outside world, and this module states them as a
:class:`QuotaAccessor` protocol so that the checks and the batching stay pure and testable with
an in-memory fake:

* ``get_quotas(namespace)``: the current view of the namespace's ResourceQuotas. Upstream reads
  its informer cache, falls back to a live LIST (cached 30 s, de-duplicated) when the cache has
  none, and prefers quotas it wrote itself when their resourceVersion is newer than the
  cache's copy. tally's implementation (the operator layer) does the same over the usage
  controller's cache, and keeps upstream's updated-quotas LRU itself
  (:class:`tally.kube.quota_accessor.UpdatedQuotas`).
* ``update_quota_status(quota)``: a compare-and-swap write: an update of the ``status``
  subresource that carries the resourceVersion that was read, so that a concurrent writer makes
  it fail with 409 instead of being overwritten.
* ``refresh(quota)``: after a lost write, the stored copy from the API. Upstream retries
  against its informer, which often has not seen the write that won yet, so its retries tend
  to lose again; with several webhook replicas charging one quota that ends in 409s.

:class:`Conflict` and :class:`NotFound` are re-exported from the controller, which raises
them for the same 409 and 404.

Left out: any client code; this module imports no Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from tally.machinery.errors import Conflict, NotFound
from tally.quota.resources import ResourceList

__all__ = ["Conflict", "NotFound", "QuotaAccessor"]

Quota = Mapping[str, Any]


class QuotaAccessor(Protocol):
    """Reads a namespace's quotas and writes one quota's status (upstream ``QuotaAccessor``)."""

    async def get_quotas(self, namespace: str) -> list[Quota]:
        """Every ResourceQuota of ``namespace``, as API JSON, newest known version of each.

        The caller never mutates what it gets. Raising fails every waiting request of the
        namespace (with the exception's status when it is an ``AdmissionDenied``, else 500).
        """
        ...

    async def update_quota_status(
        self,
        quota: Quota,
        *,
        charged_by_namespace: Mapping[str, ResourceList] | None = None,
        given_back_by_namespace: Mapping[str, ResourceList] | None = None,
    ) -> Quota:
        """Write ``quota``'s ``status`` through the status subresource, carrying its
        ``metadata.resourceVersion``; return the stored object.

        ``charged_by_namespace`` comes with a ClusterQuota's view: how much of the growth of
        its ``status.used`` each namespace's requests charged (its status keeps each
        namespace's share). ``given_back_by_namespace``: what of each namespace's share the
        view's ``status.used`` was judged without (charges written for requests refused
        afterwards).

        Raises :class:`Conflict` on 409 (the quota changed since it was read), and
        :class:`NotFound` on 404 (it was deleted since it was read). Any other
        exception is a failed write too; an ``AdmissionDenied`` raised here is passed to the
        requests unchanged, anything else becomes a 500.
        """
        ...

    async def refresh(self, quota: Quota) -> None:
        """A write of ``quota`` lost its compare-and-swap: fetch the stored copy from the API,
        so that the next ``get_quotas`` returns it (or a newer one) rather than a cached copy
        that has not seen the write that won. Raising only costs the retry its fresh copy.
        """
        ...
