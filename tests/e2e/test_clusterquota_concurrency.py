"""Never over-admit, ClusterQuota under concurrency: 200 pod creates at once over 10 namespaces
(asyncio.gather), in five shapes, each repeated :data:`ROUNDS` times: 20 rounds, 23 with
test_clusterquota's 3 rounds of plain ``pods: 50``. The order of the creates is shuffled anew
every round.

Each round makes its own namespaces and quotas, waits until tally has filled every quota's
status (a quota without one is not enforced, as upstream), fires the burst and checks:

* how many pods exist — a LIST of every namespace, the truth — against a number proved by hand
  below (exact wherever the order of the creates cannot change it), and that exactly the
  creates that were not refused exist;
* every refusal is a 403 in upstream's words (``exceeded quota: …`` / ``exceeded cluster
  quota: …``, the exceeded names only), naming a quota that binds the pod's namespace and is
  full; anything else (a 500 for a timed-out evaluation, a 409) fails the test;
* every ClusterQuota's status converges within 10 s to the LIST: ``total.used`` and each
  namespace's share, a namespace that uses nothing not listed (ResourceQuotas' ``status.used``
  too);
* one more create afterwards is refused: a status, or a copy of it that admission reads, left
  below what was admitted would let it in.

No check depends on timing but the 10 s for the status; the bursts' timing only shapes the
load. The hand proofs (a refusal never lowers a count, and nothing is deleted during a round,
so a quota that refused once is full at the end):

1. A ResourceQuota ``pods: 8`` in each of the 10 namespaces and a ClusterQuota ``pods: 50``
   over them, 20 creates per namespace. At most 50 (the ClusterQuota) and at most 8 per
   namespace. At least 50: were the total below 50, the ClusterQuota would never have been
   full, so every refusal came from a ResourceQuota, so every namespace (20 creates > 8) would
   have reached 8, 80 in all. So exactly 50.
2. Two overlapping ClusterQuotas: A (``pods: 30``) selects namespaces 0-6, B (``pods: 25``)
   4-9. Namespaces 0-3 are bound by A alone and get 80 creates > 30, so A refused one and is
   full: exactly 30 pods in A's namespaces; likewise 7-9 by B alone, 60 > 25: exactly 25 in
   B's. Refusals in 0-3 name A, in 7-9 B, in 4-6 either.
3. A ClusterQuota ``pods: 20`` scoped ``NotBestEffort``; half the creates are BestEffort (no
   requests, no limits), half request 100m cpu (Burstable). The BestEffort pods match no quota:
   all 100 admitted; the others, 100 > 20: exactly 20.
4. ``requests.cpu: 3`` and ``limits.memory: 4Gi``; each pod requests 100m cpu, limits 200m cpu
   and 256Mi memory. Memory binds first (4Gi / 256Mi = 16 pods, against 3 / 100m = 30):
   exactly 16. The 17th would need 4352Mi > 4Gi with 1700m ≤ 3, so the refusal names
   ``limits.memory`` alone: ``requested: limits.memory=256Mi, used: limits.memory=4Gi,
   limited: limits.memory=4Gi``.
5. ``pods: 50`` with 60 % of the creates into 2 namespaces (60 each, 10 each in the other 8),
   sent as five bursts of random sizes started 50 ms apart: 200 > 50, exactly 50.

Quantities are written as the API server writes them (apimachinery's canonical form): 1000m is
``1``, 4096Mi is ``4Gi``.

Time: 1.5 to 2 minutes for the module on the project's 2-core machine (20 rounds of 3 to 8 s:
ten namespaces, the burst, the LIST, the statuses), plus the control plane's start when the
session starts one.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import pytest
from clusterquota_e2e import (
    CONVERGE_WITHIN_S,
    Create,
    Team,
    Used,
    burst,
    exceeded_cluster_quota,
    exceeded_quota,
    pods_used,
    wait_for_status,
)

from tally_e2e import eventually

# The fixtures `cq_crd` and `team`, shared with test_clusterquota.
pytest_plugins = ["clusterquota_e2e"]

ROUNDS: Final = 4
NAMESPACES: Final = 10
CREATES: Final = 200
RESOURCE_QUOTA: Final = "pods-8"
BURSTS: Final = 5
BURST_STAGGER_S: Final = 0.05
"""How far apart the skewed shape's bursts start: far enough that they usually reach
admission as separate passes of different sizes; nothing checked depends on it."""


def rounds() -> pytest.MarkDecorator:
    return pytest.mark.parametrize("round_", range(ROUNDS))


def shuffled(creates: Iterable[Create], seed: str) -> list[Create]:
    """``creates`` in an order of their own per shape and round (reproducible from the seed)."""
    ordered = list(creates)
    random.Random(seed).shuffle(ordered)
    return ordered


def spread(namespaces: Sequence[str], prefix: str = "p") -> list[Create]:
    """:data:`CREATES` pods of 100m cpu, round-robin: 20 per namespace."""
    return [Create(namespaces[i % len(namespaces)], f"{prefix}{i}") for i in range(CREATES)]


async def pod_counts(team: Team, namespaces: Sequence[str]) -> dict[str, int]:
    return {ns: len(names) for ns, names in (await team.pod_names(namespaces)).items()}


async def first_status(team: Team, name: str, hard: Iterable[str]) -> None:
    """Wait until tally has filled the status (all zero, no namespace listed)."""
    await wait_for_status(team, name, dict.fromkeys(hard, "0"), {}, what="the first status")


async def wait_for_resource_quotas(team: Team, counts: Mapping[str, int]) -> None:
    """Wait until every namespace's ResourceQuota :data:`RESOURCE_QUOTA` reads ``counts``."""
    want = {ns: {"pods": str(count)} for ns, count in counts.items()}

    async def used() -> dict[str, Used]:
        return {ns: await team.resource_quota_used(ns, RESOURCE_QUOTA) for ns in counts}

    await eventually(used, until=lambda u: u == want, within=CONVERGE_WITHIN_S,
                     what=f"the ResourceQuotas at {want}")  # fmt: skip


