"""A kubelet for tally replicas that run as processes on this machine, so that a Service routes
to them as it routes to the Deployment's pods.

The control plane's Service machinery is upstream's own: kube-controller-manager's EndpointSlice
controller puts a pod in its Service's slices from the pod's IP and its ``Ready`` condition, and
an API server started with ``--enable-aggregator-routing=true`` sends a webhook's reviews to a
ready endpoint of the Service its configuration names (a random one per new connection; what
kube-proxy does for a ClusterIP, which nothing here can run). What a node's kubelet does for a
pod is played here, for replicas whose "container" is a :class:`TallyProcess`:

* the node: a ``Node`` kwok does not manage (no kwok annotation; tainted so that the scheduler
  puts no other pod on it), its ``Ready`` condition, and its Lease in ``kube-node-lease``
  renewed every few seconds, so that the node lifecycle controller never marks its pods not
  ready;
* each pod: bound to that node, with the container ports the Deployment names (the Service's
  ``targetPort`` is the port's name, resolved per pod), ``Running`` with the machine's address as
  its IP (the API server refuses loopback addresses in an EndpointSlice);
* the readiness probe: the replica's ``/readyz`` every :data:`PROBE_PERIOD_S`, its result
  written to the pod's ``Ready`` condition;
* a deletion, as the kubelet runs it: the pod marked for deletion, the ``preStop`` sleep, then
  SIGTERM to the process, and once it exited the pod removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import yaml
from kubernetes_asyncio import client
from operator_process import MANIFESTS, TallyProcess

PROBE_PERIOD_S: Final = 1.0
"""Between readiness probes (the Deployment says 2 s; shorter here, the test waits less)."""
LEASE_RENEW_S: Final = 5.0
"""Between renewals of the node's Lease (a kubelet renews every 10 s, of 40)."""


def _deployment_pod_spec() -> dict[str, Any]:
    deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
    return dict(deployment["spec"]["template"]["spec"])


_POD_SPEC: Final = _deployment_pod_spec()
PRE_STOP_S: Final = float(_POD_SPEC["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"])
"""The Deployment's ``preStop`` sleep, as ``manifests/deployment.yaml`` says."""
STOP_WITHIN_S: Final = float(_POD_SPEC["terminationGracePeriodSeconds"])
"""The Deployment's termination grace (SIGKILL past it), as ``manifests/deployment.yaml`` says."""
HOST_TAINT: Final = {"key": "tally.dev/e2e-host", "value": "true", "effect": "NoSchedule"}


def host_address() -> str:
    """This machine's address on its default route: where a replica listens for the API
    server, and its pod's IP. Loopback is refused in an EndpointSlice, so a machine without
    another address cannot run these tests (an AssertionError says so)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            # No packet is sent: connecting a UDP socket only picks the route and the source.
            probe.connect(("198.51.100.1", 9))
        except OSError as error:
            raise AssertionError(
                "routing reviews through a Service needs an IPv4 address other than loopback (the "
                f"API server refuses 127.0.0.0/8 endpoints); this machine has no route: {error}"
            ) from None
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), f"the default route's address is loopback: {address}"
    return address


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Replica:
    """A replica's pod and its process, with what the kubelet saw of it."""

    name: str
    namespace: str
    process: TallyProcess
    ready: bool = False
    became_ready: list[Callable[[], None]] = field(default_factory=list)
    """Called just before the pod's ``Ready`` turns true (a test samples metrics there: nothing
    can be routed to the replica before the condition is written)."""
    probe: asyncio.Task[None] | None = None


