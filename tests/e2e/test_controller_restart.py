"""tally's quota controller across its own restart and across a loss of its watches.

Both tests run on a control plane of their own (operator mode, started here with
``cluster.running`` in a temporary directory), because the watch-loss test restarts its
kube-apiserver, and with a tally process of their own (``operator_process.TallyProcess``),
because they stop it or cut it off mid-test.

* **Restart**: tally is stopped gracefully (it removes its webhook configuration, so creates are
  not charged while it is down); objects are created and deleted, a pod turns Failed,
  ``spec.hard`` changes, a quota is created and one deleted; tally is started again. Every
  quota's status must converge, with no manual action, to what upstream shows for the same steps
  on the reference control plane (and to explicit anchors).
* **Watch loss**: tally talks to its API server through a TCP proxy the test can cut. With the
  proxy cut, objects are deleted; then (one variant) kube-apiserver is restarted, so that the
  watch cache that could replay the missed events is gone: tally's watches resume with a
  resourceVersion the new server no longer serves (410), Kopf re-lists, and only tally's own
  reconciling re-list (``tally.machinery.informers``) can drop the deleted objects. The other
  variant cuts the connections only (the server replays the missed DELETED events). Either way the
  deleted objects must stop counting within ``WATCH_LOSS_BOUND_S`` of the proxy resuming.

The full resync stays at its default (``TALLY_RESYNC_PERIOD`` unset: 300 s), far beyond every
bound here, so no convergence in these tests comes from the periodic resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client, config
from operator_process import TallyProcess

import builders
import cluster
from tally.quota.quantity import parse_quantity
from tally_e2e import NODES, eventually, set_pod_status, wait_for_default_service_account

T = TypeVar("T")

IMAGE = "registry.example/app:1"
LARGE = "1Pi"
FILL_WITHIN_S = 30.0
STABLE_AFTER_S = 2.0
RESTART_CONVERGE_S: Final = 30.0
"""After tally is live again: it LISTs every kind before its workers start, and every quota is
enqueued by its add event, so convergence is a few syncs; 30 s is generous."""
WATCH_LOSS_BOUND_S: Final = 60.0
"""From the proxy resuming: Kopf's reconnect backoff (its retries back off 1, 1, 2, 3, 5, 8,
13, 21 s while the proxy refuses; ≤ 21 s) + tally's re-list spacing
(``MIN_RELIST_INTERVAL_S`` = 30 s since its previous LIST, ``RELIST_DEBOUNCE_S`` = 2 s) + a
sync; 60 s covers the worst case of their sum (≈ 55 s)."""


# -- a control plane of our own, and a cuttable proxy in front of it ------------------------


@pytest.fixture(scope="module")
def own_plane() -> Iterator[cluster.State]:
    directory = Path(tempfile.mkdtemp(prefix="tally-e2e-restart-"))
    try:
        with cluster.running(directory, "operator", nodes=NODES) as state:
            yield state
    finally:
        cluster.down(directory, clean=True, quiet=True)


async def api_client(kubeconfig: str) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)


@pytest_asyncio.fixture(scope="module")
async def own_api(own_plane: cluster.State) -> AsyncIterator[client.ApiClient]:
    api = await api_client(own_plane.kubeconfig)
    yield api
    await api.close()


@pytest_asyncio.fixture
async def own_namespace(own_api: client.ApiClient) -> AsyncIterator[str]:
    core = client.CoreV1Api(own_api)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    await core.create_namespace({"metadata": {"name": name}})
    await wait_for_default_service_account(own_api, name)
    yield name
    with contextlib.suppress(client.ApiException, aiohttp.ClientError):
        await core.delete_namespace(name)


class CuttableProxy:
    """A loopback TCP proxy (TLS passes through untouched) that can drop every connection
    and refuse new ones until resumed. Runs its own event loop in a thread, so blocking calls
    in the test never stall it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = cluster.free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._transports: set[asyncio.BaseTransport] = set()
        self.cut_connections = 0

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    def start(self) -> None:
        self._thread.start()
        self.resume()

    def resume(self) -> None:
        self._call(self._listen())

    def cut(self) -> int:
        """Close the listener and abort every proxied connection; returns how many."""
        return self._call(self._cut())

    def close(self) -> None:
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )

    async def _cut(self) -> int:
        if self._server is not None:
            self._server.close()
            self._server = None
        cut = len(self._transports)
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()
        self.cut_connections += cut
        return cut

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:
            writer.transport.abort()
            return
        ends = {writer.transport, upstream_writer.transport}
        self._transports |= ends

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (OSError, ConnectionError):
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        self._transports -= ends


