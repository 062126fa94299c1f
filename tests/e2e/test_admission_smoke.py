"""Quota admission through tally's webhook on the real control plane (operator mode).

Expected messages and codes are upstream's; the differential suite proves them side
by side with reference mode.
"""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client

from tally_e2e import RunningOperator, eventually

DENIED = 'admission webhook "quota.tally.dev" denied the request: '


async def _used(api: client.ApiClient, namespace: str, name: str) -> dict[str, str]:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota(name, namespace)
    return dict((api.sanitize_for_serialization(quota).get("status") or {}).get("used") or {})


async def test_creates_past_the_limit_are_denied_with_upstreams_words(
    operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "objects"}, "spec": {"hard": {"configmaps": "3"}}}
    )
    # kube-root-ca.crt already counts.
    await eventually(
        lambda: _used(api, namespace, "objects"),
        until=lambda used: used == {"configmaps": "1"},
        within=5,
        what="usage computed",
    )
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": "a"}})
    assert await _used(api, namespace, "objects") == {"configmaps": "2"}  # reserved at once
    await core.create_namespaced_config_map(namespace, {"metadata": {"name": "b"}})
    with pytest.raises(client.ApiException) as denied:
        await core.create_namespaced_config_map(namespace, {"metadata": {"name": "c"}})
    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    assert message == DENIED + (
        "exceeded quota: objects, requested: configmaps=1, used: configmaps=3, "
        "limited: configmaps=3"
    )
    assert await _used(api, namespace, "objects") == {"configmaps": "3"}


async def test_dry_run_is_judged_and_never_charged(
    operator: RunningOperator, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "q"}, "spec": {"hard": {"secrets": "1"}}}
    )
    await eventually(
        lambda: _used(api, namespace, "q"),
        until=lambda used: used == {"secrets": "0"},
        within=5,
        what="usage computed",
    )
    await core.create_namespaced_secret(namespace, {"metadata": {"name": "a"}}, dry_run="All")
    assert await _used(api, namespace, "q") == {"secrets": "0"}
    await core.create_namespaced_secret(namespace, {"metadata": {"name": "a"}})
    with pytest.raises(client.ApiException) as denied:
        await core.create_namespaced_secret(namespace, {"metadata": {"name": "b"}}, dry_run="All")
    assert denied.value.status == 403
    assert await _used(api, namespace, "q") == {"secrets": "1"}
