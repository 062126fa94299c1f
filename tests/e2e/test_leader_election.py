"""Two tally replicas with leader election on one control plane.

Each test starts two ``TallyProcess`` replicas at the same moment, configured like the
Deployment's two pods: ``TALLY_LEADER_ELECTION=true``, one Lease (``tally`` in the test's own
``TALLY_NAMESPACE``), one webhook configuration name shared by both, kept on exit. Durations
are shortened (lease 4 s, renew deadline 3 s, retry 0.5 s) so that failovers fit in a test;
the README gives the times with the defaults (15 s / 10 s / 2 s).

What is checked, from outside (the Lease, the configuration, the pods, the quotas, each
process's ``/metrics``, its webhook port and its log):

* exactly one replica leads: the Lease names it, its ``tally_leader`` is 1 and the other's 0,
  and the webhook configuration points at its port. Both started together, so their built-in
  quota probes ran side by side in one namespace: both concluded.
* both replicas judge admission: AdmissionReviews posted straight to each one's webhook port
  (with the API server's client certificate, trusting only the configuration's caBundle: both
  serve the certificate kept in one Secret, as behind the Deployment's Service) are allowed
  and charged, then denied with upstream's words, each replica seeing the other's
  reservations (the quota status is the shared state, written compare-and-swap).
* a PodSet scaled to 30 ends with exactly 30 pods and never had more (a pod watch sees every
  change), and a quota's status is written; with two PodSet controllers running (election off,
  checked by hand) pods are created twice.
* kill -9 the leader: the other replica takes over within about the lease duration, registers
  the configuration at its own port, and keeps PodSets and quotas reconciled.
* a graceful stop of the leader releases the Lease: the other takes over at its next attempt,
  well before the lease would have expired.
* a leader that finds the Lease held by someone else stops its controllers and exits.
* behind a round-robin balancer (``balancer.py``; the configuration names it through
  ``TALLY_WEBHOOK_URL_PORT``) both replicas answer reviews and race on the same quota
  statuses: 4 bursts of 120 pod creates against ``pods: 30``, and 3 bursts of 200 over 10
  namespaces under a ClusterQuota of ``pods: 50``, each end with exactly the limit, and every
  refused create gets the quota's 403, never a 409 from a lost compare-and-swap (with
  upstream's 3 retries against the informer, some did).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import re
import signal
import ssl
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import forged_reviews
import pytest
import pytest_asyncio
from balancer import RoundRobinBalancer
from kubernetes_asyncio import client
from operator_process import TallyProcess, webhook_ports
from podset_e2e import PODSET, OwnedPodWatch, install_podset_crd

import builders
import cluster
from tally_e2e import ControlPlane, eventually, wait_for_default_service_account

LEASE = "tally"
LEASE_DURATION_S = 4
RENEW_DEADLINE_S = 3.0
RETRY_PERIOD_S = 0.5
FAILOVER_BOUND_S = LEASE_DURATION_S + 2 * 2.2 * RETRY_PERIOD_S + 3.0
"""kill -9 to the new leader's Lease: the lease duration after the follower last saw a renewal
(it reads every 0.5-1.1 s), its next attempt, and slack for a loaded 2-core machine."""
RELEASE_BOUND_S = 2.5
"""Graceful stop to the new leader's Lease: one jittered retry period (at most 1.1 s) and
slack, but less than the 3.5 s at least that waiting out an unreleased lease would take."""
DENIED = 'admission webhook "quota.tally.dev" denied the request: '


@dataclass
class Pair:
    """Two replicas; ``leader``/``follower`` once the election is decided."""

    a: TallyProcess
    b: TallyProcess
    lease_namespace: str
    configuration: str

    @property
    def both(self) -> tuple[TallyProcess, TallyProcess]:
        return self.a, self.b


def leader_gauge(process: TallyProcess) -> tuple[str, float] | None:
    """(identity, value) of ``tally_leader`` from the process's /metrics; None if it does not
    answer."""
    try:
        with urllib.request.urlopen(process.metrics_url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    found = re.search(r'^tally_leader\{identity="([^"]+)"\} (\S+)$', text, re.MULTILINE)
    assert found, text
    return found.group(1), float(found.group(2))


def lease(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    result = plane.kubectl("get", "lease", LEASE, "-n", namespace, "-o", "json", check=False)
    return dict(json.loads(result.stdout).get("spec") or {}) if result.returncode == 0 else {}


def identity(process: TallyProcess) -> str:
    gauge = leader_gauge(process)
    assert gauge is not None, process.log_text()
    return gauge[0]


async def decided(plane: ControlPlane, pair: Pair) -> tuple[TallyProcess, TallyProcess]:
    """(leader, follower), once the Lease, the gauges and the configuration agree."""

    async def state() -> tuple[str, list[float | None]]:
        holder = lease(plane, pair.lease_namespace).get("holderIdentity", "")
        gauges = [leader_gauge(p) for p in pair.both]
        return holder, [g[1] if g else None for g in gauges]

    holder, values = await eventually(
        state, until=lambda s: sorted(map(str, s[1])) == ["0.0", "1.0"], what="one leader"
    )
    leader, follower = pair.both if values[0] == 1.0 else (pair.b, pair.a)
    assert holder == identity(leader)
    await eventually(
        lambda: asyncio.to_thread(
            webhook_ports, plane.bin_dir, plane.kubeconfig, pair.configuration
        ),
        until=lambda ports: ports == {leader.webhook_port},
        what="the configuration pointing at the leader",
    )
    return leader, follower


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    install_podset_crd(control_plane)
    return control_plane


@contextlib.asynccontextmanager
async def replicas(
    plane: ControlPlane, api: client.ApiClient, logs: Path, **extra_env: str
) -> AsyncIterator[Pair]:
    """Two replicas started together; both killed and the configuration deleted after."""
    own = f"tally-le-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": own}})
    configuration = f"tally-le-{uuid.uuid4().hex[:6]}.tally.dev"
    env = {
        "TALLY_NAMESPACE": own,
        "TALLY_LEADER_ELECTION": "true",
        "TALLY_LEADER_ELECTION_LEASE_DURATION": str(LEASE_DURATION_S),
        "TALLY_LEADER_ELECTION_RENEW_DEADLINE": str(RENEW_DEADLINE_S),
        "TALLY_LEADER_ELECTION_RETRY_PERIOD": str(RETRY_PERIOD_S),
        "TALLY_WEBHOOK_CONFIG_NAME": configuration,
        # Like the Deployment: the configuration stays when a replica stops, and both replicas
        # serve the certificate kept in one Secret (which the first to start creates).
        "TALLY_WEBHOOK_REMOVE_ON_EXIT": "false",
        "TALLY_WEBHOOK_CERT_SECRET": f"{own}/tally-webhook-tls",
        **extra_env,
    }
    a, b = (
        TallyProcess(plane.kubeconfig, logs / f"tally-{n}.log", bin_dir=plane.bin_dir, env=env)
        for n in "ab"
    )
    made = Pair(a, b, own, f"validatingwebhookconfiguration/{configuration}")
    try:
        await asyncio.gather(
            asyncio.to_thread(a.start, registered=False),
            asyncio.to_thread(b.start, registered=False),
        )
        yield made
    finally:
        await asyncio.gather(asyncio.to_thread(a.kill), asyncio.to_thread(b.kill))
        plane.kubectl("delete", made.configuration, "--ignore-not-found", check=False)
        plane.kubectl("delete", "namespace", own, "--wait=false", check=False)


@pytest_asyncio.fixture
async def pair(plane: ControlPlane, api: client.ApiClient, tmp_path: Path) -> AsyncIterator[Pair]:
    async with replicas(plane, api, tmp_path) as made:
        yield made


async def used(api: client.ApiClient, namespace: str, name: str = "q") -> dict[str, str]:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota(name, namespace)
    return dict((quota.status and quota.status.used) or {})


async def create_quota(api: client.ApiClient, namespace: str, hard: dict[str, str]) -> None:
    await client.CoreV1Api(api).create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "q"}, "spec": {"hard": hard}}
    )
    await eventually(
        lambda: used(api, namespace),
        until=lambda u: set(u) == set(hard),
        what="the quota's status written by the leader",
    )


pod = functools.partial(builders.pod, container_name="c", with_kind=True)


def trusted_ca(plane: ControlPlane, configuration: str) -> str:
    """The caBundle the (leader's) webhook configuration tells the API server to trust."""
    registered = json.loads(plane.kubectl("get", configuration, "-o", "json").stdout)
    bundles = {w["clientConfig"]["caBundle"] for w in registered["webhooks"]}
    (bundle,) = bundles
    return base64.b64decode(bundle).decode()


async def review(
    plane: ControlPlane, pair: Pair, process: TallyProcess, namespace: str, name: str
) -> dict[str, Any]:
    """A pod CREATE review posted straight to ``process``'s webhook port, as the API server
    would send it (its client certificate: the replicas require it), trusting only what the
    configuration says: a follower must present a certificate the leader's configuration
    trusts, or the API server could not use it behind a Service."""
    body = forged_reviews.review(namespace, pod(name), user="e2e-leader-election")
    context = ssl.create_default_context(cadata=trusted_ca(plane, pair.configuration))
    pki = cluster.webhook_client_pki(plane.kubeconfig.parent)
    if pki is not None:
        context.load_cert_chain(pki.cert, pki.key)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"https://127.0.0.1:{process.webhook_port}/quota",
            json=body,
            ssl=context,
            timeout=aiohttp.ClientTimeout(total=15),
        ) as response,
    ):
        assert response.status == 200, await response.text()
        answer = await response.json()
    return dict(answer["response"])