async def refused_after(team: Team, create: Create, allowed: set[str]) -> None:
    """One more create, after the statuses converged, is refused with one of ``allowed``."""
    message = await team.attempt(create)
    assert message in allowed, (create, message)


def millicores(pods: int) -> str:
    """The cpu of ``pods`` pods of 100m, canonical: whole cores lose the ``m`` (1000m is ``1``)."""
    milli = 100 * pods
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def mebibytes(pods: int) -> str:
    """The memory of ``pods`` pods of 256Mi, canonical: the largest binary suffix that
    stays whole (1024Mi is ``1Gi``)."""
    mi = 256 * pods
    return f"{mi // 1024}Gi" if mi % 1024 == 0 else f"{mi}Mi"


@rounds()
async def test_resource_quotas_and_a_cluster_quota_both_binding(team: Team, round_: int) -> None:
    namespaces = await team.member_namespaces(NAMESPACES)
    await asyncio.gather(
        *(team.resource_quota(ns, RESOURCE_QUOTA, {"pods": "8"}) for ns in namespaces)
    )
    name = await team.cluster_quota({"pods": "50"})
    await first_status(team, name, ["pods"])
    await wait_for_resource_quotas(team, dict.fromkeys(namespaces, 0))

    refusals = await burst(team, shuffled(spread(namespaces), f"both-{round_}"))

    counts = await pod_counts(team, namespaces)
    assert 50 == sum(counts.values()), counts  # proof 1
    assert all(count <= 8 for count in counts.values()), counts
    assert CREATES - len(refusals) == sum(counts.values())
    by_cluster_quota = exceeded_cluster_quota(name, "pods=1", "pods=50", "pods=50")
    by_resource_quota = exceeded_quota(RESOURCE_QUOTA, "pods=1", "pods=8", "pods=8")
    for create, message in refusals:
        assert message in {by_cluster_quota, by_resource_quota}, (create, message)
        # A ResourceQuota refused at 8: its namespace is full.
        assert message != by_resource_quota or 8 == counts[create.namespace], (create, counts)
    await wait_for_status(team, name, {"pods": "50"}, pods_used(counts))
    await wait_for_resource_quotas(team, counts)
    first = namespaces[0]
    await refused_after(
        team,
        Create(first, "one-more"),
        {by_cluster_quota, *([by_resource_quota] if 8 == counts[first] else [])},
    )


@rounds()
async def test_two_overlapping_cluster_quotas(team: Team, round_: int) -> None:
    namespaces = await team.member_namespaces(NAMESPACES)
    in_a, in_b = namespaces[:7], namespaces[4:]  # 4-6 in both

    def by_name(selected: Sequence[str]) -> dict[str, object]:
        expression = {"key": "kubernetes.io/metadata.name", "operator": "In",
                      "values": list(selected)}  # fmt: skip
        return {"matchExpressions": [expression]}

    a = await team.cluster_quota({"pods": "30"}, namespaceSelector=by_name(in_a))
    b = await team.cluster_quota({"pods": "25"}, namespaceSelector=by_name(in_b))
    await first_status(team, a, ["pods"])
    await first_status(team, b, ["pods"])

    refusals = await burst(team, shuffled(spread(namespaces), f"overlap-{round_}"))

    counts = await pod_counts(team, namespaces)
    admitted = {a: sum(counts[ns] for ns in in_a), b: sum(counts[ns] for ns in in_b)}
    hard = {a: 30, b: 25}
    assert hard == admitted, counts  # proof 2: each exactly full (so at most its hard, too)
    assert CREATES - len(refusals) == sum(counts.values())
    exceeded = {
        q: exceeded_cluster_quota(q, "pods=1", f"pods={hard[q]}", f"pods={hard[q]}") for q in hard
    }

    def binding(namespace: str) -> list[str]:
        return [q for q, selected in ((a, in_a), (b, in_b)) if namespace in selected]

    for create, message in refusals:
        quotas = binding(create.namespace)
        # Saturation: a refused namespace has a full quota; the refusal names one of them.
        assert any(admitted[q] == hard[q] for q in quotas), (create, admitted)
        assert message in {exceeded[q] for q in quotas}, (create, message)
    await wait_for_status(team, a, {"pods": "30"}, pods_used({ns: counts[ns] for ns in in_a}))
    await wait_for_status(team, b, {"pods": "25"}, pods_used({ns: counts[ns] for ns in in_b}))
    await refused_after(team, Create(namespaces[0], "one-more"), {exceeded[a]})
    await refused_after(team, Create(namespaces[-1], "one-more"), {exceeded[b]})


