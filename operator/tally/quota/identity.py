"""What names a quota: the keys the quota side passes between its parts.

Two questions get two types. *Which running total does this decision change?* — a
:class:`QuotaIdentity`: a ResourceQuota is one total in one namespace; a ClusterQuota is one
total over many namespaces, so admission, which reads it through one view per namespace, must
drop the namespace or it would charge one object twice. *Which share does this charge, sync or
status line belong to?* — a :class:`QuotaKey`: upstream's work-queue key ``namespace/name`` for
a ResourceQuota; for a ClusterQuota, its share in one namespace, spelt
``(namespace, "clusterquota:<name>")`` so both kinds share one ledger and one queue type without
a ClusterQuota ever colliding with a ResourceQuota of the same name (``:`` is not valid in a
name).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

CLUSTER_QUOTA_KIND: Final = "ClusterQuota"
"""``kind`` of a ClusterQuota, and of the ResourceQuota-shaped views admission reads it
through: messages and identities are worded by it."""

CLUSTER_QUOTA_KEY_PREFIX: Final = "clusterquota:"


class QuotaKey(NamedTuple):
    """A quota's share in one namespace: ``(namespace, name)`` of a ResourceQuota;
    ``(namespace, "clusterquota:<name>")`` of a ClusterQuota's share (:func:`cluster_quota_key`)."""

    namespace: str
    name: str


class QuotaIdentity(NamedTuple):
    """One running total: ``("", namespace, name)`` of a ResourceQuota;
    ``("ClusterQuota", "", name)`` of a ClusterQuota, whichever namespace it was read for."""

    kind: str
    namespace: str
    name: str


def is_cluster_quota(quota: Mapping[str, Any]) -> bool:
    """Whether ``quota`` is a ClusterQuota (or a view of one), not a ResourceQuota."""
    return quota.get("kind") == CLUSTER_QUOTA_KIND


def quota_name(quota: Mapping[str, Any]) -> str:
    """``metadata.name`` of a quota, ``""`` when missing."""
    return _metadata_str(quota, "name")


def quota_uid(quota: Mapping[str, Any]) -> str:
    """``metadata.uid`` of a quota, ``""`` when missing: which incarnation of the name."""
    return _metadata_str(quota, "uid")


def _metadata_str(quota: Mapping[str, Any], key: str) -> str:
    metadata = quota.get("metadata")
    if isinstance(metadata, Mapping):
        value = metadata.get(key)
        if isinstance(value, str):
            return value
    return ""


def _metadata_namespace(quota: Mapping[str, Any]) -> str:
    metadata = quota.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return namespace if isinstance(namespace, str) else ""


def quota_identity(quota: Mapping[str, Any]) -> QuotaIdentity:
    """The running total ``quota`` (a ResourceQuota or a ClusterQuota's view) stands for."""
    if is_cluster_quota(quota):
        return QuotaIdentity(CLUSTER_QUOTA_KIND, "", quota_name(quota))
    return QuotaIdentity("", _metadata_namespace(quota), quota_name(quota))


def quota_key(quota: Mapping[str, Any], namespace: str = "") -> QuotaKey:
    """The key of ``quota``'s share: a ResourceQuota's own ``(namespace, name)``; a
    ClusterQuota's (or its view's) share in ``namespace``."""
    if is_cluster_quota(quota):
        return cluster_quota_key(namespace, quota_name(quota))
    return QuotaKey(_metadata_namespace(quota), quota_name(quota))


def cluster_quota_key(namespace: str, name: str) -> QuotaKey:
    """The key of ClusterQuota ``name``'s share in ``namespace``: its charges are held per
    namespace, as its status counts them; ``namespace=""`` keys the whole ClusterQuota."""
    return QuotaKey(namespace, CLUSTER_QUOTA_KEY_PREFIX + name)


def cluster_quota_of(key: QuotaKey) -> str | None:
    """The ClusterQuota a key names; None for a ResourceQuota's key."""
    name = key[1]
    if name.startswith(CLUSTER_QUOTA_KEY_PREFIX):
        return name[len(CLUSTER_QUOTA_KEY_PREFIX) :]
    return None


def sync_key(key: QuotaKey) -> QuotaKey:
    """The key a controller syncs ``key`` under: a ResourceQuota's own; for a ClusterQuota's
    share in a namespace, the whole ClusterQuota's (``("", "clusterquota:<name>")``), which one
    status write covers."""
    name = cluster_quota_of(key)
    return key if name is None else cluster_quota_key("", name)


def format_key(key: QuotaKey) -> str:
    """``namespace/name``, as upstream's queue keys and log lines spell a quota."""
    return f"{key.namespace}/{key.name}" if key.namespace else key.name
