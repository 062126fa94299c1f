"""Helpers for end-to-end tests: polling, kubectl, and playing the kubelet where a test must.

The test planes have kube-scheduler and simulated nodes (kwok), so pods run as a cluster's do.
A test that needs a status no kubelet would produce on cue (a Ready condition from five minutes
ago, a resize the node could not make) creates its pod with ``builders.NO_SCHEDULER``, so it
stays unbound, and writes the status itself with ``set_pod_status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes_asyncio import client, config

import cluster

T = TypeVar("T")

NODES = int(os.environ.get("TALLY_E2E_NODES", str(cluster.DEFAULT_NODES)))
"""Simulated nodes of the session's control planes (``hack/cluster.py up --nodes``):
kube-scheduler binds every pod and kwok runs it as a kubelet would, so tally's pod watch sees
the events a cluster's pods make. A test that writes a pod's status itself creates it unbound
(``builders.NO_SCHEDULER``). ``TALLY_E2E_NODES=0``: planes without them (pods stay Pending)."""


@dataclass(frozen=True)
class RunningOperator:
    """A ``kopf run operator/main.py`` subprocess and where to observe it."""

    process: subprocess.Popen[bytes]
    liveness_url: str
    log: Path
    metrics_url: str
    webhook_client: tuple[Path, Path] | None = None
    """A client certificate and key tally's webhook accepts (the API server's); None: it
    requires none."""

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass(frozen=True)
class ControlPlane:
    """A running control plane as tests see it."""

    kubeconfig: Path
    mode: str
    bin_dir: Path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the kubectl built at the control plane's version against this control plane."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )


def token_kubeconfig(plane: ControlPlane, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig for the service account (a TokenRequest token, one hour), its namespace the
    context's: what a namespace's user holds, with no rights but those bound to the account."""
    token = plane.kubectl("create", "token", account, "-n", namespace, "--duration=1h")
    admin = yaml.safe_load(plane.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": server["server"],
            "certificate-authority-data": server["certificate-authority-data"]}}],
        "users": [{"name": account, "user": {"token": token.stdout.strip()}}],
        "contexts": [{"name": "reader", "context": {
            "cluster": "local", "user": account, "namespace": namespace}}],
        "current-context": "reader",
    }  # fmt: skip
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def plane_of_its_own(directory: Path, *apiserver_args: str) -> Iterator[ControlPlane]:
    """An operator-mode control plane in ``directory``, with the session planes' nodes and
    ``apiserver_args`` added to kube-apiserver's flags; stopped and removed after."""
    try:
        state = cluster.up(directory, "operator", extra_apiserver_args=apiserver_args, nodes=NODES)
        yield ControlPlane(Path(state.kubeconfig), "operator", Path(state.bin_dir))
    finally:
        cluster.down(directory, clean=True, quiet=True)


async def api_client(plane: ControlPlane) -> client.ApiClient:
    """A client of ``plane`` with its kubeconfig's (administrator) credentials."""
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(plane.kubeconfig), client_configuration=configuration
    )
    return client.ApiClient(configuration)


@contextlib.asynccontextmanager
async def plane_api(plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """:func:`api_client`, closed after."""
    api = await api_client(plane)
    try:
        yield api
    finally:
        await api.close()


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    until: Callable[[T], bool],
    within: float = 30.0,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until ``until(result)``; raise AssertionError with the last result."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = await probe()
        if until(result):
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}; last: {result!r}")
        await asyncio.sleep(interval)


async def wait_for_default_service_account(api: client.ApiClient, namespace: str) -> None:
    """Pods are rejected until the namespace's ``default`` service account exists."""
    core = client.CoreV1Api(api)

    async def names() -> set[str]:
        accounts = await core.list_namespaced_service_account(namespace)
        return {account.metadata.name for account in accounts.items}

    await eventually(names, until=lambda found: "default" in found, what="default SA")


async def wait_for_root_ca_configmap(api: client.ApiClient, namespace: str) -> None:
    """kube-controller-manager's root-ca-cert-publisher creates ``kube-root-ca.crt`` in every
    new namespace. Its create passes tally's quota webhook (configmaps are quota-tracked), so
    it often lands after the default service account: a test that counts configmaps must
    not start before it, or it sees a configmap appear that the test did not create. (Not
    part of the namespace fixture: with a dead fail-closed webhook left registered on
    purpose, as test_manifests does, the map is never created.)"""
    core = client.CoreV1Api(api)

    async def names() -> set[str]:
        maps = await core.list_namespaced_config_map(namespace)
        return {item.metadata.name for item in maps.items}

    await eventually(names, until=lambda found: "kube-root-ca.crt" in found, what="root CA map")


def _timestamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def set_pod_status(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    phase: str = "Running",
    ready: bool = True,
    since: datetime.datetime | None = None,
    restart_counts: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Write what a kubelet would: ``phase``, Ready/ContainersReady conditions, container states.

    ``since`` is when the pod became (not) ready, the Ready condition's lastTransitionTime
    (default now); PodSet's minReadySeconds and deletion ranking read it. Returns the pod as
    the API server stored it.

    Only for a pod no node runs (``builders.NO_SCHEDULER``): a bound pod's status is its
    kubelet's, which would overwrite this one whenever it next writes.
    """
    core = client.CoreV1Api(api)
    pod = await core.read_namespaced_pod(name, namespace)
    if pod.spec.node_name:
        raise AssertionError(
            f"pod {namespace}/{name} is bound to {pod.spec.node_name}, whose kubelet writes its "
            "status: create it with schedulerName builders.NO_SCHEDULER to write it here"
        )
    moment = since or datetime.datetime.now(datetime.UTC)
    condition = "True" if ready else "False"
    containers = pod.spec.containers
    counts = list(restart_counts) if restart_counts is not None else [0] * len(containers)
    running = phase == "Running"
    body = {
        "status": {
            "phase": phase,
            "startTime": _timestamp(moment),
            "conditions": [
                {"type": "PodScheduled", "status": "True",
                 "lastTransitionTime": _timestamp(moment)},
                {"type": "Initialized", "status": "True",
                 "lastTransitionTime": _timestamp(moment)},
                {"type": "ContainersReady", "status": condition,
                 "lastTransitionTime": _timestamp(moment)},
                {"type": "Ready", "status": condition, "lastTransitionTime": _timestamp(moment)},
            ],
            "containerStatuses": [
                {
                    "name": container.name,
                    "image": container.image,
                    "imageID": "",
                    "ready": ready and running,
                    "started": running,
                    "restartCount": count,
                    "state": {"running": {"startedAt": _timestamp(moment)}}
                    if running
                    else {"waiting": {"reason": "ContainerCreating"}},
                }
                for container, count in zip(containers, counts, strict=True)
            ],
        }
    }  # fmt: skip
    response = await core.patch_namespaced_pod_status(
        name,
        namespace,
        body,
        _content_type="application/merge-patch+json",
        _preload_content=False,
    )
    # The raw JSON, timestamps exactly as the API server stores them.
    return dict(json.loads(await response.read()))
