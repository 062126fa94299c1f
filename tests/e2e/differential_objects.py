"""Objects and quotas for the differential tests against upstream (reference mode).

In reference mode the real kube-controller-manager computes every ResourceQuota's
``status.used``: that is the oracle. The builders here make a varied set of objects (pods
exercising every part of the pod usage formula and every pod scope; services, PVCs, object
counts) and quota specs covering every evaluator and scope, and wait until upstream has filled
and settled the quotas' status. Two modules use them: ``test_differential_usage.py`` (tally's
usage function against upstream, one namespace) and ``test_clusterquota_differential.py``
(tally's ClusterQuota status over several namespaces against upstream).

Objects must be created before the quotas that count them: upstream's admission enforces quotas
in reference mode, and a quota whose status is not filled yet forbids every charged request
("status unknown").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Container,
    Iterable,
    Mapping,
)
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

import builders
from builders import pod, resource_quota
from tally_e2e import eventually, set_pod_status, wait_for_root_ca_configmap

IMAGE = "registry.example/app:1"
HOLD_FINALIZER = "example.com/hold"
# Generous: upstream's controller fills a new quota within a second or two.
FILL_WITHIN_S = 60.0
STABLE_AFTER_S = 1.0

# Every compute name the pod evaluator tracks, in the unscoped quota.
COMPUTE_NAMES = (
    "pods", "count/pods", "cpu", "memory", "ephemeral-storage",
    "requests.cpu", "limits.cpu", "requests.memory", "limits.memory",
    "requests.ephemeral-storage", "limits.ephemeral-storage",
    "hugepages-2Mi", "requests.hugepages-2Mi", "requests.example.com/dongle",
)  # fmt: skip
# What validation allows in a quota with a pod scope other than BestEffort (checked against
# v1.37.1: ephemeral-storage and hugepages names are refused as "unsupported scope applied to
# resource"; non-standard names such as count/pods and extended resources are allowed).
SCOPED_NAMES = (
    "pods", "count/pods", "cpu", "memory", "requests.cpu", "limits.cpu",
    "requests.memory", "limits.memory", "requests.example.com/dongle",
)  # fmt: skip
# A BestEffort quota may only track pods (plus the non-standard names validation lets through).
BEST_EFFORT_NAMES = ("pods", "count/pods", "requests.example.com/dongle")
# Names validation accepts but no evaluator measures: upstream never writes a used value.
UNTRACKED_NAMES = frozenset(
    {"limits.example.com/dongle", "limits.nvidia.com/gpu", "foo.example.com/bar",
     "requests.kubernetes.io/foo"}
)  # fmt: skip
LARGE = "100k"
MERGE_PATCH = "application/merge-patch+json"


def as_json(body: Mapping[str, Any]) -> Any:
    """``body`` as a client call's argument. The bodies here are plain JSON, and the generated
    client sends a dict as it is (every field kept, also those its models may not know yet);
    its type stubs name only the model classes."""
    return body


async def merge_patch(call: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """``call(*args)`` sent as a JSON merge patch (``_content_type`` goes through the generated
    method's ``**kwargs``, which its type stubs leave out)."""
    await call(*args, _content_type=MERGE_PATCH)


# -- objects --------------------------------------------------------------------------------


def resources(
    requests: Mapping[str, str] | None = None, limits: Mapping[str, str] | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if requests:
        result["requests"] = dict(requests)
    if limits:
        result["limits"] = dict(limits)
    return result


# Every container here carries ``resources``, ``{}`` when empty (builders.py).
container = functools.partial(builders.container, resources="always")


def affinity_term(**extra: Any) -> dict[str, Any]:
    return {
        "labelSelector": {"matchLabels": {"app": "db"}},
        "topologyKey": "kubernetes.io/hostname",
        **extra,
    }


@dataclass(frozen=True)
class ClusterNames:
    """Cluster-scoped objects of one test: unique names, deleted afterwards."""

    high: str
    low: str
    runtime_class: str
    node: str


async def raw_items(call: Awaitable[Any]) -> list[dict[str, Any]]:
    """The ``items`` of a list call made with ``_preload_content=False``, as stored."""
    response = await call
    items = json.loads(await response.read())["items"]
    assert isinstance(items, list)
    return items


async def read_quotas(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    core = client.CoreV1Api(api)
    items = await raw_items(core.list_namespaced_resource_quota(namespace, _preload_content=False))
    return {item["metadata"]["name"]: item for item in items}


def status_filled(quota: Mapping[str, Any]) -> bool:
    """Upstream has synced this quota: status.hard is spec.hard and every tracked name has a
    used value."""
    hard = quota["spec"]["hard"]
    status = quota.get("status") or {}
    used = status.get("used") or {}
    tracked = set(hard) - UNTRACKED_NAMES
    return status.get("hard") == hard and tracked <= set(used)


async def settled_quotas(
    api: client.ApiClient, namespace: str, expected: int
) -> dict[str, dict[str, Any]]:
    """The namespace's quotas once upstream has filled all ``expected`` of them and two reads
    ``STABLE_AFTER_S`` apart show the same ``status.used`` (upstream may still be catching up
    with informer events when it first writes)."""

    def filled(quotas: dict[str, dict[str, Any]]) -> bool:
        return len(quotas) == expected and all(status_filled(q) for q in quotas.values())

    def used(quotas: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {name: q["status"]["used"] for name, q in quotas.items()}

    loop = asyncio.get_running_loop()
    deadline = loop.time() + FILL_WITHIN_S
    previous = await eventually(
        lambda: read_quotas(api, namespace),
        until=filled,
        within=FILL_WITHIN_S,
        what=f"upstream to fill the status of {expected} quotas in {namespace}",
    )
    while True:
        await asyncio.sleep(STABLE_AFTER_S)
        current = await read_quotas(api, namespace)
        if filled(current) and used(current) == used(previous):
            return current
        assert loop.time() < deadline, (
            f"upstream's status.used did not settle within {FILL_WITHIN_S} s: "
            f"{used(previous)} then {used(current)}"
        )
        previous = current


def describe(quota: Mapping[str, Any]) -> str:
    spec = quota["spec"]
    scopes = spec.get("scopes") or []
    selector = (spec.get("scopeSelector") or {}).get("matchExpressions") or []
    return f"{quota['metadata']['name']} (scopes={scopes}, scopeSelector={selector})"


def large(names: Iterable[str]) -> dict[str, str]:
    """A quota's ``hard`` naming each of ``names`` at ``LARGE``: it counts, never refuses."""
    return dict.fromkeys(names, LARGE)


def priority(operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"scopeName": "PriorityClass", "operator": operator}
    if values:
        expression["values"] = list(values)
    return expression


def exists(scope: str) -> dict[str, Any]:
    return {"scopeName": scope, "operator": "Exists"}


# -- pods -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def cluster_objects(api: client.ApiClient) -> AsyncIterator[ClusterNames]:
    """Two PriorityClasses, a RuntimeClass with pod overhead and a Node, unique to the caller,
    deleted afterwards.

    The Node is only a name to bind a pod to (a bound pod is deleted gracefully); it exists so
    that the pod garbage collector does not remove the pod as an orphan.
    """
    suffix = uuid.uuid4().hex[:8]
    names = ClusterNames(
        high=f"tally-diff-high-{suffix}",
        low=f"tally-diff-low-{suffix}",
        runtime_class=f"tally-diff-{suffix}",
        node=f"tally-diff-{suffix}",
    )
    scheduling = client.SchedulingV1Api(api)
    node = client.NodeV1Api(api)
    try:
        await scheduling.create_priority_class(
            as_json({"metadata": {"name": names.high}, "value": 1000})
        )
        await scheduling.create_priority_class(
            as_json({"metadata": {"name": names.low}, "value": 10})
        )
        await node.create_runtime_class(
            as_json(
                {
                    "metadata": {"name": names.runtime_class},
                    "handler": "runc",
                    "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}},
                }
            )
        )
        await client.CoreV1Api(api).create_node(as_json({"metadata": {"name": names.node}}))
        yield names
    finally:
        deletes: list[Callable[[], Awaitable[object]]] = [
            lambda: client.CoreV1Api(api).delete_node(names.node),
            lambda: scheduling.delete_priority_class(names.high),
            lambda: scheduling.delete_priority_class(names.low),
            lambda: node.delete_runtime_class(names.runtime_class),
        ]
        for delete in deletes:
            with contextlib.suppress(client.ApiException):
                await delete()


def varied_pods(names: ClusterNames) -> list[dict[str, Any]]:
    """Pods exercising every part of the pod usage formula and every pod scope."""
    return [
        pod(
            "plain",
            containers=[
                container(
                    "a",
                    {"cpu": "250m", "memory": "64Mi", "ephemeral-storage": "1Gi"},
                    {"cpu": "500m", "memory": "128Mi", "ephemeral-storage": "2Gi"},
                ),
                container("b", {"cpu": "100m", "memory": "32M"}),
            ],
        ),
        # API defaulting copies the limits into the missing requests: Guaranteed.
        pod("limits-only", containers=[container("a", limits={"cpu": "300m", "memory": "100Mi"})]),
        # Init containers larger than the containers: the largest init container wins.
        pod(
            "init-larger",
            containers=[container("a", {"cpu": "100m", "memory": "64Mi"}, {"cpu": "200m"})],
            init=[
                container("i1", {"cpu": "1", "memory": "32Mi"}, {"cpu": "1"}),
                container("i2", {"cpu": "200m", "memory": "512Mi"}, {"memory": "1Gi"}),
            ],
        ),
        # Sidecars: s1 runs during i1 (700m), s1+s2+a run together (550m cpu, 310Mi memory).
        pod(
            "sidecars",
            containers=[
                container(
                    "a", {"cpu": "300m", "memory": "200Mi"}, {"cpu": "300m", "memory": "300Mi"}
                )
            ],
            init=[
                container(
                    "s1",
                    {"cpu": "200m", "memory": "100Mi"},
                    {"cpu": "400m"},
                    restart_policy="Always",
                ),
                container("i1", {"cpu": "500m", "memory": "50Mi"}),
                container(
                    "s2",
                    {"cpu": "50m", "memory": "10Mi", "ephemeral-storage": "100Mi"},
                    restart_policy="Always",
                ),
            ],
        ),
        # Pod-level resources replace cpu and memory; ephemeral-storage stays per container.
        pod(
            "pod-level",
            containers=[
                container("a", {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "500Mi"}),
                container("b"),
            ],
            spec={
                "resources": resources(
                    {"cpu": "500m", "memory": "256Mi"}, {"cpu": "1", "memory": "512Mi"}
                )
            },
        ),
        # Pod-level hugepages, plus the RuntimeClass overhead on top.
        pod(
            "pod-level-hugepages-overhead",
            containers=[
                container("a", {"cpu": "100m", "hugepages-2Mi": "2Mi"}, {"hugepages-2Mi": "2Mi"})
            ],
            spec={
                "resources": resources(
                    {"cpu": "300m", "memory": "128Mi", "hugepages-2Mi": "8Mi"},
                    {"cpu": "300m", "memory": "128Mi", "hugepages-2Mi": "8Mi"},
                ),
                "runtimeClassName": names.runtime_class,
            },
        ),
        # Overhead is added to every request, but only to limits that are set (cpu, not memory).
        pod(
            "overhead",
            containers=[container("a", {"cpu": "100m", "memory": "64Mi"}, {"cpu": "200m"})],
            spec={"runtimeClassName": names.runtime_class},
        ),
        pod(
            "hugepages-dongle",
            containers=[
                container(
                    "a",
                    {
                        "cpu": "100m",
                        "memory": "10Mi",
                        "hugepages-2Mi": "4Mi",
                        "example.com/dongle": "2",
                    },
                    {"memory": "10Mi", "hugepages-2Mi": "4Mi", "example.com/dongle": "2"},
                ),
                container(
                    "b", {"memory": "1G", "example.com/dongle": "1"}, {"example.com/dongle": "1"}
                ),
            ],
        ),
        pod("best-effort", containers=[container("a"), container("b")]),
        # Only cpu and memory decide QoS: still BestEffort.
        pod(
            "best-effort-dongle",
            containers=[container("a", {"example.com/dongle": "1"}, {"example.com/dongle": "1"})],
        ),
        pod("best-effort-ephemeral", containers=[container("a", {"ephemeral-storage": "3Gi"})]),
        pod(
            "terminating",
            containers=[container("a", {"cpu": "100m", "memory": "50Mi"})],
            active_deadline_seconds=600,
        ),
        pod("terminating-best-effort", containers=[container("a")], active_deadline_seconds=60),
        pod(
            "high",
            containers=[
                container(
                    "a", {"cpu": "100m", "memory": "100Mi"}, {"cpu": "100m", "memory": "100Mi"}
                )
            ],
            priority_class_name=names.high,
        ),
        pod("high-best-effort", containers=[container("a")], priority_class_name=names.high),
        pod(
            "low-terminating",
            containers=[container("a", {"cpu": "50m"})],
            priority_class_name=names.low,
            active_deadline_seconds=30,
        ),
        pod(
            "affinity-namespaces",
            containers=[container("a", {"cpu": "10m", "memory": "1Mi"})],
            spec={
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            affinity_term(namespaces=["elsewhere"])
                        ]
                    }
                }
            },
        ),
        pod(
            "anti-affinity-selector",
            containers=[container("a")],
            priority_class_name=names.high,
            spec={
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 10, "podAffinityTerm": affinity_term(namespaceSelector={})}
                        ]
                    }
                }
            },
        ),
        # Same-namespace affinity: not CrossNamespacePodAffinity.
        pod(
            "affinity-local",
            containers=[container("a", {"cpu": "20m"})],
            spec={
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [affinity_term()]
                    }
                }
            },
        ),
        # Terminal phases (status written below): only count/pods is charged.
        pod("succeeded", containers=[container("a", {"cpu": "1", "memory": "1Gi"})]),
        pod(
            "failed",
            containers=[container("a", {"cpu": "2"}, {"cpu": "2"})],
            priority_class_name=names.low,
        ),
        # Deleted while held by a finalizer: past its grace period (0 for an unscheduled pod).
        pod(
            "deleted",
            containers=[container("a", {"cpu": "3", "memory": "3Gi"})],
            active_deadline_seconds=100,
        ),
        # Bound to a node, so deleted with the default 30 s grace: still counts meanwhile.
        pod(
            "deleting",
            containers=[container("a", {"cpu": "400m", "memory": "400Mi"})],
            node_name=names.node,
            priority_class_name=names.high,
        ),
        # In-place resize: status values above the spec count (status written below).
        pod(
            "resized",
            containers=[
                container("a", {"cpu": "100m", "memory": "64Mi"}, {"cpu": "200m", "memory": "64Mi"})
            ],
        ),
        # A resize marked Infeasible: the actual and allocated values, not the spec.
        pod(
            "resize-infeasible",
            containers=[
                container("a", {"cpu": "2", "memory": "2Gi"}, {"cpu": "2", "memory": "2Gi"})
            ],
        ),
    ]