class HostKubelet:
    """The node ``node`` (this machine at ``address``) and the replicas' pods on it."""

    def __init__(self, api: client.ApiClient, node: str, address: str) -> None:
        self.core = client.CoreV1Api(api)
        self.leases = client.CoordinationV1Api(api)
        self.node = node
        self.address = address
        self._renewing: asyncio.Task[None] | None = None
        self.replicas: list[Replica] = []

    # -- the node

    async def register(self) -> None:
        """The Node, Ready, and its Lease renewed from now on."""
        await self.core.create_node(
            {
                "metadata": {
                    "name": self.node,
                    "labels": {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux"},
                },
                "spec": {"taints": [HOST_TAINT]},
            }
        )
        now = _now()
        await self.core.patch_node_status(
            self.node,
            {
                "status": {
                    "addresses": [{"type": "InternalIP", "address": self.address}],
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady",
                         "message": "tally's e2e host kubelet", "lastHeartbeatTime": now,
                         "lastTransitionTime": now},
                    ],
                }
            },
        )  # fmt: skip
        await self.leases.create_namespaced_lease(
            "kube-node-lease",
            {
                "metadata": {"name": self.node},
                "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40,
                         "renewTime": now},
            },
        )  # fmt: skip
        self._renewing = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(LEASE_RENEW_S)
            with contextlib.suppress(client.ApiException):
                await self.leases.patch_namespaced_lease(
                    self.node, "kube-node-lease", {"spec": {"renewTime": _now()}}
                )

    async def close(self) -> None:
        """Stop probing and renewing; the node and its Lease deleted (what is left of the pods
        goes with their namespace)."""
        tasks = [t for t in (self._renewing, *(r.probe for r in self.replicas)) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(client.ApiException):
            await self.leases.delete_namespaced_lease(self.node, "kube-node-lease")
        with contextlib.suppress(client.ApiException):
            await self.core.delete_node(self.node)

    # -- the replicas' pods

    async def run(
        self, namespace: str, name: str, labels: dict[str, str], process: TallyProcess
    ) -> Replica:
        """The pod ``name`` for ``process`` (spawned here, as its container), Running and not
        ready; probed from now on. ``process`` must listen on :attr:`address`, at the webhook
        port its ``TALLY_WEBHOOK_PORT`` says."""
        webhook_port = int(process.extra_env["TALLY_WEBHOOK_PORT"])
        await self.core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "nodeName": self.node,
                    "tolerations": [{**HOST_TAINT, "operator": "Equal"}],
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "tally",
                            "image": "tally:e2e",
                            "ports": [{"name": "webhook", "containerPort": webhook_port}],
                        }
                    ],
                },
            },
        )
        replica = Replica(name, namespace, process)
        await self._write_status(replica, ready=False)
        await asyncio.to_thread(process.spawn)
        replica.probe = asyncio.create_task(self._probe(replica))
        self.replicas.append(replica)
        return replica

    async def _probe(self, replica: Replica) -> None:
        while True:
            ready = await asyncio.to_thread(replica.process.ready)
            if ready != replica.ready:
                if ready:
                    for hook in replica.became_ready:
                        hook()
                await self._write_status(replica, ready=ready)
                replica.ready = ready
            await asyncio.sleep(PROBE_PERIOD_S)

    async def _write_status(self, replica: Replica, *, ready: bool) -> None:
        now = _now()
        flag = "True" if ready else "False"
        conditions: list[dict[str, Any]] = [
            {"type": kind, "status": status, "lastTransitionTime": now}
            for kind, status in (
                ("PodScheduled", "True"),
                ("Initialized", "True"),
                ("ContainersReady", flag),
                ("Ready", flag),
            )
        ]
        await self.core.patch_namespaced_pod_status(
            replica.name,
            replica.namespace,
            {
                "status": {
                    "phase": "Running",
                    "hostIP": self.address,
                    "hostIPs": [{"ip": self.address}],
                    "podIP": self.address,
                    "podIPs": [{"ip": self.address}],
                    "conditions": conditions,
                }
            },
        )

    async def delete(self, replica: Replica) -> int:
        """The pod deleted as a rollout or a drain deletes it, and the kubelet's part: the
        probe stops (a terminating pod's endpoint is not ready whatever it says), the
        ``preStop`` sleep, SIGTERM, the process's exit awaited (SIGKILL past the grace), then
        the pod removed. Returns the process's exit status."""
        await self.core.delete_namespaced_pod(
            replica.name, replica.namespace, grace_period_seconds=int(STOP_WITHIN_S)
        )
        if replica.probe is not None:
            replica.probe.cancel()
            await asyncio.gather(replica.probe, return_exceptions=True)
        await asyncio.sleep(PRE_STOP_S)
        process = replica.process.process
        assert process is not None
        process.send_signal(signal.SIGTERM)
        try:
            status = await asyncio.wait_for(
                asyncio.to_thread(process.wait), STOP_WITHIN_S - PRE_STOP_S
            )
        except TimeoutError:
            process.kill()
            raise AssertionError(
                f"{replica.name} did not stop within the grace:\n{replica.process.log_text()}"
            ) from None
        await self.core.delete_namespaced_pod(
            replica.name, replica.namespace, grace_period_seconds=0
        )
        return status
