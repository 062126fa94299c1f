"""Reviews reach tally through its Service, as in a cluster: only replicas that report ready get
them, and a replica that stops leaves the Service before its webhook closes.

Elsewhere tally's webhook configuration names a URL (the process's own port, or a balancer in
front of two); a Service, the pods' readiness and the EndpointSlices are what a deployed tally
has instead, and what the readiness endpoint (``tally.app.readiness``) and the Deployment's
``preStop`` sleep are for. Here the chain is upstream's own, on a control plane of its own:
kube-apiserver with ``--enable-aggregator-routing=true`` (it sends a webhook's reviews to a
ready endpoint of the named Service; nothing here can run kube-proxy for a ClusterIP),
kube-controller-manager's EndpointSlice controller, and a kubelet for the replicas played by
:mod:`host_kubelet` (their pods' IP, ``Ready`` from their ``/readyz``, the deletion sequence).
Both replicas are configured as the Deployment's pods are: leader election, the Service client
config (``TALLY_WEBHOOK_SERVICE``), the certificate in one Secret, the configuration kept on
exit, the ServiceAccount's token under the shipped RBAC.

One rollout, as ``maxSurge: 1, maxUnavailable: 0`` runs it, with bursts of concurrent pod
creates throughout (each burst opens new connections, and each new connection is routed):

1. replica A starts alone and leads; creates are admitted once its pod is ready;
2. replica B starts (the surge). Its webhook serves from synced caches tens of seconds before
   it reports ready (readiness waits for Kopf's replay, the start-up re-list and a prompt
   window): at the moment its pod turns ready, B has answered **no** review, though hundreds
   were sent meanwhile over connections the API server dialled then (counted on A's side:
   about 200 on this machine). Once ready it gets its share;
3. A, the leader, is deleted: ``preStop`` sleep, SIGTERM, exit. B takes over the Lease.

Every create of the whole run gets a decision (admitted: the quota is far off), none fails for
want of a webhook, and the quota's ``status.used`` ends equal to the pods that exist: each
create charged once across two replicas and a change of leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest
from host_kubelet import HostKubelet, Replica, host_address
from kubernetes_asyncio import client
from operator_process import TallyProcess, established_connections

import builders
import cluster
from tally_e2e import (
    ControlPlane,
    eventually,
    plane_api,
    plane_of_its_own,
    wait_for_default_service_account,
)

ROUTING: Final = ("--enable-aggregator-routing=true",)
SERVICE: Final = "tally-webhook"
SERVICE_PORT: Final = 443
APP: Final = {"app.kubernetes.io/name": "tally"}
BURST: Final = 40
"""Concurrent creates per burst: more than the 25 connections the API server's webhook client
keeps idle (client-go's transport), so that each burst dials new connections, and each new
connection is routed to a ready endpoint; fewer would be served by the same idle connections
throughout, and no routing would happen."""
BURST_PERIOD_S: Final = 2.0
READY_WITHIN_S: Final = 120.0
REQUESTS: Final = "tally_admission_requests_total"
QUOTA_PODS: Final = "100000"


@pytest.fixture(scope="module")
def routed_plane() -> Iterator[ControlPlane]:
    with plane_of_its_own(Path(tempfile.mkdtemp(prefix="tally-e2e-routing-")), *ROUTING) as plane:
        yield plane


@dataclass
class Creates:
    """Bursts of pod creates in ``namespace`` until stopped; every outcome kept, in order."""

    api: client.ApiClient
    namespace: str
    outcomes: list[tuple[float, str | None]] = field(default_factory=list)
    """(monotonic time sent, None if created or the error)."""
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        core = client.CoreV1Api(self.api)

        async def create() -> None:
            sent = time.monotonic()
            try:
                await core.create_namespaced_pod(
                    self.namespace, builders.pod(None, generate_name="routed-", container_name="c")
                )
            except client.ApiException as error:
                self.outcomes.append((sent, f"{error.status}: {error.body}"))
            else:
                self.outcomes.append((sent, None))

        while not self._stop.is_set():
            await asyncio.gather(*(create() for _ in range(BURST)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), BURST_PERIOD_S)

    def failures(self) -> list[str]:
        return [error for _, error in self.outcomes if error is not None]

    def sent_between(self, start: float, end: float) -> int:
        return sum(1 for sent, _ in self.outcomes if start <= sent < end)


@dataclass
class Accepted:
    """The connections a replica's webhook accepted, sampled every 0.1 s while running (a
    connection opened and closed between two samples is missed: a lower bound)."""

    process: TallyProcess
    seen: set[str] = field(default_factory=set)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        popen = self.process.process
        assert popen is not None
        while True:
            with contextlib.suppress(OSError):
                self.seen |= await asyncio.to_thread(
                    established_connections, popen.pid, local_port=self.process.webhook_port
                )
            await asyncio.sleep(0.1)


def _replica_process(plane: ControlPlane, own: str, address: str, log: Path) -> TallyProcess:
    """A replica configured as the Deployment's pods are, listening on ``address`` (its pod's
    IP) at a port of its own (a named container port, resolved per pod)."""
    return TallyProcess(
        plane.kubeconfig,
        log,
        bin_dir=plane.bin_dir,
        env={
            "TALLY_NAMESPACE": own,
            "TALLY_LEADER_ELECTION": "true",
            "TALLY_WEBHOOK_SERVICE": f"{own}/{SERVICE}:{SERVICE_PORT}",
            "TALLY_WEBHOOK_CERT_SECRET": f"{own}/tally-webhook-tls",
            "TALLY_WEBHOOK_REMOVE_ON_EXIT": "false",
            "TALLY_WEBHOOK_CONFIG_NAME": f"{own}.tally.dev",
            "TALLY_WEBHOOK_ADDR": address,
            "TALLY_WEBHOOK_PORT": str(cluster.free_port()),
        },
    )


async def _ready(replica: Replica) -> None:
    async def state() -> tuple[bool, bool]:
        return replica.ready, replica.process.running

    ready, _ = await eventually(
        state, until=lambda s: s[0] or not s[1], within=READY_WITHIN_S,
        interval=0.5, what=f"{replica.name} ready",
    )  # fmt: skip
    assert ready, f"{replica.name} exited:\n{replica.process.log_text()}"


async def _create_one(api: client.ApiClient, namespace: str) -> bool:
    try:
        await client.CoreV1Api(api).create_namespaced_pod(
            namespace, builders.pod(None, generate_name="first-", container_name="c")
        )
    except client.ApiException:
        return False
    return True


async def _used_pods(api: client.ApiClient, namespace: str) -> tuple[str | None, int]:
    core = client.CoreV1Api(api)
    quota = await core.read_namespaced_resource_quota("q", namespace)
    pods = await core.list_namespaced_pod(namespace)
    return ((quota.status and quota.status.used) or {}).get("pods"), len(pods.items)


async def test_a_rollout_routes_reviews_to_ready_replicas_only(
    routed_plane: ControlPlane, tmp_path: Path
) -> None:
    plane = routed_plane
    address = host_address()
    own = f"tally-routing-{uuid.uuid4().hex[:6]}"
    users = f"routed-{uuid.uuid4().hex[:6]}"
    async with plane_api(plane) as api:
        core = client.CoreV1Api(api)
        for namespace in (own, users):
            await core.create_namespace({"metadata": {"name": namespace}})
            await wait_for_default_service_account(api, namespace)
        await core.create_namespaced_service(
            own,
            {
                "metadata": {"name": SERVICE},
                "spec": {
                    "selector": APP,
                    "ports": [{"name": "https", "port": SERVICE_PORT, "targetPort": "webhook"}],
                },
            },
        )
        await core.create_namespaced_resource_quota(
            users, {"metadata": {"name": "q"}, "spec": {"hard": {"pods": QUOTA_PODS}}}
        )
        kubelet = HostKubelet(api, f"host-{uuid.uuid4().hex[:6]}", address)
        await kubelet.register()
        creates = Creates(api, users)
        accepted_by_a: Accepted | None = None
        processes: list[TallyProcess] = []
        try:
            # 1. A alone: it leads, registers the Service client config, and is routed to once
            #    its pod is ready.
            a = await kubelet.run(
                own, "tally-a", APP, _replica_process(plane, own, address, tmp_path / "a.log")
            )
            processes.append(a.process)
            await _ready(a)
            registered = json.loads(
                plane.kubectl("get", f"validatingwebhookconfiguration/{own}.tally.dev",
                              "-o", "json").stdout
            )  # fmt: skip
            refs = [w["clientConfig"]["service"] for w in registered["webhooks"]]
            services = {(ref["namespace"], ref["name"], ref["port"]) for ref in refs}
            assert {(own, SERVICE, SERVICE_PORT)} == services
            # The first create admitted once the API server sees A's endpoint ready (one that
            # came before would fail: the Service had none).
            await eventually(
                lambda: _create_one(api, users), until=bool, within=30,
                what="a create admitted through the Service",
            )  # fmt: skip
            creates.start()
            accepted_by_a = Accepted(a.process)
            accepted_by_a.start()
            await eventually(
                lambda: asyncio.to_thread(a.process.metric_sum, REQUESTS),
                until=lambda answered: answered > 0, within=60, what="reviews routed to A",
            )  # fmt: skip

            # 2. B surges: serving long before it is ready, and sent nothing until then.
            b = await kubelet.run(
                own, "tally-b", APP, _replica_process(plane, own, address, tmp_path / "b.log")
            )
            processes.append(b.process)
            answered_when_ready: list[float] = []
            b.became_ready.append(
                lambda: answered_when_ready.append(b.process.metric_sum(REQUESTS))
            )
            listening = await eventually(
                lambda: asyncio.to_thread(lambda: (b.process.webhook_listening(), b.ready)),
                until=lambda s: s[0], within=READY_WITHIN_S, what="B's webhook serving",
            )  # fmt: skip
            assert listening == (True, False), "B was ready before its webhook served"
            serving_since = time.monotonic()
            before = set(accepted_by_a.seen)
            await _ready(b)
            ready_at = time.monotonic()
            dialled = accepted_by_a.seen - before
            sent_meanwhile = creates.sent_between(serving_since, ready_at)
            served = ready_at - serving_since
            print(f"B served {served:.1f} s before it was ready; creates sent meanwhile: "
                  f"{sent_meanwhile}; B had answered: {answered_when_ready}; connections "
                  f"dialled to A meanwhile: {len(dialled)}")  # fmt: skip
            # The window proves something only if reviews were routed during it: creates sent,
            # and new connections dialled for them (each routed to a ready endpoint; were B
            # one, about half would have reached it).
            assert sent_meanwhile >= 5 * BURST, sent_meanwhile
            assert len(dialled) >= sent_meanwhile // BURST, len(dialled)
            assert answered_when_ready == [0.0]
            await eventually(
                lambda: asyncio.to_thread(b.process.metric_sum, REQUESTS),
                until=lambda answered: answered > 0, within=60, what="reviews routed to B",
            )  # fmt: skip

            # 3. The old replica, the leader, is deleted as the rollout deletes it.
            status = await kubelet.delete(a)
            assert status == 0, a.process.log_text()
            stopped_at = time.monotonic()
            await asyncio.sleep(3.0)
            await creates.stop()
            assert creates.sent_between(stopped_at, time.monotonic()) > 0
            assert creates.failures() == [], creates.failures()[:5]
            print(f"creates: {len(creates.outcomes)}, all admitted")

            # Every create charged exactly once: B's controllers, now leading, agree.
            expected = len(creates.outcomes) + 1
            await eventually(
                lambda: _used_pods(api, users),
                until=lambda found: found == (str(expected), expected),
                within=60, what="status.used equal to the pods created",
            )  # fmt: skip
        finally:
            await creates.stop()
            if accepted_by_a is not None:
                await accepted_by_a.stop()
            await kubelet.close()
            await asyncio.gather(*(asyncio.to_thread(p.kill) for p in processes))
            plane.kubectl("delete", f"validatingwebhookconfiguration/{own}.tally.dev",
                          "--ignore-not-found", check=False)  # fmt: skip
            for namespace in (own, users):
                plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