def exceeded(used_pods: int) -> str:
    return f"exceeded quota: q, requested: pods=1, used: pods={used_pods}, limited: pods=2"


# -- the tests


async def test_one_leader_and_both_replicas_judge_admission(
    plane: ControlPlane, pair: Pair, api: client.ApiClient, namespace: str
) -> None:
    leader, follower = await decided(plane, pair)
    spec = lease(plane, pair.lease_namespace)
    assert spec["leaseDurationSeconds"] == LEASE_DURATION_S
    # The pod name (here the host name) and a random suffix: never the same twice.
    for process in pair.both:
        assert re.fullmatch(r".+_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                            identity(process))  # fmt: skip
    assert identity(leader) != identity(follower)
    # Started together, their built-in quota probes shared one namespace: both concluded.
    for process in pair.both:
        log = process.log_text(tail=10_000)
        assert "the cluster's built-in quota system is off. " in log, log
        assert "could not tell whether" not in log, log
    assert "leads: quota controller, PodSet controller" in leader.log_text(tail=10_000)
    assert "leads:" not in follower.log_text(tail=10_000)

    await create_quota(api, namespace, {"pods": "2"})
    # Straight to each replica's webhook: the follower judges and charges on its own, and
    # each sees the other's reservation (compare-and-swap on the quota's status).
    first = await review(plane, pair, follower, namespace, "one")
    assert first["allowed"] is True, first
    await eventually(lambda: used(api, namespace), until=lambda u: u == {"pods": "1"})
    second = await review(plane, pair, leader, namespace, "two")
    assert second["allowed"] is True, second
    await eventually(lambda: used(api, namespace), until=lambda u: u == {"pods": "2"})
    for process in (follower, leader):
        third = await review(plane, pair, process, namespace, "three")
        assert third["allowed"] is False, third
        assert third["status"]["message"] == exceeded(2)

    # Through the API server: the configuration sends reviews to the leader.
    with pytest.raises(client.ApiException) as denied:
        await client.CoreV1Api(api).create_namespaced_pod(namespace, pod("four"))
    assert json.loads(denied.value.body)["message"] == DENIED + exceeded(2)


async def test_a_podset_is_scaled_by_the_leader_alone(
    plane: ControlPlane, pair: Pair, api: client.ApiClient, namespace: str
) -> None:
    await decided(plane, pair)
    watch = OwnedPodWatch(api, namespace, PODSET, "web", ceiling=30)
    await watch.start()
    try:
        await PODSET.create(api, namespace, "web", 0)
        await PODSET.scale(api, namespace, "web", 30, subresource=True)
        await watch.until(30, within=60)
        await watch.stable(30, 3.0)
    finally:
        await watch.stop()
    assert watch.violations == []
    assert watch.max_seen == 30
    await eventually(
        lambda: PODSET.get(api, namespace, "web"),
        until=lambda o: (o.get("status") or {}).get("replicas") == 30,
        what="PodSet status.replicas 30",
    )
    await create_quota(api, namespace, {"pods": "100"})
    assert await used(api, namespace) == {"pods": "30"}


async def test_the_follower_takes_over_from_a_killed_leader(
    plane: ControlPlane, pair: Pair, api: client.ApiClient, namespace: str
) -> None:
    leader, follower = await decided(plane, pair)
    # The quota first: pods created while it is new may be neither charged nor counted until
    # the next resync (upstream's race as well).
    await create_quota(api, namespace, {"pods": "10"})
    await PODSET.create(api, namespace, "web", 2)
    await eventually(lambda: used(api, namespace), until=lambda u: u == {"pods": "2"})

    assert leader.process is not None
    leader.process.send_signal(signal.SIGKILL)
    leader.process.wait()
    killed = time.monotonic()
    new = identity(follower)
    await eventually(
        lambda: asyncio.to_thread(lease, plane, pair.lease_namespace),
        until=lambda spec: spec.get("holderIdentity") == new,
        within=FAILOVER_BOUND_S,
        interval=0.05,
        what="the follower holding the Lease",
    )
    took = time.monotonic() - killed
    print(f"failover after kill -9: {took:.2f} s (lease duration {LEASE_DURATION_S} s)")
    assert took >= LEASE_DURATION_S - 2 * RETRY_PERIOD_S, "taken before the lease expired"
    assert lease(plane, pair.lease_namespace)["leaseTransitions"] == 1
    await eventually(
        lambda: asyncio.to_thread(
            webhook_ports, plane.bin_dir, plane.kubeconfig, pair.configuration
        ),
        until=lambda ports: ports == {follower.webhook_port},
        what="the configuration pointing at the new leader",
    )

    # The new leader reconciles: a scale-up, quota usage after a delete and a create.
    await PODSET.scale(api, namespace, "web", 5, subresource=True)
    await eventually(
        lambda: PODSET.owned_pods(api, namespace, "web"),
        until=lambda pods: len(pods) == 5,
        what="5 pods",
    )
    await eventually(lambda: used(api, namespace), until=lambda u: u == {"pods": "5"})
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(namespace, pod("extra"))
    await eventually(lambda: used(api, namespace), until=lambda u: u == {"pods": "6"})
    await core.delete_namespaced_pod("extra", namespace)
    await eventually(lambda: used(api, namespace), until=lambda u: u == {"pods": "5"})
    await asyncio.sleep(1.0)
    assert len(await PODSET.owned_pods(api, namespace, "web")) == 5


async def test_a_graceful_stop_releases_the_lease_at_once(plane: ControlPlane, pair: Pair) -> None:
    leader, follower = await decided(plane, pair)
    new = identity(follower)
    assert 0 == await asyncio.to_thread(leader.stop)
    stopped = time.monotonic()
    # Released before the process ended: the Lease no longer names the old leader.
    assert lease(plane, pair.lease_namespace).get("holderIdentity") in ("", new)
    assert "released lease" in leader.log_text(tail=10_000)
    await eventually(
        lambda: asyncio.to_thread(lease, plane, pair.lease_namespace),
        until=lambda spec: spec.get("holderIdentity") == new,
        within=RELEASE_BOUND_S,
        interval=0.05,
        what="the follower holding the Lease",
    )
    print(f"takeover after a graceful stop: {time.monotonic() - stopped:.2f} s after exit")


async def test_a_leader_that_finds_another_holder_stops_and_exits(
    plane: ControlPlane, pair: Pair
) -> None:
    leader, follower = await decided(plane, pair)
    # Someone else's lease, valid for an hour: the follower must not take it either.
    patch = {"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 3600}}
    plane.kubectl(
        "patch", "lease", LEASE, "-n", pair.lease_namespace, "--type=merge",
        "-p", json.dumps(patch),
    )  # fmt: skip
    assert leader.process is not None
    returncode = await asyncio.to_thread(leader.process.wait, 3 * RENEW_DEADLINE_S)
    assert returncode == 0
    log = leader.log_text(tail=10_000)
    assert "leader election lost: the lease is held by intruder" in log
    assert "stopped leading (the lease is held by intruder); controllers stopped, exiting" in log
    await asyncio.sleep(2 * LEASE_DURATION_S)
    assert follower.running
    assert lease(plane, pair.lease_namespace)["holderIdentity"] == "intruder"
    gauge = leader_gauge(follower)
    assert gauge is not None
    assert gauge[1] == 0.0


# -- both replicas answering reviews behind a round-robin balancer


CQ_CRD = Path(__file__).resolve().parents[2] / "crds" / "clusterquotas.tally.dev.yaml"


@pytest_asyncio.fixture
async def balanced(
    plane: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> AsyncIterator[tuple[Pair, RoundRobinBalancer]]:
    """Two replicas whose webhook configuration names a round-robin balancer in front of
    both (``TALLY_WEBHOOK_URL_PORT``), as a Service in front of the Deployment's pods."""
    plane.kubectl("apply", "-f", str(CQ_CRD))
    plane.kubectl(
        "wait", "--for=condition=Established", "crd/clusterquotas.tally.dev", "--timeout=60s"
    )
    started: list[TallyProcess] = []
    balancer = RoundRobinBalancer(lambda: [p.webhook_port for p in started if p.webhook_port])
    await balancer.start()
    try:
        async with replicas(
            plane, api, tmp_path, TALLY_WEBHOOK_URL_PORT=str(balancer.port)
        ) as made:
            started.extend(made.both)
            await decided_behind(plane, made, balancer)
            yield made, balancer
    finally:
        await balancer.close()


async def decided_behind(plane: ControlPlane, pair: Pair, balancer: RoundRobinBalancer) -> None:
    """Once one replica leads and the configuration names the balancer."""
    await eventually(
        lambda: asyncio.to_thread(lambda: [leader_gauge(p) for p in pair.both]),
        until=lambda gauges: sorted(str(g and g[1]) for g in gauges) == ["0.0", "1.0"],
        what="one leader",
    )
    await eventually(
        lambda: asyncio.to_thread(
            webhook_ports, plane.bin_dir, plane.kubeconfig, pair.configuration
        ),
        until=lambda ports: ports == {balancer.port},
        what="the configuration naming the balancer",
    )


async def burst(
    api: client.ApiClient, spread: list[str], count: int
) -> tuple[int, list[tuple[int, str]]]:
    """``count`` pod creates at once, round the namespaces of ``spread``; (created, refusals
    as (status, message))."""
    core = client.CoreV1Api(api)
    refusals: list[tuple[int, str]] = []

    async def create(index: int) -> None:
        try:
            await core.create_namespaced_pod(spread[index % len(spread)], pod(f"p{index}"))
        except client.ApiException as error:
            refusals.append((error.status, json.loads(error.body)["message"]))

    await asyncio.gather(*(create(index) for index in range(count)))
    created = 0
    for namespace in sorted(set(spread)):
        created += len((await core.list_namespaced_pod(namespace)).items)
    return created, refusals


async def fresh_namespace(api: client.ApiClient, **labels: str) -> str:
    name = f"e2e-lb-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespace(
        {"metadata": {"name": name, "labels": {"tally.dev/e2e": "true", **labels}}}
    )
    await wait_for_default_service_account(api, name)
    return name


async def test_behind_a_balancer_every_create_gets_a_decision_and_none_over_admits(
    plane: ControlPlane, api: client.ApiClient, balanced: tuple[Pair, RoundRobinBalancer]
) -> None:
    # Both replicas judge reviews and charge the same quota status, compare-and-swap: their
    # writes race. A lost write is retried against the stored copy, so every request ends in
    # an admission or the quota's own refusal, never in the 409 of a lost race.
    pair, balancer = balanced
    core = client.CoreV1Api(api)
    made: list[str] = []
    try:
        # 4 bursts of 120 pod creates against a ResourceQuota of 30 pods.
        for _ in range(4):
            namespace = await fresh_namespace(api)
            made.append(namespace)
            await create_quota(api, namespace, {"pods": "30"})
            created, refusals = await burst(api, [namespace], 120)
            assert 30 == created
            expected = "exceeded quota: q, requested: pods=1, used: pods=30, limited: pods=30"
            assert [(403, True)] * 90 == [(s, expected in m) for s, m in refusals], refusals
        # 3 bursts of 200 pod creates over 10 namespaces under a ClusterQuota of 50 pods.
        custom = client.CustomObjectsApi(api)
        for round_ in range(3):
            team = uuid.uuid4().hex[:8]
            spread = [await fresh_namespace(api, team=team) for _ in range(10)]
            made.extend(spread)
            name = f"cq-lb-{team}"
            await custom.create_cluster_custom_object(
                "tally.dev", "v1alpha1", "clusterquotas",
                {"apiVersion": "tally.dev/v1alpha1", "kind": "ClusterQuota",
                 "metadata": {"name": name},
                 "spec": {"namespaceSelector": {"matchLabels": {"team": team}},
                          "quota": {"hard": {"pods": "50"}}}},
            )  # fmt: skip
            try:
                await eventually(
                    functools.partial(
                        custom.get_cluster_custom_object,
                        "tally.dev",
                        "v1alpha1",
                        "clusterquotas",
                        name,
                    ),
                    until=lambda cq: (
                        ((cq.get("status") or {}).get("total") or {}).get("used") == {"pods": "0"}
                    ),
                    what="the ClusterQuota's first status",
                )
                created, refusals = await burst(api, spread, 200)
                assert 50 == created, round_
                expected = (
                    f"exceeded cluster quota: {name}, requested: pods=1, used: pods=50, "
                    "limited: pods=50"
                )
                assert [(403, True)] * 150 == [(s, expected in m) for s, m in refusals], refusals
            finally:
                await custom.delete_cluster_custom_object(
                    "tally.dev", "v1alpha1", "clusterquotas", name
                )
        # Both replicas answered reviews (the balancer spread the connections), and their
        # writes did race: what was retried is counted.
        answered = [p.metric_sum("tally_admission_requests_total") for p in pair.both]
        conflicts = [p.metric_sum("tally_admission_write_conflicts_total") for p in pair.both]
        print(f"connections per replica: {dict(balancer.connections)}; reviews answered: "
              f"{answered}; lost compare-and-swaps retried: {conflicts}")  # fmt: skip
        assert all(count > 0 for count in answered), answered
    finally:
        for namespace in made:
            with contextlib.suppress(client.ApiException):
                await core.delete_namespace(namespace)
