"""Differential test of the quota core: upstream's ``status.used`` against tally's usage.

In reference mode the real kube-controller-manager computes every ResourceQuota's
``status.used``. Each test here creates a varied set of objects in a fresh namespace, then
quotas over them covering every scope, waits until upstream has filled each quota's status and
it is stable, reads all objects back from the API as raw JSON and computes each quota's usage
with tally's :func:`~tally.evaluators.calculate_quota_usage`. For every quota the names must be
the same and every value equal to upstream's.

Values are compared numerically (both sides parsed with
:func:`~tally.quota.quantity.parse_quantity`), not as strings: upstream sums quantities in Go map
order and a sum takes the format of its first non-zero operand, so the same memory total comes out
as ``4046656k`` in one run and as a plain byte count in another (both seen here); a string match
would fail for reasons unrelated to quota semantics.

Objects are created before the quotas that count them: upstream's admission enforces quotas in
reference mode, and a quota whose status is not filled yet forbids every charged request
("status unknown"). The oracle is upstream alone: no expected value here comes from tally.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest_asyncio
from differential_objects import (
    PAST_DELETION_S,
    ClusterNames,
    as_json,
    cluster_objects,
    create_objects,
    create_pods,
    describe,
    free_node_ports,
    object_quotas,
    pod_quotas,
    quota_count_quota,
    raw_items,
    release_pods,
    settled_quotas,
    varied_pods,
    varied_pvcs,
    varied_services,
)
from kubernetes_asyncio import client

from tally.evaluators import GroupResource, calculate_quota_usage, new_registry
from tally.quota.quantity import Quantity, parse_quantity

PODS = GroupResource("", "pods")
SERVICES = GroupResource("", "services")
PVCS = GroupResource("", "persistentvolumeclaims")
CONFIGMAPS = GroupResource("", "configmaps")
SECRETS = GroupResource("", "secrets")
RESOURCEQUOTAS = GroupResource("", "resourcequotas")
ROLES = GroupResource("rbac.authorization.k8s.io", "roles")


def compare(
    quotas: Mapping[str, Mapping[str, Any]], objects: Mapping[GroupResource, list[dict[str, Any]]]
) -> None:
    """Assert that tally's usage equals upstream's status.used for every quota and name."""
    registry = new_registry()
    problems: list[str] = []
    for name in sorted(quotas):
        quota = quotas[name]
        upstream: dict[str, str] = quota["status"]["used"]
        ours: dict[str, Quantity] = calculate_quota_usage(quota, objects, registry)
        for key in sorted(set(upstream) | set(ours)):
            theirs = upstream.get(key)
            mine = ours.get(key)
            if theirs is None or mine is None or parse_quantity(theirs) != mine:
                problems.append(
                    f"  {describe(quota)}: {key}: upstream {theirs}, tally "
                    f"{None if mine is None else str(mine)}"
                )
    counts = {gr.resource: len(items) for gr, items in objects.items()}
    assert not problems, (
        f"tally's usage differs from upstream's status.used (objects: {counts}):\n"
        + "\n".join(problems)
    )


# -- pods -----------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def cluster_names(reference_api: client.ApiClient) -> AsyncIterator[ClusterNames]:
    async with cluster_objects(reference_api) as names:
        yield names


async def test_pod_usage_matches_upstream_for_every_scope(
    reference_api: client.ApiClient, reference_namespace: str, cluster_names: ClusterNames
) -> None:
    api, namespace = reference_api, reference_namespace
    core = client.CoreV1Api(api)
    try:
        await create_pods(api, namespace, cluster_names)
        await asyncio.sleep(PAST_DELETION_S)

        quotas = pod_quotas(cluster_names)
        for body in quotas:
            await core.create_namespaced_resource_quota(namespace, as_json(body))
        settled = await settled_quotas(api, namespace, len(quotas))

        pods = await raw_items(core.list_namespaced_pod(namespace, _preload_content=False))
        assert len(pods) == len(varied_pods(cluster_names))
        # Every quota matches some pod, so no comparison is between two empty sums.
        for name, item in settled.items():
            assert parse_quantity(item["status"]["used"]["pods"]) > parse_quantity("0"), name
        compare(settled, {PODS: pods})
    finally:
        await release_pods(api, namespace)


# -- services, PVCs, object counts ----------------------------------------------------------


async def test_service_pvc_and_object_count_usage_matches_upstream(
    reference_api: client.ApiClient, reference_namespace: str
) -> None:
    api, namespace = reference_api, reference_namespace
    core = client.CoreV1Api(api)
    (node_port,) = await free_node_ports(api, 1)
    await create_objects(api, namespace, node_port)

    quotas = object_quotas()
    for body in quotas:
        await core.create_namespaced_resource_quota(namespace, as_json(body))
    # Last, once the others are filled: a quota counting quotas charges every later one.
    await settled_quotas(api, namespace, len(quotas))
    await core.create_namespaced_resource_quota(namespace, as_json(quota_count_quota()))
    settled = await settled_quotas(api, namespace, len(quotas) + 1)

    rbac = client.RbacAuthorizationV1Api(api)
    objects = {
        SERVICES: await raw_items(core.list_namespaced_service(namespace, _preload_content=False)),
        PVCS: await raw_items(
            core.list_namespaced_persistent_volume_claim(namespace, _preload_content=False)
        ),
        CONFIGMAPS: await raw_items(
            core.list_namespaced_config_map(namespace, _preload_content=False)
        ),
        SECRETS: await raw_items(core.list_namespaced_secret(namespace, _preload_content=False)),
        RESOURCEQUOTAS: await raw_items(
            core.list_namespaced_resource_quota(namespace, _preload_content=False)
        ),
        PODS: await raw_items(core.list_namespaced_pod(namespace, _preload_content=False)),
        ROLES: await raw_items(rbac.list_namespaced_role(namespace, _preload_content=False)),
    }
    assert len(objects[SERVICES]) == len(varied_services(30000))
    assert len(objects[PVCS]) == len(varied_pvcs())
    compare(settled, objects)
