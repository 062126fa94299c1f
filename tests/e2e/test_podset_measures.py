"""PodSet measures on the real control plane: a ClusterQuota capping what PodSets may scale to.

A ClusterQuota naming ``podsets.tally.dev/requests.cpu`` measures every selected PodSet as its
template's cpu request times its replicas. ``kubectl scale`` past the limit is refused at the
scale itself, in upstream's words with the numbers; a scale that fits is admitted; a template
edit is charged by its growth; create, update and delete move the status; and concurrent scale
requests across namespaces never admit past the limit.

Expected numbers are worked out by hand: a template requesting 250m cpu at 50 replicas is
12500m; growing from 2 replicas (500m) charges the difference, 12 cpus. In the concurrency
test every scale charges 200m against 4 cpus, so at most 20 of the 50 fit, and a refusal only
ever sees the quota full (3800m + 200m still fits). Fewer than 20 may be admitted in the
burst: the API server judges every try of an update, and a try that loses to another write
(the PodSet controller's status writes) is judged and charged again; that charge is given back
when the update is seen, and the refused scales tried again fill the quota to exactly 20.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

import pytest
from clusterquota_e2e import (
    MERGE_PATCH,
    Team,
    exceeded_cluster_quota,
    total_used,
    used_by_namespace,
)
from kubernetes_asyncio import client
from podset_e2e import install_podset_crd

import builders
from tally_e2e import ControlPlane, eventually

pytest_plugins = ["clusterquota_e2e"]

CPU: Final = "podsets.tally.dev/requests.cpu"
GROUP, VERSION, PLURAL = "tally.dev", "v1alpha1", "podsets"


@pytest.fixture(scope="module", autouse=True)
def podset_crd(control_plane: ControlPlane) -> None:
    install_podset_crd(control_plane)


def podset(name: str, replicas: int, cpu: str) -> dict[str, Any]:
    return builders.podset(name, replicas, containers=[builders.container("a", {"cpu": cpu})])


async def create_podset(team: Team, namespace: str, name: str, replicas: int, cpu: str) -> None:
    await team.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, podset(name, replicas, cpu)
    )


async def scale_patch(team: Team, namespace: str, name: str, replicas: int) -> str | None:
    """Merge-patch the PodSet's scale subresource; None if admitted, else the 403's message."""
    patch: Callable[..., Awaitable[Any]] = team.custom.patch_namespaced_custom_object_scale
    try:
        await patch(GROUP, VERSION, namespace, PLURAL, name, {"spec": {"replicas": replicas}},
                    _content_type=MERGE_PATCH)  # fmt: skip
    except client.ApiException as error:
        if error.status != 403 or error.body is None:
            raise
        return str(json.loads(error.body)["message"])
    return None


async def replicas(team: Team, namespace: str, name: str) -> int:
    obj = await team.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return int(obj["spec"]["replicas"])


async def measure_enforced(plane: ControlPlane, namespace: str, name: str) -> None:
    """Until a server-side dry-run scale far past any limit is refused: the webhook's rules
    for podsets/scale are registered and in force (a dry run is judged, never charged)."""

    def refused() -> bool:
        result = plane.kubectl(
            "scale", "podset", name, "-n", namespace, "--replicas=100000", "--dry-run=server",
            check=False,
        )  # fmt: skip
        return result.returncode != 0 and "exceeded cluster quota" in result.stderr

    await eventually(lambda: asyncio.to_thread(refused), until=bool, within=30, what="scale judged")


async def test_kubectl_scale_past_the_limit_is_refused_and_usage_follows_podsets(
    team: Team, control_plane: ControlPlane
) -> None:
    web_ns, db_ns = await team.member_namespaces(2)
    name = await team.cluster_quota({CPU: "4"})
    await create_podset(team, web_ns, "web", 2, "250m")

    async def status() -> dict[str, Any]:
        return await team.status(name)

    await eventually(status, until=lambda s: total_used(s) == {CPU: "500m"}, what="500m")
    await measure_enforced(control_plane, web_ns, "web")

    refused = await asyncio.to_thread(
        control_plane.kubectl,
        "scale", "podset", "web", "-n", web_ns, "--replicas=50", check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert exceeded_cluster_quota(name, f"{CPU}=12", f"{CPU}=500m", f"{CPU}=4") in (
        refused.stderr
    ), refused.stderr
    assert 2 == await replicas(team, web_ns, "web")

    # 16 x 250m is exactly 4: admitted.
    await asyncio.to_thread(
        control_plane.kubectl, "scale", "podset", "web", "-n", web_ns, "--replicas=16"
    )
    await eventually(status, until=lambda s: total_used(s) == {CPU: "4"}, what="4 cpus")

    # A template edit is charged by its growth: 16 x 50m.
    edit: Callable[..., Awaitable[Any]] = team.custom.patch_namespaced_custom_object
    grown = podset("web", 16, "300m")
    with pytest.raises(client.ApiException) as denied:
        await edit(GROUP, VERSION, web_ns, PLURAL, "web", {"spec": grown["spec"]},
                   _content_type=MERGE_PATCH)  # fmt: skip
    assert 403 == denied.value.status
    assert (
        exceeded_cluster_quota(name, f"{CPU}=800m", f"{CPU}=4", f"{CPU}=4")
        == (json.loads(denied.value.body)["message"])
    )

    # Shrinking is free and gives back at once; another namespace's PodSet joins the total.
    assert await scale_patch(team, web_ns, "web", 4) is None
    await eventually(status, until=lambda s: total_used(s) == {CPU: "1"}, what="1 cpu")
    await create_podset(team, db_ns, "db", 3, "1")
    result = await eventually(status, until=lambda s: total_used(s) == {CPU: "4"}, what="4")
    assert {web_ns: {CPU: "1"}, db_ns: {CPU: "3"}} == used_by_namespace(result)

    # Deleted: its usage leaves the status.
    await team.custom.delete_namespaced_custom_object(GROUP, VERSION, web_ns, PLURAL, "web")
    result = await eventually(status, until=lambda s: total_used(s) == {CPU: "3"}, what="3")
    assert {db_ns: {CPU: "3"}} == used_by_namespace(result)


async def test_concurrent_scales_across_namespaces_never_over_admit(
    team: Team, control_plane: ControlPlane
) -> None:
    namespaces = await team.member_namespaces(10)
    name = await team.cluster_quota({CPU: "4"})
    targets = [(namespace, f"p{index}") for namespace in namespaces for index in range(5)]
    await asyncio.gather(*(create_podset(team, ns, ps, 0, "100m") for ns, ps in targets))
    await eventually(
        lambda: team.status(name), until=lambda s: total_used(s) == {CPU: "0"}, what="0"
    )
    await measure_enforced(control_plane, *targets[0])
    full = exceeded_cluster_quota(name, f"{CPU}=200m", f"{CPU}=4", f"{CPU}=4")

    outcomes = await asyncio.gather(*(scale_patch(team, ns, ps, 2) for ns, ps in targets))
    scaled = [await replicas(team, ns, ps) for ns, ps in targets]
    admitted = sum(1 for r in scaled if r == 2)
    # Never past the limit; every refusal is the quota's (403, upstream's words, a full quota).
    assert admitted <= 20, scaled
    assert [r == 2 for r in scaled] == [o is None for o in outcomes]
    assert all(o == full for o in outcomes if o is not None), set(outcomes)
    # The status is the truth again at once: a try the API server judged but did not store
    # (it lost to the PodSet controller's status write and was judged again) is given back
    # when the update is seen, not at the next resync.
    truth = f"{admitted * 200}m" if admitted % 5 else str(admitted // 5)
    await eventually(
        lambda: team.status(name), until=lambda s: total_used(s) == {CPU: truth}, what=truth
    )
    # So the quota is not left short: the refused scales, tried again one at a time, fill it
    # to exactly 4 cpus and no further.
    again = [
        await scale_patch(team, ns, ps, 2)
        for (ns, ps), outcome in zip(targets, outcomes, strict=True)
        if outcome is not None
    ]
    assert 20 - admitted == sum(1 for o in again if o is None), again
    assert all(o == full for o in again if o is not None), set(again)
    assert 40 == sum([await replicas(team, ns, ps) for ns, ps in targets])
    await eventually(
        lambda: team.status(name), until=lambda s: total_used(s) == {CPU: "4"}, what="4"
    )
