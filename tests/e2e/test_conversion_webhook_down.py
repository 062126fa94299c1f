"""A kind the API server cannot list (its conversion webhook is down) stalls only the quotas
that count it, and those say why.

A CRD serves ``v1`` (its storage version) and ``v2``, converted by a webhook that does not
answer (nothing listens where it points). Its objects, created at ``v1``, cannot be listed at
``v2``, the group's preferred version, which is the one a quota's ``count/<r>.<g>`` makes tally
read. Upstream's resourcequota controller waits for every monitor it starts to sync, so one such
kind stalls replenishment for every quota in the cluster (kubernetes#96066). tally must keep
counting every other quota (and the other names of the quota that counts the kind), and say on
the quota that counts it why it does not: a Warning Event with reason ``FailedList`` naming the
error, and ``tally_uncounted_resource{resource, reason="FailedList"}``. Once the conversion
works again (the CRD's conversion set to ``None``), the kind is counted.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from tally_e2e import ControlPlane, RunningOperator, eventually, wait_for_default_service_account

REPORTED_WITHIN_S: Final = 60.0
"""Three failed LISTs (1 + 2 + 4 s of backoff), then the next pass of the dynamic kinds and
the Event's write; generous."""
IMAGE: Final = "registry.example/app:1"


@pytest.fixture(scope="module")
def group() -> str:
    return f"conv-{uuid.uuid4().hex[:6]}.example.com"


@pytest.fixture(scope="module")
def broken_crd(control_plane: ControlPlane, group: str) -> Iterator[str]:
    """The CRD, its conversion webhook pointing where nothing listens; ``convs.<group>``."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"convs.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": "Conv", "plural": "convs", "singular": "conv"},
            "scope": "Namespaced",
            "conversion": {
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": "https://127.0.0.1:1/convert"},
                },
            },
            "versions": [
                {"name": version, "served": True, "storage": version == "v1",
                 "schema": {"openAPIV3Schema": {"type": "object",
                                                "x-kubernetes-preserve-unknown-fields": True}}}
                for version in ("v1", "v2")
            ],
        },
    }  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(crd))
    control_plane.kubectl(
        "wait", "--for=condition=Established", f"crd/convs.{group}", "--timeout=60s"
    )
    try:
        yield f"convs.{group}"
    finally:
        control_plane.kubectl("delete", "crd", f"convs.{group}", "--wait=false", check=False)


@pytest_asyncio.fixture
async def other_namespace(api: client.ApiClient) -> AsyncIterator[str]:
    core = client.CoreV1Api(api)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    await core.create_namespace({"metadata": {"name": name}})
    await wait_for_default_service_account(api, name)
    yield name
    await core.delete_namespace(name)


async def _used(api: client.ApiClient, namespace: str, name: str) -> dict[str, str]:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota(name, namespace)
    return dict((api.sanitize_for_serialization(quota).get("status") or {}).get("used") or {})


def _uncounted(operator: RunningOperator) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(operator.metrics_url, timeout=5) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("tally_uncounted_resource{"):
            labels, value = line.rsplit(" ", 1)
            pairs = dict(
                part.split("=", 1) for part in labels[labels.index("{") + 1 : -1].split(",")
            )
            found[(pairs["resource"].strip('"'), pairs["reason"].strip('"'))] = float(value)
    return found


async def test_only_the_quota_counting_the_kind_waits_and_it_says_why(
    operator: RunningOperator,
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    other_namespace: str,
    broken_crd: str,
    group: str,
) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    for index in range(3):
        body: Any = {"apiVersion": f"{group}/v1", "kind": "Conv", "metadata": {"name": f"c{index}"}}
        await custom.create_namespaced_custom_object(group, "v1", namespace, "convs", body)
    quotas = {
        (namespace, "broken"): {f"count/{broken_crd}": "10", "pods": "10"},
        (namespace, "fine"): {"pods": "10"},
        (other_namespace, "other"): {"pods": "10"},
    }
    for (where, name), hard in quotas.items():
        await core.create_namespaced_resource_quota(
            where, {"metadata": {"name": name}, "spec": {"hard": hard}}
        )

    # The quota counting the kind says why it does not count it.
    async def events() -> list[tuple[str, str]]:
        listed = await core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=broken"
        )
        return [(e.reason, e.message) for e in listed.items]

    found = await eventually(
        events,
        until=lambda e: any(reason == "FailedList" for reason, _ in e),
        within=REPORTED_WITHIN_S,
        what="a FailedList Event on the quota counting the kind",
    )
    ((_, message),) = [(r, m) for r, m in found if r == "FailedList"]
    assert f"usage of {broken_crd} is not tracked: listing it fails" in message
    assert "conversion webhook" in message
    assert {(broken_crd, "FailedList"): 1.0} == _uncounted(operator)

    # Every other quota, and the other names of that one, are counted as usual: creates are
    # charged, deletions replenish.
    assert await _used(api, namespace, "broken") == {"pods": "0"}
    for where in (namespace, other_namespace):
        await core.create_namespaced_pod(
            where,
            {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": IMAGE}]}},
        )
    assert await _used(api, namespace, "fine") == {"pods": "1"}
    assert await _used(api, other_namespace, "other") == {"pods": "1"}
    for where in (namespace, other_namespace):
        await core.delete_namespaced_pod("p", where, grace_period_seconds=0)
    for where, name in ((namespace, "broken"), (namespace, "fine"), (other_namespace, "other")):
        await eventually(
            lambda w=where, n=name: _used(api, w, n),
            until=lambda used: used.get("pods") == "0",
            within=30,
            what=f"{name} replenished",
        )

    # The conversion works again: the kind is counted, the report is gone.
    control_plane.kubectl(
        "patch", "crd", broken_crd, "--type=merge", "-p",
        json.dumps({"spec": {"conversion": {"strategy": "None", "webhook": None}}}),
    )  # fmt: skip
    await eventually(
        lambda: _used(api, namespace, "broken"),
        until=lambda used: used.get(f"count/{broken_crd}") == "3",
        within=REPORTED_WITHIN_S,
        what="the kind counted once it can be listed",
    )
    await eventually(
        lambda: asyncio.to_thread(_uncounted, operator),
        until=lambda uncounted: uncounted == {},
        within=10,
        what="no uncounted resource left",
    )
