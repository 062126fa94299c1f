"""The local control plane itself: both modes behave as upstream configures them.

Reference mode runs upstream's quota system; operator mode has it switched off so that tally
is the only quota system. No tally runs in this module (the ``operator`` fixture is per
module), so what operator mode shows here is the control plane alone.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from kubernetes_asyncio import client

import cluster
from builders import NO_SCHEDULER
from tally_e2e import ControlPlane, eventually, set_pod_status

QUOTA = {
    "metadata": {"name": "objects"},
    "spec": {"hard": {"configmaps": "2", "pods": "10", "requests.cpu": "1"}},
}
POD = {
    "metadata": {"name": "web"},
    "spec": {
        "schedulerName": NO_SCHEDULER,  # unbound: the test writes its status
        "containers": [
            {"name": "app", "image": "registry.example/app:1",
             "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
            {"name": "sidecar", "image": "registry.example/sidecar:1"},
        ]
    },
}  # fmt: skip


async def _quota_status(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota("objects", namespace)
    return dict(api.sanitize_for_serialization(quota).get("status") or {})


def test_control_plane_runs_the_pinned_version(control_plane: ControlPlane) -> None:
    version = control_plane.kubectl("version", "-o", "json").stdout
    assert f'"gitVersion": "{cluster.kubernetes_version()}"' in version
    namespaces = control_plane.kubectl("get", "ns", "-o", "name").stdout.split()
    assert "namespace/default" in namespaces


async def test_reference_mode_computes_quota_usage(
    reference_api: client.ApiClient, reference_namespace: str
) -> None:
    core = client.CoreV1Api(reference_api)
    await core.create_namespaced_config_map(reference_namespace, {"metadata": {"name": "one"}})
    await core.create_namespaced_resource_quota(reference_namespace, QUOTA)
    # Upstream's controller fills status promptly (e2e "should create a ResourceQuota and
    # ensure its status is promptly calculated"): the configmap counts, as does the namespace's
    # kube-root-ca.crt configmap that kube-controller-manager publishes.
    status = await eventually(
        lambda: _quota_status(reference_api, reference_namespace),
        until=lambda s: s.get("used", {}).get("configmaps") == "2",
        within=20,
        what="upstream to fill status.used",
    )
    assert status["hard"] == {"configmaps": "2", "pods": "10", "requests.cpu": "1"}
    assert status["used"]["pods"] == "0"
    assert status["used"]["requests.cpu"] == "0"
    # Upstream admission now denies a third configmap with upstream's words.
    with pytest.raises(client.ApiException) as denied:
        await core.create_namespaced_config_map(reference_namespace, {"metadata": {"name": "x"}})
    assert denied.value.status == 403
    assert (
        "exceeded quota: objects, requested: configmaps=1, used: configmaps=2, "
        "limited: configmaps=2" in denied.value.body
    )


async def test_operator_mode_has_no_upstream_quota(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(namespace, QUOTA)
    # With upstream's controller off nothing fills the status, and with its admission plugin
    # off a quota whose status says it is full does not stop a create.
    await core.replace_namespaced_resource_quota_status(
        "objects",
        namespace,
        {
            "metadata": {"name": "objects", "namespace": namespace},
            "spec": QUOTA["spec"],
            "status": {"hard": {"configmaps": "2"}, "used": {"configmaps": "2"}},
        },
    )
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": "past-the-limit"}})
    # Give a (wrongly enabled) upstream controller well over its reaction time to recompute.
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=5)
    while datetime.datetime.now() < deadline:
        assert await _quota_status(api, namespace) == {
            "hard": {"configmaps": "2"},
            "used": {"configmaps": "2"},
        }
        await asyncio.sleep(0.5)


async def test_set_pod_status_stands_in_for_the_kubelet(
    api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(namespace, POD)
    since = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    stored = await set_pod_status(api, namespace, "web", since=since, restart_counts=[0, 3])
    assert stored["status"]["phase"] == "Running"
    ready = {c["type"]: c for c in stored["status"]["conditions"]}["Ready"]
    assert ready["status"] == "True"
    assert ready["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    restarts = {s["name"]: s["restartCount"] for s in stored["status"]["containerStatuses"]}
    assert restarts == {"app": 0, "sidecar": 3}

    stored = await set_pod_status(api, namespace, "web", phase="Running", ready=False)
    ready = {c["type"]: c for c in stored["status"]["conditions"]}["Ready"]
    assert ready["status"] == "False"