def container_status(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE,
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": "ContainerCreating"}},
        **extra,
    }


async def patch_pod_status(
    api: client.ApiClient, namespace: str, name: str, status: dict[str, Any]
) -> None:
    await merge_patch(
        client.CoreV1Api(api).patch_namespaced_pod_status, name, namespace, {"status": status}
    )


def pod_quotas(names: ClusterNames) -> list[dict[str, Any]]:
    """A quota per pod scope and operator, a few combinations, and an unscoped one."""
    return [
        resource_quota("all", large(COMPUTE_NAMES)),
        resource_quota("untracked", large(["pods", *sorted(UNTRACKED_NAMES)])),
        resource_quota("terminating", large(SCOPED_NAMES), scopes=["Terminating"]),
        resource_quota("not-terminating", large(SCOPED_NAMES), scopes=["NotTerminating"]),
        resource_quota("best-effort", large(BEST_EFFORT_NAMES), scopes=["BestEffort"]),
        resource_quota("not-best-effort", large(SCOPED_NAMES), scopes=["NotBestEffort"]),
        resource_quota(
            "priority-in", large(SCOPED_NAMES), scope_selector=[priority("In", names.high)]
        ),
        resource_quota(
            "priority-in-both",
            large(SCOPED_NAMES),
            scope_selector=[priority("In", names.high, names.low)],
        ),
        resource_quota(
            "priority-not-in", large(SCOPED_NAMES), scope_selector=[priority("NotIn", names.high)]
        ),
        resource_quota("priority-exists", large(SCOPED_NAMES), scope_selector=[priority("Exists")]),
        resource_quota(
            "priority-does-not-exist",
            large(SCOPED_NAMES),
            scope_selector=[priority("DoesNotExist")],
        ),
        resource_quota(
            "cross-namespace", large(SCOPED_NAMES), scopes=["CrossNamespacePodAffinity"]
        ),
        resource_quota(
            "cross-namespace-selector",
            large(SCOPED_NAMES),
            scope_selector=[exists("CrossNamespacePodAffinity")],
        ),
        resource_quota(
            "terminating-low",
            large(SCOPED_NAMES),
            scope_selector=[exists("Terminating"), priority("In", names.low)],
        ),
        resource_quota(
            "not-best-effort-not-low",
            large(SCOPED_NAMES),
            scopes=["NotBestEffort"],
            scope_selector=[priority("NotIn", names.low)],
        ),
        resource_quota(
            "best-effort-high",
            large(BEST_EFFORT_NAMES),
            scopes=["BestEffort"],
            scope_selector=[priority("In", names.high)],
        ),
    ]


