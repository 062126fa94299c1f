"""tally's API clients and their connections, on the real API server.

aiohttp hands out the pooled connection released longest ago, so under steady traffic no pooled
connection idles out: without a limit the pool keeps one TLS connection (~320 KiB) per request
the largest burst had in flight, for as long as the process lives. ``make_api_client`` takes a
limit (``TALLY_API_CONNECTIONS``); the first tests count this process's established connections
to the API server from ``/proc``. The last runs tally with a single such connection: the PodSet
controller's pod creates hold it while they wait for tally's own webhook, whose quota writes
must therefore go through a client of their own. Renewing a pool (``rest.PoolRenewal``) gives a
burst's connections back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.config import kube_config
from operator_process import TallyProcess, established_connections
from podset_e2e import PODSET, install_podset_crd

from tally.kube import rest
from tally_e2e import ControlPlane, eventually

BURST = 30


def connections_to(port: int) -> set[str]:
    """This process's established connections to ``port``, by socket inode (other clients of
    this test process have connections of their own, which open and close meanwhile: tests
    compare sets)."""
    return established_connections("self", port)


async def _client(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, connections: int | None
) -> tuple[client.ApiClient, int]:
    # tally's process has $KUBECONFIG set before kubernetes-asyncio reads it (on import).
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(control_plane.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api = await rest.make_api_client(connections)
    port = urlsplit(str(api.configuration.host)).port
    assert port is not None
    return api, port


async def _burst(api: client.ApiClient) -> None:
    # All at once: none finds a free connection, so each opens one unless the pool is full.
    versions = await asyncio.gather(*(rest.server_version(api) for _ in range(BURST)))
    assert len(set(versions)) == 1


async def _trickle(api: client.ApiClient, seconds: float) -> None:
    """Steady traffic, one request at a time, for longer than the keep-alive."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        await rest.server_version(api)
        await asyncio.sleep(0.25)


async def test_a_burst_opens_no_more_connections_than_the_limit(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, port = await _client(control_plane, monkeypatch, 3)
    try:
        before = connections_to(port)
        await _burst(api)
        assert 1 <= len(connections_to(port) - before) <= 3
    finally:
        await api.close()


async def test_without_a_limit_a_burst_s_connections_outlive_the_keep_alive(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the limit: the ratchet itself. If aiohttp ever reuses the newest connection
    first, idle ones close and this fails; the limit's docstring must then change."""
    api, port = await _client(control_plane, monkeypatch, None)
    try:
        before = connections_to(port)
        await _burst(api)
        opened = connections_to(port) - before
        assert len(opened) >= BURST // 2
        await _trickle(api, rest.KEEPALIVE_S + 5)
        assert len(opened & connections_to(port)) >= BURST // 2
    finally:
        await api.close()


async def test_a_renewed_pool_gives_a_burst_s_connections_back(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the ratchet above costs is given back: once a period has passed that did not
    need them, the pool is renewed, the burst's connections idle out on the retired pool, and
    the same steady traffic needs one or two new ones."""
    api, port = await _client(control_plane, monkeypatch, None)
    renewal = rest.PoolRenewal([api], period=3600, grace=rest.REQUEST_TIMEOUT_S + rest.KEEPALIVE_S)
    try:
        before = connections_to(port)
        await _burst(api)
        opened = connections_to(port) - before
        assert len(opened) >= BURST // 2
        burst_pool = api.rest_client
        await renewal.renew_once()
        assert api.rest_client is burst_pool  # the period just ended needed them all
        await _trickle(api, 2)
        await renewal.renew_once()
        assert api.rest_client is not burst_pool
        # aiohttp closes idle connections on a timer of the keep-alive's length: one that
        # just missed a round goes at the next.
        await _trickle(api, 2 * rest.KEEPALIVE_S + 5)
        now = connections_to(port)
        assert not opened & now
        assert 1 <= len(now - before) <= 2
    finally:
        await renewal.stop()
        await api.close()


PODS = 40
FILL_WITHIN_S = 60.0
"""Generous for a shared 2-core machine, and far below what the creates would take if each
waited out the webhook's timeout (~10 s) for a connection its own create holds."""


@pytest.fixture(scope="module")
def one_connection_tally(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TallyProcess]:
    install_podset_crd(control_plane)
    process = TallyProcess(
        control_plane.kubeconfig,
        tmp_path_factory.mktemp("tally-one-connection") / "tally.log",
        bin_dir=control_plane.bin_dir,
        env={"TALLY_API_CONNECTIONS": "1"},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


async def test_podset_creates_charged_by_tally_with_a_single_request_connection(
    one_connection_tally: TallyProcess, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": "100"}}}
    )
    await eventually(
        lambda: core.read_namespaced_resource_quota("pods", namespace),
        until=lambda q: (q.status.used or {}).get("pods") == "0",
        what="the quota's first status (admission charges pods from then on)",
    )
    started = time.monotonic()
    await PODSET.create(api, namespace, "web", PODS)
    await eventually(
        lambda: PODSET.owned_pods(api, namespace, "web"),
        until=lambda pods: len(pods) == PODS,
        within=FILL_WITHIN_S,
        interval=0.5,
        what=f"{PODS} pods",
    )
    assert time.monotonic() - started < FILL_WITHIN_S
    quota = await core.read_namespaced_resource_quota("pods", namespace)
    assert str(PODS) == quota.status.used["pods"]
    assert "timed out" not in one_connection_tally.log_text(tail=2000)
