"""Differential test of ClusterQuota usage: tally's status against upstream's ResourceQuotas.

What is proven: for every evaluator and scope the differential usage tests cover (every pod
scope and scope selector; services with load balancers and node ports; PVCs with storage-class
names and volume attributes classes; configmaps, secrets and ``count/<r>.<g>`` names; the
resourcequotas count), a ClusterQuota selecting three namespaces reports, for each namespace,
exactly what upstream reports for the same spec as a ResourceQuota in that namespace, and as
its total their sum. (One quota of those tests is left out: the one naming resources no
evaluator measures, which tally refuses for a ClusterQuota.)

How: on the reference-mode control plane, upstream's kube-controller-manager computes every
ResourceQuota's ``status.used``: that is the oracle, and no expected number here comes from
tally. tally runs beside it as a subprocess, in the mode it picks where the cluster's own quota
system is on (it enforces ClusterQuotas only and writes nothing onto ResourceQuotas, which is
checked: the oracle must stay upstream's). Three namespaces share a team label and hold
different mixes of objects, so that their shares differ and some namespace uses nothing of some
quota (tally leaves such a namespace out of ``status.namespaces``; upstream must then report
zero for every name). For each quota spec Q there is a ResourceQuota Q in each namespace and
one ClusterQuota with Q as its ``spec.quota``, selecting the three by the label.

Objects come first, then the ResourceQuotas, then the ClusterQuotas: upstream's admission
refuses charged creates while a new quota's status is unknown, and so does tally's for a new
ClusterQuota; with nothing created after them, nothing is charged. Hard values are large.

Quantities are compared numerically (:func:`~tally.quota.quantity.parse_quantity`): upstream's
sums take the format of their first non-zero operand in Go map order (see
``test_differential_usage.py``), so strings may differ for equal values.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import differential_objects as diff
import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from operator_process import TallyProcess

from tally.quota.quantity import ZERO, Quantity, parse_quantity
from tally_e2e import ControlPlane, eventually, wait_for_default_service_account

CRD = Path(__file__).resolve().parents[2] / "crds" / "clusterquotas.tally.dev.yaml"
GROUP, VERSION, PLURAL = "tally.dev", "v1alpha1", "clusterquotas"
START_BOUND_S = 60.0
"""Python and Kopf start-up, the built-in quota probe, the LISTs, the webhook's registration
(as in test_builtin_quota.py)."""

# Per namespace, the objects it holds (None: all of them): the first holds everything, the
# second a different part, the third almost nothing, so that the shares differ and many
# quotas see a namespace that uses nothing of them.
POD_MIXES: Sequence[frozenset[str] | None] = (
    None,
    frozenset({
        "plain", "limits-only", "sidecars", "pod-level", "overhead", "best-effort",
        "terminating", "high", "low-terminating", "affinity-namespaces", "succeeded",
        "deleting", "resized",
    }),
    # count/pods counts the failed pod (terminal), pods and compute names do not.
    frozenset({"best-effort-dongle", "failed"}),
)  # fmt: skip
OBJECT_MIXES: Sequence[frozenset[str] | None] = (
    None,
    frozenset({
        "cluster-ip", "node-port", "load-balancer-no-node-ports", "gold", "beta-wins",
        "no-class", "expanded", "attributes-slow", "a", "p",
    }),
    # Services that use no node port and no load balancer; no PVC at all.
    frozenset({"headless", "external-name"}),
)  # fmt: skip


@pytest.fixture(scope="module")
def tally(
    reference_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """tally against the reference plane, for the whole module, with a webhook configuration
    name of its own (test_builtin_quota.py's pattern)."""
    reference_plane.kubectl("apply", "-f", str(CRD))
    reference_plane.kubectl(
        "wait", "--for=condition=Established", "crd/clusterquotas.tally.dev", "--timeout=60s"
    )
    process = TallyProcess(
        reference_plane.kubeconfig,
        tmp_path_factory.mktemp("tally") / "tally.log",
        bin_dir=reference_plane.bin_dir,
        env={"TALLY_WEBHOOK_CONFIG_NAME": f"tally-cqdiff-{uuid.uuid4().hex[:6]}.tally.dev"},
    )
    try:
        process.start(timeout=START_BOUND_S)
        # If tally enforced ResourceQuotas too it would write their status, and the oracle
        # would no longer be upstream alone.
        assert "tally enforces ClusterQuotas only" in process.log_text(tail=10_000)
        yield
    finally:
        process.kill()
        reference_plane.kubectl(
            "delete", process.webhook_configuration, "--ignore-not-found", check=False
        )


class Team:
    """Namespaces labelled ``team=<id>`` and ClusterQuotas selecting them by that label (and
    labelled ``tally.dev/e2e-team=<id>``, to be found and deleted together): all deleted by
    :meth:`close`."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.id = uuid.uuid4().hex[:8]
        self.own = f"tally.dev/e2e-team={self.id}"
        self.namespaces: list[str] = []

    async def namespace(self) -> str:
        name = f"e2e-cqd-{self.id}-{len(self.namespaces)}"
        # Recorded first: close() deletes it even if the create below fails half-way.
        self.namespaces.append(name)
        labels = {"tally.dev/e2e": "true", "team": self.id}
        await client.CoreV1Api(self.api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
        )
        # Pods are refused until the default service account exists.
        await wait_for_default_service_account(self.api, name)
        return name

    def cluster_quota_name(self, quota: Mapping[str, Any]) -> str:
        return f"cqd-{self.id}-{quota['metadata']['name']}"

    async def cluster_quota(self, quota: Mapping[str, Any]) -> None:
        """A ClusterQuota with ``quota``'s spec as its ``spec.quota``."""
        key, value = self.own.split("=")
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterQuota",
            "metadata": {"name": self.cluster_quota_name(quota), "labels": {key: value}},
            "spec": {
                "namespaceSelector": {"matchLabels": {"team": self.id}},
                "quota": quota["spec"],
            },
        }
        await self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)

    async def statuses(self) -> dict[str, dict[str, Any]]:
        """The status of each of the team's ClusterQuotas, by name ({} before the first)."""
        listed = await self.custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, label_selector=self.own
        )
        return {
            item["metadata"]["name"]: dict(item.get("status") or {}) for item in listed["items"]
        }

    async def close(self) -> None:
        with contextlib.suppress(client.ApiException):
            await self.custom.delete_collection_cluster_custom_object(
                GROUP, VERSION, PLURAL, label_selector=self.own
            )
        core = client.CoreV1Api(self.api)
        for namespace in self.namespaces:
            with contextlib.suppress(client.ApiException):
                await core.delete_namespace(namespace)


