"""Creations that quota admission did not charge are counted by the usage controller.

Upstream's controller recalculates only on deletes and usage-lowering updates: its admission
plugin, inside the API server, charged every creation. tally's webhook charges nothing before
its configuration is registered (and in force in the API server), nor with
``TALLY_WEBHOOK_ENABLED=false``, nor for a ``count/`` resource whose rule is new. Found with
``make run``: the example PodSet's pods, created by tally's own PodSet controller in the
~100 ms between its start and the webhook's registration, were never counted (``pods: 0/5``
with 3 pods) until the 5-minute resync, and admission then let 5 more in: 8 pods under
``pods: 5``.

These tests run their own tally (no ``operator`` fixture: one tally per control plane).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from operator_process import TallyProcess
from podset_e2e import PODSET, install_podset_crd

from builders import pod
from tally_e2e import ControlPlane, eventually


async def _used(api: client.ApiClient, namespace: str, name: str = "q") -> dict[str, Any]:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota(name, namespace)
    return dict((quota.status.used or {}) if quota.status else {})


async def test_creations_count_when_the_webhook_is_off(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    # Usage only: nobody charges creations, so each one must trigger a recalculation.
    tally = TallyProcess(
        control_plane.kubeconfig,
        tmp_path / "tally.log",
        bin_dir=control_plane.bin_dir,
        env={"TALLY_WEBHOOK_ENABLED": "false"},
    )
    tally.start()
    try:
        core = client.CoreV1Api(api)
        await core.create_namespaced_resource_quota(
            namespace,
            {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "10", "count/secrets": "10"}}},
        )
        await eventually(
            lambda: _used(api, namespace),
            until=lambda used: used == {"pods": "0", "count/secrets": "0"},
            within=5,
            what="the quota's first usage",
        )
        for index in range(3):
            await core.create_namespaced_pod(namespace, pod(f"p{index}"))
        await core.create_namespaced_secret(namespace, {"metadata": {"name": "s"}})
        # Within seconds, not at the next full resync (5 minutes).
        await eventually(
            lambda: _used(api, namespace),
            until=lambda used: used == {"pods": "3", "count/secrets": "1"},
            within=5,
            what="usage counting the creations",
        )
    finally:
        tally.stop()


async def test_pods_created_before_the_webhook_is_registered_are_counted(
    control_plane: ControlPlane, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    # The `make run` scenario: a quota and a PodSet exist before tally starts; tally's PodSet
    # controller creates the pods as soon as it starts, before its webhook is registered.
    install_podset_crd(control_plane)
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "5"}}}
    )
    await PODSET.create(api, namespace, "web", 3)
    tally = TallyProcess(control_plane.kubeconfig, tmp_path / "tally.log",
                         bin_dir=control_plane.bin_dir)  # fmt: skip
    tally.start()
    try:
        await eventually(
            lambda: PODSET.owned_pods(api, namespace, "web"),
            until=lambda pods: len(pods) == 3,
            within=10,
            what="the PodSet's 3 pods",
        )
        await eventually(
            lambda: _used(api, namespace),
            until=lambda used: used == {"pods": "3"},
            within=5,
            what="usage counting the PodSet's pods",
        )
        # Past the quota: exactly 5 pods, never more, and the quota says 5.
        await PODSET.scale(api, namespace, "web", 10)
        await eventually(
            lambda: PODSET.get(api, namespace, "web"),
            until=lambda podset: any(
                c.get("type") == "ReplicaFailure" and c.get("status") == "True"
                for c in (podset.get("status") or {}).get("conditions") or []
            ),
            within=15,
            what="ReplicaFailure on the PodSet",
        )
        pods = await core.list_namespaced_pod(namespace)
        assert 5 == len(pods.items)
        assert {"pods": "5"} == await _used(api, namespace)
    finally:
        tally.stop()
