"""Where quota admission reads quotas and writes their status: upstream's ``QuotaAccessor``.

Admission needs two things from the outside world, and this module states them as a
:class:`QuotaAccessor` protocol so that the checks and the batching stay pure and testable with
an in-memory fake:

* ``get_quotas(namespace)``: the current view of the namespace's ResourceQuotas. Upstream reads
  its informer cache, falls back to a live LIST (cached 30 s, de-duplicated) when the cache has
  none, and prefers quotas it wrote itself when their resourceVersion is newer than the
  cache's copy. tally's implementation (the operator layer) does the same over the usage
  controller's cache; :class:`UpdatedQuotas` is the pure half of the "prefer my own writes"
  rule, ready to be used there.
* ``update_quota_status(quota)``: a compare-and-swap write: an update of the ``status``
  subresource that carries the resourceVersion that was read, so that a concurrent writer makes
  it fail with 409 instead of being overwritten.

:class:`Conflict` is re-exported from the controller, which raises it for the same 409.

Left out: any client code; this module imports no Kubernetes client.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any, Final, Protocol

from tally.errors import Conflict

__all__ = ["UPDATED_QUOTAS_SIZE", "Conflict", "QuotaAccessor", "UpdatedQuotas", "quota_name"]

Quota = Mapping[str, Any]

UPDATED_QUOTAS_SIZE: Final = 100
"""Upstream's ``lru.New(100)`` for the updated-quotas cache."""


class QuotaAccessor(Protocol):
    """Reads a namespace's quotas and writes one quota's status (upstream ``QuotaAccessor``)."""

    async def get_quotas(self, namespace: str) -> list[Quota]:
        """Every ResourceQuota of ``namespace``, as API JSON, newest known version of each.

        The caller never mutates what it gets. Raising fails every waiting request of the
        namespace (with the exception's status when it is an ``AdmissionDenied``, else 500).
        """
        ...

    async def update_quota_status(self, quota: Quota) -> Quota:
        """Write ``quota``'s ``status`` through the status subresource, carrying its
        ``metadata.resourceVersion``; return the stored object.

        Raises :class:`Conflict` on 409 (the quota changed since it was read). Any other
        exception is a failed write too; an ``AdmissionDenied`` raised here is passed to the
        requests unchanged, anything else becomes a 500.
        """
        ...


def quota_name(quota: Quota) -> str:
    """``metadata.name`` of a quota, ``""`` when missing."""
    metadata = quota.get("metadata")
    if isinstance(metadata, Mapping):
        name = metadata.get("name")
        if isinstance(name, str):
            return name
    return ""


def _key(quota: Quota) -> tuple[str, str]:
    metadata = quota.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return (namespace if isinstance(namespace, str) else "", quota_name(quota))


def _resource_version(quota: Quota) -> int | None:
    metadata = quota.get("metadata")
    value = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


class UpdatedQuotas:
    """Quotas this process wrote recently, preferred over older cached copies.

    Upstream's ``updatedQuotas`` LRU and ``checkCache``: after a status write the informer's
    copy lags behind, and a batch that read it would fail its write on conflict. Upstream
    measured 22 updates with 12 conflicts before this cache and 15 with 0 after. It relies on
    etcd resourceVersions being comparable integers for one object, as upstream's
    ``APIObjectVersioner`` does; a version that is not an integer never wins.
    """

    def __init__(self, size: int = UPDATED_QUOTAS_SIZE) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._size = size
        #: (namespace, name) → the stored quota a write returned; least recently used first.
        self._entries: collections.OrderedDict[tuple[str, str], Quota] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, stored: Quota) -> None:
        """Remember the object a successful status write returned."""
        key = _key(stored)
        self._entries[key] = stored
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def check_cache(self, quota: Quota) -> Quota:
        """The newer of ``quota`` (from the cache) and the remembered write of the same quota.

        Once the cache has caught up (its version is at least the remembered one) the entry is
        dropped, as upstream does.
        """
        key = _key(quota)
        cached = self._entries.get(key)
        if cached is None:
            return quota
        self._entries.move_to_end(key)
        current, remembered = _resource_version(quota), _resource_version(cached)
        if remembered is None or (current is not None and current >= remembered):
            del self._entries[key]
            return quota
        return cached
