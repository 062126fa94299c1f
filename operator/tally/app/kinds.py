"""The kinds tally follows, named once: what the caches hold, Kopf watches and the routing
wires (upstream's quota controller's core kinds, tally's own, and namespaces for their labels).
"""

from __future__ import annotations

from typing import Final

from tally.clusterquota import applied
from tally.evaluators.base import GroupResource
from tally.kube import cluster_quotas
from tally.podset import client as podset_client

RESOURCE_QUOTAS: Final = GroupResource("", "resourcequotas")
TRACKED_CORE_KINDS: Final = (
    GroupResource("", "pods"),
    GroupResource("", "services"),
    GroupResource("", "persistentvolumeclaims"),
    GroupResource("", "configmaps"),
    GroupResource("", "secrets"),
    GroupResource("", "replicationcontrollers"),
)
"""The core kinds upstream's quota controller always watches (its evaluators' kinds)."""
PODS: Final = GroupResource("", "pods")
SECRETS: Final = GroupResource("", "secrets")
PODSETS: Final = GroupResource(podset_client.GROUP, podset_client.PLURAL)
"""tally's own kind: reconciled by the PodSet controller and countable by quotas."""
CLUSTER_QUOTAS: Final = GroupResource(cluster_quotas.GROUP, cluster_quotas.PLURAL)
"""tally's ClusterQuotas (cluster-scoped)."""
APPLIED_CLUSTER_QUOTAS: Final = GroupResource(applied.GROUP, applied.PLURAL)
"""What tally writes of each ClusterQuota into the namespaces it selects (namespaced)."""
NAMESPACES: Final = GroupResource("", "namespaces")
"""Namespaces, for their labels: what ClusterQuotas select."""
CLUSTER_SCOPED: Final = frozenset({CLUSTER_QUOTAS, NAMESPACES})
OWN_KINDS: Final = {
    PODSETS: podset_client.VERSION,
    CLUSTER_QUOTAS: cluster_quotas.VERSION,
    APPLIED_CLUSTER_QUOTAS: applied.VERSION,
}
"""tally's custom resources and their versions: a missing CRD lists as no objects."""