PAST_DELETION_S = 1.1
"""How long to wait after :func:`create_pods` before any quota counts its pods: strictly past
the ``deleted`` pod's deletionTimestamp + 0 (a timestamp of whole seconds) for both sides."""
DELETING_COUNTS_FOR_S = 60.0
"""How long after its deletion the ``deleting`` pod still counts: upstream charges a pod until
deletionTimestamp + grace period, and deletionTimestamp is itself the deletion + 30 s."""


async def create_pods(
    api: client.ApiClient,
    namespace: str,
    names: ClusterNames,
    only: Container[str] | None = None,
) -> int:
    """Create :func:`varied_pods` (those named in ``only``, or all) in ``namespace`` and give
    them what makes them interesting: terminal phases, resized status, a deletion held by a
    finalizer (``deleted``), a graceful deletion under way (``deleting``). Returns how many
    pods it created. Call :func:`release_pods` afterwards, and wait ``PAST_DELETION_S`` before
    creating quotas."""
    core = client.CoreV1Api(api)
    bodies = [b for b in varied_pods(names) if only is None or b["metadata"]["name"] in only]
    created = {body["metadata"]["name"] for body in bodies}
    for body in bodies:
        # Their statuses are what this function writes (terminal phases, resizes), and each
        # deletion's grace is the API server's for an unbound pod: no node runs them.
        body["spec"].setdefault("schedulerName", builders.NO_SCHEDULER)
        if body["metadata"]["name"] == "deleted":
            body["metadata"]["finalizers"] = [HOLD_FINALIZER]
        await core.create_namespaced_pod(namespace, as_json(body))

    if "succeeded" in created:
        await set_pod_status(api, namespace, "succeeded", phase="Succeeded", ready=False)
    if "failed" in created:
        await set_pod_status(api, namespace, "failed", phase="Failed", ready=False)
    # What a kubelet writes after an in-place resize; the values counted are in
    # varied_pods' comments.
    resize_statuses = {
        "resized": {
            "containerStatuses": [container_status(
                "a",
                allocatedResources={"cpu": "150m", "memory": "128Mi"},
                resources={"requests": {"cpu": "300m", "memory": "32Mi"},
                           "limits": {"cpu": "400m", "memory": "64Mi"}},
            )],
        },
        "resize-infeasible": {
            "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible",
                            "message": "Node didn't have enough capacity"}],
            "containerStatuses": [container_status(
                "a",
                allocatedResources={"cpu": "500m", "memory": "512Mi"},
                resources={"requests": {"cpu": "500m", "memory": "512Mi"},
                           "limits": {"cpu": "1", "memory": "512Mi"}},
            )],
        },
    }  # fmt: skip
    for name, status in resize_statuses.items():
        if name in created:
            await patch_pod_status(api, namespace, name, status)
    if "deleted" in created:
        await core.delete_namespaced_pod("deleted", namespace)
        deleted = await core.read_namespaced_pod("deleted", namespace)
        assert deleted.metadata.deletion_timestamp is not None
        assert deleted.metadata.deletion_grace_period_seconds == 0
    if "deleting" in created:
        await core.delete_namespaced_pod("deleting", namespace)
        deleting = await core.read_namespaced_pod("deleting", namespace)
        assert deleting.metadata.deletion_grace_period_seconds == 30
    return len(bodies)