@pytest_asyncio.fixture
async def team(tally: None, reference_api: client.ApiClient) -> AsyncIterator[Team]:
    created = Team(reference_api)
    try:
        yield created
    finally:
        await created.close()


def cluster_quota_specs(quotas: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The quotas a ClusterQuota can have: tally refuses a ClusterQuota naming a resource no
    evaluator measures (docs/clusterquota.md, "Validation"), where a ResourceQuota only lacks a
    used value for it."""
    return [q for q in quotas if not set(q["spec"]["hard"]) & diff.UNTRACKED_NAMES]


def status_managers(resource_quota: Mapping[str, Any]) -> set[str]:
    """Who wrote the status of a ResourceQuota read as raw JSON (its managed fields)."""
    return {
        entry["manager"]
        for entry in resource_quota["metadata"].get("managedFields") or []
        if entry.get("subresource") == "status"
    }


async def settled_cluster_quotas(
    team: Team, quotas: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The team's ClusterQuota statuses once tally has written one for each, naming every hard
    name and every selected namespace, and two reads ``STABLE_AFTER_S`` apart agree (its caches
    may still be catching up with the creates when it first writes)."""
    expected = {team.cluster_quota_name(q): set(q["spec"]["hard"]) for q in quotas}

    def filled(statuses: dict[str, dict[str, Any]]) -> bool:
        if set(statuses) != set(expected):
            return False
        for name, status in statuses.items():
            total = status.get("total") or {}
            if not (
                set(total.get("hard") or {}) == expected[name]
                and set(total.get("used") or {}) == expected[name]
                and status.get("namespaceCount") == len(team.namespaces)
            ):
                return False
        return True

    loop = asyncio.get_running_loop()
    deadline = loop.time() + diff.FILL_WITHIN_S
    previous = await eventually(
        team.statuses,
        until=filled,
        within=diff.FILL_WITHIN_S,
        what=f"tally to write the status of {len(quotas)} ClusterQuotas",
    )
    while True:
        await asyncio.sleep(diff.STABLE_AFTER_S)
        current = await team.statuses()
        if filled(current) and current == previous:
            return current
        assert loop.time() < deadline, (
            f"tally's ClusterQuota statuses did not settle within {diff.FILL_WITHIN_S} s: "
            f"{previous} then {current}"
        )
        previous = current


def differences(
    quota: Mapping[str, Any],
    status: Mapping[str, Any],
    upstream: Mapping[str, Mapping[str, str]],
) -> list[str]:
    """How the ClusterQuota ``status`` of ``quota`` differs from upstream's ``status.used`` of
    the ResourceQuotas ``quota`` in each namespace (``upstream``: namespace to used)."""
    problems: list[str] = []

    def compare(where: str, theirs: Mapping[str, str], mine: Mapping[str, str]) -> None:
        for key in sorted(set(theirs) | set(mine)):
            if (
                key not in theirs
                or key not in mine
                or parse_quantity(theirs[key]) != parse_quantity(mine[key])
            ):
                problems.append(
                    f"  {diff.describe(quota)}: {where}: {key}: upstream {theirs.get(key)}, "
                    f"tally {mine.get(key)}"
                )

    listed = {
        entry["namespace"]: dict((entry.get("status") or {}).get("used") or {})
        for entry in status.get("namespaces") or []
    }
    for namespace in sorted(upstream):
        theirs = upstream[namespace]
        if namespace in listed:
            compare(namespace, theirs, listed[namespace])
        else:
            # Left out by tally: it uses nothing, by upstream's account too.
            for key, value in sorted(theirs.items()):
                if parse_quantity(value) != ZERO:
                    problems.append(
                        f"  {diff.describe(quota)}: {namespace}: {key}: upstream {value}, tally "
                        "leaves the namespace out of status.namespaces (uses nothing)"
                    )
    for namespace in sorted(set(listed) - set(upstream)):
        problems.append(f"  {diff.describe(quota)}: {namespace}: listed, but not selected")
    summed: dict[str, Quantity] = {}
    for used in upstream.values():
        for key, value in used.items():
            summed[key] = summed.get(key, ZERO) + parse_quantity(value)
    total = status.get("total") or {}
    compare("total", {key: str(value) for key, value in summed.items()}, total.get("used") or {})
    compare("total hard", quota["spec"]["hard"], total.get("hard") or {})
    if status.get("namespaceCount") != len(upstream):
        problems.append(
            f"  {diff.describe(quota)}: namespaceCount {status.get('namespaceCount')}, "
            f"selected {len(upstream)}"
        )
    return problems


async def compare_with_upstream(
    api: client.ApiClient,
    team: Team,
    quotas: Sequence[Mapping[str, Any]],
    *,
    deleting_counts_until: float | None = None,
) -> None:
    """Create ``quotas`` (in this order) as ResourceQuotas in each of the team's namespaces and
    as ClusterQuotas over them; assert that every ClusterQuota's status is upstream's numbers.

    ``deleting_counts_until``: the monotonic time until which a ``deleting`` pod is charged
    (at the earliest); a failure after it says so, since neither side recomputes when a charge
    ends and the two computations may then straddle it."""
    core = client.CoreV1Api(api)
    for namespace in team.namespaces:
        for body in quotas:
            await core.create_namespaced_resource_quota(namespace, diff.as_json(body))
    for body in quotas:
        await team.cluster_quota(body)

    settled = await asyncio.gather(
        *(diff.settled_quotas(api, namespace, len(quotas)) for namespace in team.namespaces)
    )
    statuses = await settled_cluster_quotas(team, quotas)

    by_namespace = dict(zip(team.namespaces, settled, strict=True))
    writers = {
        f"{namespace}/{name}": status_managers(rq)
        for namespace, rqs in by_namespace.items()
        for name, rq in rqs.items()
    }
    assert all(w == {"kube-controller-manager"} for w in writers.values()), writers

    problems: list[str] = []
    zero_shares = 0
    for body in quotas:
        name = body["metadata"]["name"]
        upstream = {ns: dict(rqs[name]["status"]["used"]) for ns, rqs in by_namespace.items()}
        # No comparison of empty sums only: every quota counts something somewhere.
        assert any(
            parse_quantity(value) != ZERO for used in upstream.values() for value in used.values()
        ), f"{diff.describe(body)} counts nothing in any namespace: {upstream}"
        zero_shares += sum(
            all(parse_quantity(value) == ZERO for value in used.values())
            for used in upstream.values()
        )
        problems += differences(body, statuses[team.cluster_quota_name(body)], upstream)
    # The namespaces' mixes make some namespace use nothing of some quota: the case where tally
    # leaves it out of status.namespaces is exercised.
    assert zero_shares > 0
    note = ""
    if deleting_counts_until is not None and time.monotonic() > deleting_counts_until:
        note = " (NB: a 'deleting' pod's charge may have ended between the two computations)"
    assert not problems, (
        f"tally's ClusterQuota status differs from upstream's ResourceQuotas over "
        f"{team.namespaces}{note}:\n" + "\n".join(problems)
    )


async def test_pod_quotas_match_upstream_per_namespace_and_in_total(
    reference_api: client.ApiClient, team: Team
) -> None:
    api = reference_api
    async with diff.cluster_objects(api) as names:
        namespaces = [await team.namespace() for _ in POD_MIXES]
        # Before the pods' deletions: the earliest their charges can end.
        deleting_counts_until = time.monotonic() + diff.DELETING_COUNTS_FOR_S
        try:
            for namespace, mix in zip(namespaces, POD_MIXES, strict=True):
                await diff.create_pods(api, namespace, names, only=mix)
            await asyncio.sleep(diff.PAST_DELETION_S)
            await compare_with_upstream(
                api,
                team,
                cluster_quota_specs(diff.pod_quotas(names)),
                deleting_counts_until=deleting_counts_until,
            )
        finally:
            for namespace in namespaces:
                await diff.release_pods(api, namespace)


async def test_service_pvc_and_count_quotas_match_upstream_per_namespace_and_in_total(
    reference_api: client.ApiClient, team: Team
) -> None:
    api = reference_api
    namespaces = [await team.namespace() for _ in OBJECT_MIXES]
    # An explicit node port is cluster-wide: one per namespace.
    ports = await diff.free_node_ports(api, len(namespaces))
    for namespace, port, mix in zip(namespaces, ports, OBJECT_MIXES, strict=True):
        await diff.create_objects(api, namespace, port, only=mix)
    # The quota counting quotas last: it would charge every quota created after it.
    await compare_with_upstream(api, team, [*diff.object_quotas(), diff.quota_count_quota()])
