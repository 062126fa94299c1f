"""ClusterQuota measures on the real control plane: quota on a field of a custom resource (CEL).

The test defines a CRD ``databases.<id>.example.com`` (``spec.storageGB``, ``spec.tier``) and
ClusterQuotas measuring it. Expected numbers are sums worked out by hand from the objects each
test creates: databases of 10 GB (gold) and 5 GB (silver) in one member namespace, 20 GB (gold)
in another, 100 GB (gold) in a namespace the ClusterQuota does not select.

* usage: the sum of ``object.spec.storageGB`` per namespace and in total, a ``when`` filter
  (gold only), ``count/`` beside them, the unselected namespace left out;
* admission: a create past the limit refused in upstream's words, one that fits admitted, an
  update judged by its growth (5 → 6 GB charges 1), a shrink and a delete giving back;
* bad input: an expression that does not compile refused when the ClusterQuota is written
  (the compiler's message, nothing stored); one that fails on an object (a missing field) or
  returns text that is not a quantity refuses that object's create with the error, never
  charging it zero, and so does one past the cost limit; tally keeps running;
* an object that already exists and a measure fails on: the status's ``UsageComputed``
  condition turns ``False`` naming it, one Warning Event on the ClusterQuota says so, and the
  update that fixes the object is admitted and charged, after which the condition is ``True``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

import pytest
from clusterquota_e2e import (
    GROUP as CQ_GROUP,
)
from clusterquota_e2e import (
    MERGE_PATCH,
    Team,
    exceeded_cluster_quota,
    total_used,
    used_by_namespace,
)
from clusterquota_e2e import (
    PLURAL as CQ_PLURAL,
)
from clusterquota_e2e import (
    VERSION as CQ_VERSION,
)
from kubernetes_asyncio import client

from tally_e2e import ControlPlane, RunningOperator, eventually

pytest_plugins = ["clusterquota_e2e"]

ID: Final = uuid.uuid4().hex[:6]
GROUP: Final = f"db{ID}.example.com"
PLURAL: Final = "databases"
STORAGE: Final = f"m{ID}.example.com/storage-gb"
GOLD: Final = f"m{ID}.example.com/gold-storage-gb"
COUNT: Final = f"count/{PLURAL}.{GROUP}"


@pytest.fixture(scope="module", autouse=True)
def database_crd(control_plane: ControlPlane) -> Iterator[None]:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": "Database", "plural": PLURAL, "singular": "database"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                }}},
            }],
        },
    }  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(crd))
    control_plane.kubectl(
        "wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s"
    )
    yield
    control_plane.kubectl("delete", "crd", f"{PLURAL}.{GROUP}", "--wait=false", check=False)


def measure(name: str, expression: str, when: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "resource": {"group": GROUP, "resource": PLURAL},
        "expression": expression,
    }
    if when is not None:
        spec["when"] = when
    return spec


async def database(
    team: Team, namespace: str, name: str, *, dry_run: bool = False, **spec: Any
) -> None:
    body = {"apiVersion": f"{GROUP}/v1", "kind": "Database", "metadata": {"name": name},
            "spec": spec}  # fmt: skip
    extra = {"dry_run": "All"} if dry_run else {}
    await team.custom.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, body, **extra)


async def judged(team: Team, namespace: str) -> None:
    """Until tally's webhook rules cover the measured kind (applied a moment after the
    ClusterQuota): a dry-run create far past any limit is refused (judged, never charged)."""

    async def attempt() -> bool:
        try:
            await database(
                team, namespace, "probe", dry_run=True,
                storageGB=10**6, tier="gold", replicas=10**6,
            )  # fmt: skip
        except client.ApiException as error:
            return error.status == 403
        return False

    await eventually(attempt, until=bool, within=30, what="the measured kind judged")


async def refused(call: Awaitable[Any]) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as error:
        await call
    return error.value.status, str(json.loads(error.value.body)["message"])


async def test_sums_filters_selection_and_admission(team: Team) -> None:
    first, second = await team.member_namespaces(2)
    outsider = await team.namespace(member=False)
    await database(team, first, "a", storageGB=10, tier="gold")
    await database(team, first, "b", storageGB=5, tier="silver")
    await database(team, second, "c", storageGB=20, tier="gold")
    await database(team, outsider, "d", storageGB=100, tier="gold")
    name = await team.cluster_quota(
        {STORAGE: "50", GOLD: "40", COUNT: "10"},
        measures=[
            measure(STORAGE, "object.spec.storageGB"),
            measure(GOLD, "object.spec.storageGB", when='object.spec.tier == "gold"'),
        ],
    )

    async def status() -> dict[str, Any]:
        return await team.status(name)

    def totals(storage: str, gold: str, count: str) -> Callable[[dict[str, Any]], bool]:
        return lambda s: total_used(s) == {STORAGE: storage, GOLD: gold, COUNT: count}

    result = await eventually(status, until=totals("35", "30", "3"), within=30, what="sums")
    await judged(team, second)
    assert {
        first: {STORAGE: "15", GOLD: "10", COUNT: "2"},
        second: {STORAGE: "20", GOLD: "20", COUNT: "1"},
    } == used_by_namespace(result)

    # 35 + 16 > 50: refused; the silver database is not gold, so only storage is exceeded.
    status_code, message = await refused(database(team, second, "e", storageGB=16, tier="silver"))
    assert 403 == status_code
    assert exceeded_cluster_quota(name, f"{STORAGE}=16", f"{STORAGE}=35", f"{STORAGE}=50") == (
        message
    )
    # 35 + 15 = 50: fits.
    await database(team, second, "f", storageGB=15, tier="silver")
    await eventually(status, until=totals("50", "30", "4"), what="50")

    # An update is charged by its growth: 5 → 6 GB asks for 1 more.
    patch: Callable[..., Awaitable[Any]] = team.custom.patch_namespaced_custom_object
    status_code, message = await refused(
        patch(
            GROUP, "v1", first, PLURAL, "b", {"spec": {"storageGB": 6}}, _content_type=MERGE_PATCH
        )
    )
    assert 403 == status_code
    assert exceeded_cluster_quota(name, f"{STORAGE}=1", f"{STORAGE}=50", f"{STORAGE}=50") == (
        message
    )
    # Shrinking and deleting give back.
    await patch(GROUP, "v1", second, PLURAL, "c", {"spec": {"storageGB": 10}},
                _content_type=MERGE_PATCH)  # fmt: skip
    await eventually(status, until=totals("40", "20", "4"), what="40")
    await team.custom.delete_namespaced_custom_object(GROUP, "v1", first, PLURAL, "a")
    await eventually(status, until=totals("30", "10", "3"), what="30")


async def test_an_expression_that_does_not_compile_is_refused_at_write(team: Team) -> None:
    name = f"cq-bad-{team.id}"
    body = {
        "apiVersion": f"{CQ_GROUP}/{CQ_VERSION}", "kind": "ClusterQuota",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": {}, "quota": {"hard": {STORAGE: "1"}},
                 "measures": [measure(STORAGE, "object.spec.storageGB +")]},
    }  # fmt: skip
    status_code, message = await refused(
        team.custom.create_cluster_custom_object(CQ_GROUP, CQ_VERSION, CQ_PLURAL, body)
    )
    assert 422 == status_code
    assert "spec.measures[0].expression" in message, message
    with pytest.raises(client.ApiException) as missing:
        await team.custom.get_cluster_custom_object(CQ_GROUP, CQ_VERSION, CQ_PLURAL, name)
    assert 404 == missing.value.status


async def test_an_expression_failing_on_an_object_refuses_it_and_charges_nothing(
    team: Team, operator: RunningOperator
) -> None:
    (member,) = await team.member_namespaces(1)
    replicas = f"r{ID}.example.com/replicas"
    tier = f"t{ID}.example.com/tier"
    name = await team.cluster_quota(
        {replicas: "10", tier: "10"},
        measures=[measure(replicas, "object.spec.replicas"), measure(tier, "object.spec.tier")],
    )
    await eventually(
        lambda: team.status(name),
        until=lambda s: total_used(s) == {replicas: "0", tier: "0"},
        within=30,
        what="the first status",
    )
    await judged(team, member)
    status_code, message = await refused(database(team, member, "x", replicas=2, tier="gold"))
    assert 403 == status_code
    assert message.startswith(
        f'admission webhook "quota.tally.dev" denied the request: failed cluster quota: {name}: '
        f"measure '{tier}': expression returned a string that is not a quantity: 'gold'"
    ), message
    status_code, message = await refused(database(team, member, "y", tier="5"))
    assert 403 == status_code
    assert f"failed cluster quota: {name}: measure '{replicas}': " in message, message
    assert "no such key: replicas" in message, message
    # One over the cost limit: a comprehension inside a comprehension over 200 items is about
    # 2 x 200^3 steps, past the 1 000 000 a measure may cost on one object.
    costly = f"c{ID}.example.com/pairs"
    other = await team.cluster_quota(
        {costly: "10"},
        measures=[measure(costly, "object.spec.items.filter(x, object.spec.items.exists("
                                  "y, y == x)).size()")],
    )  # fmt: skip
    await eventually(
        lambda: team.status(other),
        until=lambda s: total_used(s) == {costly: "0"},
        within=30,
        what="the costly measure's first status",
    )
    status_code, message = await refused(
        database(team, member, "z", items=list(range(200)), tier="5", replicas=1)
    )
    assert 403 == status_code
    assert f"failed cluster quota: {other}: measure '{costly}': " in message, message
    assert "cost limit exceeded" in message, message
    assert operator.process.poll() is None, operator.log_text()
    await asyncio.sleep(1.0)
    assert {replicas: "0", tier: "0"} == total_used(await team.status(name))


def usage_computed(status: dict[str, Any]) -> dict[str, Any] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "UsageComputed":
            return dict(condition)
    return None


async def test_a_measure_failing_on_an_existing_object_is_reported_until_it_is_fixed(
    team: Team, control_plane: ControlPlane
) -> None:
    (member,) = await team.member_namespaces(1)
    replicas = f"e{ID}.example.com/replicas"
    # Both exist before any quota measures them; "bad" has no spec.replicas.
    await database(team, member, "good", replicas=2)
    await database(team, member, "bad", tier="gold")
    name = await team.cluster_quota(
        {replicas: "10"}, measures=[measure(replicas, "object.spec.replicas")]
    )

    def failing(status: dict[str, Any]) -> bool:
        condition = usage_computed(status)
        return condition is not None and condition["status"] == "False"

    status = await eventually(
        lambda: team.status(name), until=failing, within=30, what="UsageComputed False"
    )
    condition = usage_computed(status)
    assert condition is not None
    assert "EvaluationFailed" == condition["reason"]
    assert f"measure '{replicas}': {PLURAL}.{GROUP} {member}/bad: " in condition["message"], (
        condition
    )
    assert "no such key: replicas" in condition["message"], condition
    # kubectl get shows it in its own column.
    header, row = control_plane.kubectl("get", "clusterquota", name).stdout.splitlines()
    assert "False" == row[header.index("COMPUTED") :].split()[0], (header, row)

    async def warnings() -> list[tuple[str, str, str]]:
        found = await team.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={name}"
        )
        return [(e.type, e.reason, e.involved_object.kind) for e in found.items]

    # A ClusterQuota is cluster-scoped: its Events live in "default", as client-go puts them.
    assert [("Warning", "EvaluationFailed", "ClusterQuota")] == await eventually(
        warnings, until=bool, within=30, what="the Warning Event"
    )

    async def in_member() -> list[tuple[str, str, str, str]]:
        found = await team.core.list_namespaced_event(
            member, field_selector=f"involvedObject.name={name}"
        )
        return [(e.type, e.reason, e.involved_object.kind, e.message) for e in found.items]

    # The namespace whose object failed gets the same Event, about the AppliedClusterQuota its
    # users read, naming its own object.
    ((kind, reason, involved, text),) = await eventually(
        in_member, until=bool, within=30, what="the Warning Event in the namespace"
    )
    assert ("Warning", "EvaluationFailed", "AppliedClusterQuota") == (kind, reason, involved)
    assert text.startswith(f"cluster quota {name}: measure '{replicas}': "), text
    assert f"{member}/bad" in text, text

    # The fix is an update: admitted, and charged the measure's whole new value.
    await judged(team, member)
    await team.custom.patch_namespaced_custom_object(
        GROUP, "v1", member, PLURAL, "bad", {"spec": {"replicas": 3}}, _content_type=MERGE_PATCH
    )

    def computed(status: dict[str, Any]) -> bool:
        condition = usage_computed(status)
        return (
            condition is not None
            and condition["status"] == "True"
            and total_used(status) == {replicas: "5"}
        )

    await eventually(lambda: team.status(name), until=computed, within=30, what="computed: 5")
    assert 1 == len(await warnings())