async def release_pods(api: client.ApiClient, namespace: str) -> None:
    """Let :func:`create_pods`' pods go, so that the namespace can be deleted: no kubelet
    confirms the graceful deletion (forced here) and the finalizer holds ``deleted``."""
    core = client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        await core.delete_namespaced_pod("deleting", namespace, grace_period_seconds=0)
    with contextlib.suppress(client.ApiException):
        await merge_patch(
            core.patch_namespaced_pod, "deleted", namespace, {"metadata": {"finalizers": None}}
        )


# -- services, PVCs, object counts ----------------------------------------------------------


def varied_services(node_port: int) -> list[dict[str, Any]]:
    def service(name: str, **spec: Any) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": spec}

    def ports(*numbers: int, **extra: Any) -> list[dict[str, Any]]:
        return [{"name": f"p{n}", "port": n, **extra} for n in numbers]

    return [
        service("cluster-ip", ports=ports(80, 443)),
        service("headless", clusterIP="None", ports=ports(80)),
        service("node-port", type="NodePort", ports=ports(80, 81, 82)),
        service("load-balancer", type="LoadBalancer", ports=ports(80, 443)),
        # No node ports allocated: only the explicit one counts.
        service("load-balancer-no-node-ports", type="LoadBalancer",
                allocateLoadBalancerNodePorts=False,
                ports=[{"name": "a", "port": 80, "nodePort": node_port},
                       {"name": "b", "port": 81}, {"name": "c", "port": 82}]),
        service("load-balancer-none", type="LoadBalancer", allocateLoadBalancerNodePorts=False,
                ports=ports(8080)),
        service("external-name", type="ExternalName", externalName="db.example.com"),
    ]  # fmt: skip


