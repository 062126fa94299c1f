"""A ClusterQuota whose status grows toward the API server's size limit (operator mode, tally
under its ServiceAccount): warned about past 1 MiB, and past etcd's limit a clear refusal.

The status lists, for every selected namespace that uses something, a value for each hard name
a quota evaluator measures, zeros included (upstream ``CalculateUsage``). Every namespace holds
``kube-root-ca.crt``, so with ``count/configmaps`` and 1 000 extended-resource names in the hard
list each namespace's share is about 34 KB of JSON, and 34 namespaces pass 1 MiB without a
single pod: the sizes are counted by hand below and checked against the status read back.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from typing import Any

import pytest
from clusterquota_e2e import Team, used_by_namespace
from kubernetes_asyncio import client

import builders
from tally_e2e import RunningOperator, eventually, wait_for_root_ca_configmap

pytest_plugins = ["clusterquota_e2e"]

MIB = 1 << 20
ETCD_LIMIT = 1536 * 1024  # etcd's default --max-request-bytes, as the local planes run it
NAMES = [f"requests.example.com/r-{i:04}" for i in range(1000)]
HARD = {"count/configmaps": "1000", **dict.fromkeys(NAMES, "100")}


def share_bytes() -> int:
    """One namespace's entry, by hand: ``{"namespace":"<ns>","status":{"used":{...}}}`` with
    ``"count/configmaps":"1"`` and ``"<name>":"0"`` for each extended name, without the
    namespace's name."""
    used = len('"count/configmaps":"1"') + sum(len(f'"{n}":"0"') for n in NAMES) + len(NAMES)
    return len('{"namespace":"","status":{"used":{}}}') + used


def size_of(status: dict[str, Any]) -> int:
    return len(json.dumps(status, separators=(",", ":")).encode())


async def warnings(core: client.CoreV1Api, name: str) -> list[tuple[str, str, str]]:
    # A ClusterQuota is cluster-scoped: its Events live in "default", as client-go puts them.
    found = await core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}"
    )
    return [(e.type, e.reason, e.message) for e in found.items]


async def status_bytes_metric(operator: RunningOperator, name: str) -> float | None:
    def scrape() -> str:
        with urllib.request.urlopen(operator.metrics_url, timeout=5) as response:
            return str(response.read().decode())

    text = await asyncio.to_thread(scrape)
    prefix = f'tally_clusterquota_status_bytes{{name="{name}"}} '
    values = [float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)]
    return values[0] if values else None