@rounds()
async def test_a_scoped_cluster_quota(team: Team, round_: int) -> None:
    namespaces = await team.member_namespaces(NAMESPACES)
    name = await team.cluster_quota({"pods": "20"}, scopes=["NotBestEffort"])
    await first_status(team, name, ["pods"])
    # Alternating BestEffort / 100m cpu, namespace by pairs: 10 of each kind per namespace.
    creates = [
        Create(namespaces[(i // 2) % NAMESPACES], f"be{i}", cpu=None)
        if i % 2 == 0
        else Create(namespaces[(i // 2) % NAMESPACES], f"cpu{i}")
        for i in range(CREATES)
    ]

    refusals = await burst(team, shuffled(creates, f"scoped-{round_}"))

    pods = await team.pod_names(namespaces)
    best_effort = {ns: sum(n.startswith("be") for n in names) for ns, names in pods.items()}
    burstable = {ns: sum(n.startswith("cpu") for n in names) for ns, names in pods.items()}
    assert 100 == sum(best_effort.values()), best_effort  # proof 3: no quota matches them
    assert 20 == sum(burstable.values()), burstable
    assert CREATES - len(refusals) == 120
    expected = exceeded_cluster_quota(name, "pods=1", "pods=20", "pods=20")
    assert {expected} == {message for _, message in refusals}
    assert all(create.cpu is not None for create, _ in refusals)
    await wait_for_status(team, name, {"pods": "20"}, pods_used(burstable))
    await refused_after(team, Create(namespaces[0], "one-more"), {expected})


@rounds()
async def test_cpu_and_memory_limits(team: Team, round_: int) -> None:
    namespaces = await team.member_namespaces(NAMESPACES)
    name = await team.cluster_quota({"requests.cpu": "3", "limits.memory": "4Gi"})
    await first_status(team, name, ["requests.cpu", "limits.memory"])
    limits = {"cpu": "200m", "memory": "256Mi"}
    creates = [
        Create(namespaces[i % NAMESPACES], f"p{i}", cpu="100m", limits=limits)
        for i in range(CREATES)
    ]

    refusals = await burst(team, shuffled(creates, f"cpu-memory-{round_}"))

    counts = await pod_counts(team, namespaces)
    assert 16 == sum(counts.values()), counts  # proof 4: memory binds
    assert CREATES - len(refusals) == 16
    expected = exceeded_cluster_quota(
        name, "limits.memory=256Mi", "limits.memory=4Gi", "limits.memory=4Gi"
    )
    assert {expected} == {message for _, message in refusals}
    await wait_for_status(
        team,
        name,
        {"requests.cpu": "1600m", "limits.memory": "4Gi"},
        {
            ns: {"requests.cpu": millicores(count), "limits.memory": mebibytes(count)}
            for ns, count in counts.items()
            if count
        },
    )
    await refused_after(
        team, Create(namespaces[0], "one-more", cpu="100m", limits=limits), {expected}
    )


@rounds()
async def test_skewed_bursts_of_mixed_sizes(team: Team, round_: int) -> None:
    namespaces = await team.member_namespaces(NAMESPACES)
    name = await team.cluster_quota({"pods": "50"})
    await first_status(team, name, ["pods"])
    # 60 % into the first two namespaces (60 each), 10 into each of the other eight.
    targets = [namespaces[0]] * 60 + [namespaces[1]] * 60 + list(namespaces[2:]) * 10
    assert CREATES == len(targets)
    rng = random.Random(f"skewed-cuts-{round_}")
    creates = shuffled((Create(ns, f"p{i}") for i, ns in enumerate(targets)), f"skewed-{round_}")
    cuts = sorted(rng.sample(range(1, CREATES), BURSTS - 1))
    parts = [creates[i:j] for i, j in zip([0, *cuts], [*cuts, CREATES], strict=True)]

    async def staggered(index: int, part: Sequence[Create]) -> list[tuple[Create, str]]:
        await asyncio.sleep(BURST_STAGGER_S * index)
        return await burst(team, part)

    refused_by_burst = await asyncio.gather(*(staggered(k, p) for k, p in enumerate(parts)))
    refusals = [refusal for refused in refused_by_burst for refusal in refused]

    counts = await pod_counts(team, namespaces)
    assert 50 == sum(counts.values()), (counts, [len(part) for part in parts])  # proof 5
    assert CREATES - len(refusals) == 50
    expected = exceeded_cluster_quota(name, "pods=1", "pods=50", "pods=50")
    assert {expected} == {message for _, message in refusals}
    await wait_for_status(team, name, {"pods": "50"}, pods_used(counts))
    await refused_after(team, Create(namespaces[0], "one-more"), {expected})