def varied_pvcs() -> list[dict[str, Any]]:
    beta = "volume.beta.kubernetes.io/storage-class"

    def pvc(
        name: str,
        storage: str,
        *,
        annotations: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name}
        if annotations:
            metadata["annotations"] = dict(annotations)
        return {
            "metadata": metadata,
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": storage}}, **spec},
        }  # fmt: skip

    return [
        pvc("gold", "1Gi", storageClassName="gold"),
        pvc("gold-decimal", "2G", storageClassName="gold"),
        # The beta annotation wins over spec.storageClassName.
        pvc("beta-wins", "3Gi", annotations={beta: "silver"}, storageClassName="gold"),
        pvc("beta-only", "1.5Gi", annotations={beta: "gold"}),
        pvc("no-class", "500Mi"),
        pvc("empty-class", "100Mi", storageClassName=""),
        # Accepted with a warning (fractional bytes): charged rounded up to whole bytes.
        pvc("fractional-bytes", "1500m", storageClassName="gold"),
        # status.allocatedResources above the request (written below) is what counts.
        pvc("expanded", "1Gi", storageClassName="silver"),
        pvc("attributes-fast", "4Gi", storageClassName="gold", volumeAttributesClassName="fast"),
        pvc("attributes-slow", "5Gi", volumeAttributesClassName="slow"),
    ]  # fmt: skip