async def test_a_status_past_a_mebibyte_is_warned_about_and_past_etcds_limit_refused(
    team: Team, operator: RunningOperator
) -> None:
    members = await team.member_namespaces(34)
    # kube-controller-manager publishes kube-root-ca.crt into each: before the ClusterQuota,
    # so that its first sync computes every share (a configmap created after it is charged by
    # admission, which writes the names it charges only).
    await asyncio.gather(*(wait_for_root_ca_configmap(team.api, ns) for ns in members))
    # 34 shares of ~34 KB: past 1 MiB, below etcd's 1.5 MiB with the rest of the object.
    assert MIB < 34 * share_bytes() < ETCD_LIMIT - 200_000
    name = await team.cluster_quota(HARD)

    status = await eventually(
        lambda: team.status(name),
        until=lambda s: len(s.get("namespaces") or []) == len(members),
        within=60,
        what="every member listed",
    )
    assert {"count/configmaps": "34", **dict.fromkeys(NAMES, "0")} == status["total"]["used"]
    assert {ns: {"count/configmaps": "1", **dict.fromkeys(NAMES, "0")} for ns in members} == (
        used_by_namespace(status)
    )
    size = size_of(status)
    assert 34 * share_bytes() < size  # the shares, and the total and its hard list beside them

    # The Warning Event, once, naming the size it saw when the status first passed 1 MiB.
    ((kind, reason, message),) = await eventually(
        lambda: warnings(team.core, name), until=bool, within=30, what="the StatusLarge Event"
    )
    assert ("Warning", "StatusLarge") == (kind, reason)
    seen = re.fullmatch(
        r"its status is (\d+) bytes, listing (\d+) namespaces; the API server refuses an object "
        r"past etcd's request limit \(1\.5 MiB by default\), and then neither its usage nor any "
        r"charge can be written: select fewer namespaces, or split it",
        message,
    )
    assert seen is not None, message
    assert MIB <= int(seen[1]) <= size
    assert 0 < int(seen[2]) <= len(members)
    # The gauge the alert reads: the size of the status last written.
    assert size == await eventually(
        lambda: status_bytes_metric(operator, name),
        until=lambda v: v == size,
        within=30,
        what="the gauge",
    )

    # Past etcd's limit no status can be written. A pod asking for one of every extended
    # resource, in a namespace the status does not list yet, adds a share of ~34 KB to the
    # status admission writes (a namespace's share lists what it uses): such creates are
    # admitted while the status still fits, and the first that would carry it past the limit
    # is refused, saying why and what to do.
    more = await team.member_namespaces(16)
    # kube-controller-manager publishes kube-root-ca.crt into each, and admission charges each
    # against this status of ~1.2 MB (a share naming count/configmaps alone) while the usage
    # controller syncs the new members: writes of the one object, in a queue. On a loaded
    # machine a create judged behind them waited past quota admission's 9.5 s and was refused
    # as timed out, so the wide pods come once every one of these is charged.
    await eventually(
        lambda: team.status(name),
        until=lambda s: set(more) <= {e["namespace"] for e in s.get("namespaces") or []},
        within=180,
        interval=1.0,
        what="every new member's kube-root-ca.crt charged",
    )
    extended = {n.removeprefix("requests."): "1" for n in NAMES}
    assert (34 + 16) * share_bytes() > ETCD_LIMIT
    refused: client.ApiException | None = None
    admitted = 0
    for namespace in more:
        try:
            await team.core.create_namespaced_pod(
                namespace, builders.pod("wide", extended, extended, resources="always")
            )
        except client.ApiException as error:
            refused = error
            break
        admitted += 1
    assert refused is not None, f"{admitted} wide pods in new namespaces, none refused"
    # Deny on internal error, as for any status admission cannot write. The API server's
    # refusal, or, when the usage controller's larger status was refused first, tally's
    # memory of it (below).
    assert 500 == refused.status, refused.body
    message = json.loads(refused.body or "{}")["message"]
    assert message.startswith(
        f'admission webhook "quota.tally.dev" denied the request: clusterquotas/{name}: '
    ), message
    assert "as too large" in message, message
    assert "select fewer namespaces, or split the ClusterQuota" in message, message
    written = await team.status(name)
    assert ETCD_LIMIT - 200_000 < size_of(written) + share_bytes(), size_of(written)
    assert admitted == sum(
        1 for ns in more if used_by_namespace(written).get(ns, {}).get(NAMES[0]) == "1"
    )
    # The same create again, as a client retries it, is refused without its status being
    # sent: tally remembers the size the API server refused, and says so. Its status is the
    # one refused or larger (nothing is released here, and a kube-root-ca.crt charged since
    # only adds to it). A create in another new namespace is no such check: that namespace
    # may be listed already, for its kube-root-ca.crt, and its status be a few bytes smaller.
    with pytest.raises(client.ApiException) as again:
        await team.core.create_namespaced_pod(
            more[admitted], builders.pod("wide", extended, extended, resources="always")
        )
    assert 500 == again.value.status, again.value.body
    message = json.loads(again.value.body or "{}")["message"]
    assert f"clusterquotas/{name}: its status of " in message, message
    assert "bytes was not sent: the API server refused one of " in message, message
    assert "as too large" in message, message
    # Namespaces the ClusterQuota does not select are untouched by it.
    outsider = await team.namespace(member=False)
    await team.core.create_namespaced_pod(
        outsider, builders.pod("wide", extended, extended, resources="always")
    )