def proxied_kubeconfig(state: cluster.State, port: int, path: Path) -> Path:
    """The plane's kubeconfig with the server replaced by the proxy (same CA, same client
    certificate; the serving certificate names 127.0.0.1, so TLS still verifies)."""
    kubeconfig = json.loads(Path(state.kubeconfig).read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(json.dumps(kubeconfig))
    path.chmod(0o600)
    return path


@pytest.fixture
def tally_log(tmp_path: Path) -> Path:
    return tmp_path / "tally.log"


# -- reading quotas -------------------------------------------------------------------------


async def read_quotas(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    response = await client.CoreV1Api(api).list_namespaced_resource_quota(
        namespace, _preload_content=False
    )
    items = json.loads(await response.read())["items"]
    return {item["metadata"]["name"]: item for item in items}


async def statuses(api: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    """``{quota: status}``; None while the API cannot be read (a restarted server, a stale
    pooled connection)."""
    try:
        quotas = await read_quotas(api, namespace)
    except (aiohttp.ClientError, client.ApiException, OSError):
        return None
    return {name: q.get("status") or {} for name, q in quotas.items()}


def same_list(a: Mapping[str, str] | None, b: Mapping[str, str] | None) -> bool:
    a, b = a or {}, b or {}
    return set(a) == set(b) and all(parse_quantity(a[k]) == parse_quantity(b[k]) for k in a)


def same_statuses(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    if a is None or b is None or set(a) != set(b):
        return False
    return all(
        same_list(a[q].get("hard"), b[q].get("hard"))
        and same_list(a[q].get("used"), b[q].get("used"))
        for q in a
    )


def used_matches(
    found: Mapping[str, Any] | None, expected: Mapping[str, Mapping[str, str]]
) -> bool:
    if found is None:
        return False
    return all(
        name in found and same_list(found[name].get("used"), used)
        for name, used in expected.items()
    )


async def settled_statuses(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """Statuses once every quota shows its spec and two reads ``STABLE_AFTER_S`` apart agree."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FILL_WITHIN_S
    previous: dict[str, Any] | None = None
    while True:
        quotas = await read_quotas(api, namespace)
        current = {name: q.get("status") or {} for name, q in quotas.items()}
        synced = all(
            same_list(q["spec"].get("hard"), (q.get("status") or {}).get("hard"))
            for q in quotas.values()
        )
        if synced and previous is not None and same_statuses(previous, current):
            return current
        assert loop.time() < deadline, f"statuses in {namespace} did not settle: {current}"
        previous = current if synced else None
        await asyncio.sleep(STABLE_AFTER_S)


# -- the restart test -----------------------------------------------------------------------


class Steps:
    """The restart script, run the same on both control planes."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.core = client.CoreV1Api(api)

    async def pod(self, name: str, cpu: str, **spec: Any) -> None:
        await self.core.create_namespaced_pod(
            self.namespace, builders.pod(name, {"cpu": cpu}, spec=spec)
        )

    async def quota(self, name: str, names: list[str], **spec: Any) -> None:
        await self.core.create_namespaced_resource_quota(
            self.namespace,
            builders.resource_quota(name, dict.fromkeys(names, LARGE), spec=spec),
        )

    async def before(self) -> None:
        """With tally running: quotas, then the objects they count (charged at admission)."""
        await eventually(
            lambda: self.core.list_namespaced_config_map(self.namespace),
            until=lambda found: any(i.metadata.name == "kube-root-ca.crt" for i in found.items),
            what="kube-root-ca.crt",
        )
        await self.quota("compute", ["pods", "count/pods", "requests.cpu"])
        await self.quota(
            "objects",
            ["configmaps", "secrets", "services", "services.nodeports", "persistentvolumeclaims",
             "requests.storage", "replicationcontrollers"],
        )  # fmt: skip
        await self.quota("terminating", ["pods"], scopes=["Terminating"])
        await settled_statuses(self.api, self.namespace)
        await self.pod("p1", "100m")
        await self.pod("p2", "200m", schedulerName=builders.NO_SCHEDULER)  # turns Failed
        await self.pod("p3", "300m", activeDeadlineSeconds=60)
        for name in ("a", "b"):
            await self.core.create_namespaced_config_map(
                self.namespace, {"metadata": {"name": name}}
            )
        await self.core.create_namespaced_secret(self.namespace, {"metadata": {"name": "s"}})
        await self.core.create_namespaced_service(
            self.namespace,
            {"metadata": {"name": "np"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}},
        )
        await self.core.create_namespaced_persistent_volume_claim(
            self.namespace,
            {"metadata": {"name": "c1"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
        )  # fmt: skip

    async def while_down(self) -> None:
        """With tally stopped: deletions, a pod turning Failed, creations, a spec.hard change,
        a new quota and a deleted one. No step waits for a quota status."""
        await self.core.delete_namespaced_pod("p1", self.namespace, grace_period_seconds=0)
        await set_pod_status(self.api, self.namespace, "p2", phase="Failed", ready=False)
        await self.core.delete_namespaced_config_map("a", self.namespace)
        await self.core.delete_namespaced_service("np", self.namespace)
        await self.core.delete_namespaced_persistent_volume_claim("c1", self.namespace)
        await self.pod("p4", "400m")
        await self.core.create_namespaced_config_map(self.namespace, {"metadata": {"name": "c"}})
        await self.core.create_namespaced_secret(self.namespace, {"metadata": {"name": "t"}})
        labels = {"app": "r"}
        await self.core.create_namespaced_replication_controller(
            self.namespace,
            {"metadata": {"name": "r"}, "spec": {"replicas": 0, "selector": labels, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "a", "image": IMAGE}]}}}},
        )  # fmt: skip
        await self.core.patch_namespaced_resource_quota(
            "objects",
            self.namespace,
            {"spec": {"hard": {"services.nodeports": None, "count/secrets": LARGE}}},
            _content_type="application/merge-patch+json",
        )
        await self.core.delete_namespaced_resource_quota("terminating", self.namespace)
        await self.quota("new", ["pods", "requests.cpu"])


BEFORE: Final = {
    "compute": {"pods": "3", "count/pods": "3", "requests.cpu": "600m"},
    "objects": {"configmaps": "3", "secrets": "1", "services": "1", "services.nodeports": "1",
                "persistentvolumeclaims": "1", "requests.storage": "1Gi",
                "replicationcontrollers": "0"},
    "terminating": {"pods": "1"},
}  # fmt: skip
AFTER: Final = {
    "compute": {"pods": "2", "count/pods": "3", "requests.cpu": "700m"},
    "objects": {"configmaps": "3", "secrets": "2", "count/secrets": "2", "services": "0",
                "persistentvolumeclaims": "0", "requests.storage": "0",
                "replicationcontrollers": "1"},
    "new": {"pods": "2", "requests.cpu": "700m"},
}  # fmt: skip


async def test_restart_converges_without_manual_action(
    own_plane: cluster.State,
    own_api: client.ApiClient,
    own_namespace: str,
    reference_api: client.ApiClient,
    reference_namespace: str,
    tally_log: Path,
) -> None:
    tally = TallyProcess(Path(own_plane.kubeconfig), tally_log, bin_dir=Path(own_plane.bin_dir))
    ours, upstream = Steps(own_api, own_namespace), Steps(reference_api, reference_namespace)
    try:
        await asyncio.to_thread(tally.start)
        await asyncio.gather(ours.before(), upstream.before())
        for side in (ours, upstream):
            await eventually(
                lambda side=side: statuses(side.api, side.namespace),
                until=lambda found: used_matches(found, BEFORE),
                within=FILL_WITHIN_S,
                what=f"{side.namespace}: usage before the restart == {BEFORE}",
            )

        assert await asyncio.to_thread(tally.stop) == 0, tally.log_text()
        assert not await asyncio.to_thread(tally.webhook_registered)
        await asyncio.gather(ours.while_down(), upstream.while_down())
        expected = await settled_statuses(reference_api, reference_namespace)
        assert used_matches(expected, AFTER), f"upstream after the steps: {expected}"
        assert set(expected) == {"compute", "objects", "new"}

        started = time.monotonic()
        await asyncio.to_thread(tally.start)
        live = time.monotonic()
        await eventually(
            lambda: statuses(own_api, own_namespace),
            until=lambda found: same_statuses(found, expected),
            within=RESTART_CONVERGE_S,
            interval=0.1,
            what=f"tally's statuses after its restart == upstream's {expected}",
        )
        converged = time.monotonic()
        print(
            f"restart: tally live {live - started:.1f} s after start; statuses converged "
            f"{converged - live:.2f} s after that"
        )
        # And they stay converged (nothing flaps back).
        await asyncio.sleep(STABLE_AFTER_S)
        assert same_statuses(await statuses(own_api, own_namespace), expected)
        assert tally.running, tally.log_text()
    finally:
        await asyncio.to_thread(tally.kill)


# -- the watch-loss test --------------------------------------------------------------------


@pytest.mark.parametrize("restart_server", [True, False], ids=["apiserver-restart", "cut-only"])
async def test_objects_deleted_while_watches_are_cut_stop_counting(
    restart_server: bool,
    own_plane: cluster.State,
    own_api: client.ApiClient,
    own_namespace: str,
    tally_log: Path,
    tmp_path: Path,
) -> None:
    proxy = CuttableProxy(own_plane.ports["kube-apiserver"])
    proxy.start()
    tally = TallyProcess(
        proxied_kubeconfig(own_plane, proxy.port, tmp_path / "kubeconfig"),
        tally_log,
        admin_kubeconfig=Path(own_plane.kubeconfig),
        bin_dir=Path(own_plane.bin_dir),
    )
    namespace, core = own_namespace, client.CoreV1Api(own_api)
    try:
        await asyncio.to_thread(tally.start)
        await eventually(
            lambda: core.list_namespaced_config_map(namespace),
            until=lambda found: any(i.metadata.name == "kube-root-ca.crt" for i in found.items),
            what="kube-root-ca.crt",
        )
        names = ["pods", "count/pods", "requests.cpu", "configmaps", "secrets", "services",
                 "services.nodeports"]  # fmt: skip
        await core.create_namespaced_resource_quota(
            namespace, {"metadata": {"name": "q"}, "spec": {"hard": dict.fromkeys(names, LARGE)}}
        )
        await settled_statuses(own_api, namespace)
        steps = Steps(own_api, namespace)
        for name, cpu in (("a", "100m"), ("b", "200m"), ("c", "300m")):
            await steps.pod(name, cpu)
        for name in ("x", "y"):
            await core.create_namespaced_config_map(namespace, {"metadata": {"name": name}})
        await core.create_namespaced_secret(namespace, {"metadata": {"name": "s"}})
        await core.create_namespaced_service(
            namespace,
            {"metadata": {"name": "np"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}},
        )
        before = {"q": {"pods": "3", "count/pods": "3", "requests.cpu": "600m",
                        "configmaps": "3", "secrets": "1", "services": "1",
                        "services.nodeports": "1"}}  # fmt: skip
        await eventually(
            lambda: statuses(own_api, namespace),
            until=lambda found: used_matches(found, before),
            what=f"usage before the cut == {before}",
        )

        cut = await asyncio.to_thread(proxy.cut)
        assert cut > 0, "tally had no open connection to cut"
        await core.delete_namespaced_pod("a", namespace, grace_period_seconds=0)
        await core.delete_namespaced_pod("b", namespace, grace_period_seconds=0)
        await core.delete_namespaced_config_map("x", namespace)
        await core.delete_namespaced_secret("s", namespace)
        await core.delete_namespaced_service("np", namespace)
        down_for = 0.0
        if restart_server:
            down_for = await asyncio.to_thread(cluster.restart_apiserver, own_plane)
        # The deletions are done and (with a restart) the server's watch cache is fresh.
        after = {"q": {"pods": "1", "count/pods": "1", "requests.cpu": "300m",
                       "configmaps": "2", "secrets": "0", "services": "0",
                       "services.nodeports": "0"}}  # fmt: skip
        # (The admin client's pooled connections may be stale after a restart: poll.)
        during = await eventually(
            lambda: statuses(own_api, namespace), until=lambda found: found is not None
        )
        assert used_matches(during, before), f"usage changed while tally was cut off: {during}"
        resumed = time.monotonic()
        await asyncio.to_thread(proxy.resume)
        await eventually(
            lambda: statuses(own_api, namespace),
            until=lambda found: used_matches(found, after),
            within=WATCH_LOSS_BOUND_S,
            interval=0.2,
            what=f"usage after the deletions missed by tally's watches == {after}",
        )
        took = time.monotonic() - resumed
        what = f"apiserver down {down_for:.1f} s, " if restart_server else ""
        print(f"watch loss ({what}{cut} connections cut): usage dropped {took:.1f} s after resume")
        assert tally.running, tally.log_text()
    finally:
        await asyncio.to_thread(tally.kill)
        await asyncio.to_thread(proxy.close)