def object_quotas() -> list[dict[str, Any]]:
    storage = ("persistentvolumeclaims", "count/persistentvolumeclaims", "requests.storage")

    def per_class(*classes: str) -> list[str]:
        return [
            f"{sc}.storageclass.storage.k8s.io/{name}"
            for sc in classes
            for name in ("requests.storage", "persistentvolumeclaims")
        ]

    def attributes(operator: str, *values: str) -> dict[str, Any]:
        expression: dict[str, Any] = {"scopeName": "VolumeAttributesClass", "operator": operator}
        if values:
            expression["values"] = list(values)
        return expression

    return [
        resource_quota(
            "services",
            large(["services", "count/services", "services.nodeports", "services.loadbalancers"]),
        ),
        resource_quota("storage", large([*storage, *per_class("gold", "silver", "bronze")])),
        resource_quota(
            "attributes-in",
            large([*storage, *per_class("gold")]),
            scope_selector=[attributes("In", "fast")],
        ),
        resource_quota(
            "attributes-not-in",
            large([*storage, *per_class("gold")]),
            scope_selector=[attributes("NotIn", "fast")],
        ),
        resource_quota("attributes-exists", large(storage), scope_selector=[attributes("Exists")]),
        resource_quota(
            "attributes-does-not-exist", large(storage), scope_selector=[attributes("DoesNotExist")]
        ),
        resource_quota(
            "objects",
            large(
                [
                    "configmaps",
                    "count/configmaps",
                    "secrets",
                    "count/secrets",
                    "count/roles.rbac.authorization.k8s.io",
                ]
            ),
        ),
        resource_quota(
            "everything",
            large(
                [
                    "services",
                    "services.nodeports",
                    "persistentvolumeclaims",
                    "requests.storage",
                    "configmaps",
                    "secrets",
                    "pods",
                    "requests.cpu",
                ]
            ),
        ),
    ]


def quota_count_quota() -> dict[str, Any]:
    """A quota counting quotas: create it last, since it charges every quota created after it
    (and upstream refuses those while its status is unknown)."""
    return resource_quota("quotas", large(["resourcequotas", "count/resourcequotas"]))


async def free_node_ports(api: client.ApiClient, count: int) -> list[int]:
    """``count`` distinct node ports that no service holds, for explicit use (a node port is
    cluster-wide, and services of other tests' namespaces may still be being deleted). From
    the lower band of the default range (30000-32767): the API server's static subrange (86
    ports for this range), which it allocates from itself only once the rest is full, so that
    a port it allocates meanwhile does not take one of these. Random, so that concurrent
    callers rarely pick the same."""
    services = await client.CoreV1Api(api).list_service_for_all_namespaces()
    held = {
        port.node_port
        for service in services.items
        for port in service.spec.ports or []
        if port.node_port
    }
    return random.sample(sorted(set(range(30000, 30086)) - held), count)


async def create_objects(
    api: client.ApiClient,
    namespace: str,
    node_port: int,
    only: Container[str] | None = None,
) -> None:
    """Create :func:`varied_services` (with ``node_port`` as the explicit node port),
    :func:`varied_pvcs`, configmaps ``a`` and ``b``, secret ``s``, role ``reader`` and pod
    ``p`` (those named in ``only``, or all) in ``namespace``; return once kube-root-ca.crt is
    there too.

    kube-controller-manager publishes kube-root-ca.crt; it must exist before the configmap
    quotas, or its creation would be charged against (or refused by) them."""
    core = client.CoreV1Api(api)

    def wanted(body: Mapping[str, Any]) -> bool:
        return only is None or body["metadata"]["name"] in only

    for body in filter(wanted, varied_services(node_port)):
        await core.create_namespaced_service(namespace, as_json(body))
    for body in filter(wanted, varied_pvcs()):
        await core.create_namespaced_persistent_volume_claim(namespace, as_json(body))
    if only is None or "expanded" in only:
        await merge_patch(
            core.patch_namespaced_persistent_volume_claim_status,
            "expanded",
            namespace,
            {"status": {"allocatedResources": {"storage": "2Gi"}}},
        )
    for body in filter(wanted, [{"metadata": {"name": name}} for name in ("a", "b")]):
        await core.create_namespaced_config_map(namespace, as_json(body))
    for body in filter(wanted, [{"metadata": {"name": "s"}}]):
        await core.create_namespaced_secret(namespace, as_json(body))
    for body in filter(wanted, [{"metadata": {"name": "reader"}, "rules": []}]):
        await client.RbacAuthorizationV1Api(api).create_namespaced_role(namespace, as_json(body))
    for body in filter(wanted, [pod("p", containers=[container("a", {"cpu": "10m"})])]):
        await core.create_namespaced_pod(namespace, as_json(body))
    await wait_for_root_ca_configmap(api, namespace)
