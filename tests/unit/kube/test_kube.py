"""tally.kube.rest: the API client asks the environment once, not on every request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.config import kube_config

from tally.kube import rest
from tally.kube.events import WarningRecorder

pytestmark = pytest.mark.unit

HOST = "https://api.example:6443"


@pytest.fixture
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


async def _client() -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = HOST
    return client.ApiClient(configuration)


@pytest.mark.parametrize(
    ("env", "proxy", "proxy_headers"),
    [
        pytest.param({}, None, None, id="no-proxy-variables"),
        pytest.param(
            {"HTTPS_PROXY": "http://proxy.example:3128"},
            "http://proxy.example:3128",
            None,
            id="https-proxy",
        ),
        pytest.param(
            {"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "api.example"},
            None,
            None,
            id="no-proxy-names-the-api-server",
        ),
        pytest.param(
            # aiohttp takes the credentials out of the URL into a Proxy-Authorization header.
            {"HTTPS_PROXY": "http://user:secret@proxy.example:3128"},
            "http://proxy.example:3128",
            {"Proxy-Authorization": "Basic dXNlcjpzZWNyZXQ="},
            id="proxy-with-credentials",
        ),
    ],
)
async def test_proxy_resolved_once_and_environment_never_read_again(
    clean_proxy_env: pytest.MonkeyPatch,
    env: dict[str, str],
    proxy: str | None,
    proxy_headers: dict[str, str] | None,
) -> None:
    for name, value in env.items():
        clean_proxy_env.setenv(name, value)
    api = await _client()
    try:
        # kubernetes-asyncio's own choice, which this undoes.
        assert api.rest_client.pool_manager.trust_env is True
        rest.read_environment_once(api, HOST)
        assert api.rest_client.pool_manager.trust_env is False
        assert proxy == api.rest_client.proxy
        assert proxy_headers == api.rest_client.proxy_headers
    finally:
        await api.close()


async def test_a_configured_proxy_is_kept(clean_proxy_env: pytest.MonkeyPatch) -> None:
    clean_proxy_env.setenv("HTTPS_PROXY", "http://env-proxy.example:3128")
    api = await _client()
    try:
        api.rest_client.proxy = "http://configured.example:8080"
        rest.read_environment_once(api, HOST)
        assert "http://configured.example:8080" == api.rest_client.proxy
        assert api.rest_client.pool_manager.trust_env is False
    finally:
        await api.close()


@pytest.mark.parametrize(("connections", "limit"), [(8, 8), (None, 0)])
async def test_the_pool_keeps_at_most_the_connections_asked(
    clean_proxy_env: pytest.MonkeyPatch, tmp_path: Any, connections: int | None, limit: int
) -> None:
    # aiohttp's limit: 0 is none (kubernetes-asyncio's own default would be 100).
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{HOST}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    # Read from $KUBECONFIG when kubernetes-asyncio is imported, as tally's process does.
    clean_proxy_env.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    clean_proxy_env.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api = await rest.make_api_client(connections)
    try:
        assert HOST == api.configuration.host
        assert limit == api.rest_client.pool_manager.connector.limit
    finally:
        await api.close()


# -- Warning Events (tally.kube.events)


class RecordingApi:
    def __init__(self) -> None:
        self.posts: list[tuple[str, Any]] = []

    async def call_api(self, path: str, method: str, **kwargs: Any) -> Any:
        assert "POST" == method
        self.posts.append((path, kwargs["body"]))
        return kwargs["body"]


async def test_a_warning_about_a_cluster_scoped_object_lives_in_default() -> None:
    # client-go's rule: an Event about a cluster-scoped object goes to namespace "default",
    # and its involvedObject has no namespace.
    api = RecordingApi()
    recorder = WarningRecorder(
        api,  # type: ignore[arg-type]
        kind="ClusterQuota", api_version="tally.dev/v1alpha1", component="tally",
    )  # fmt: skip
    cq = {"metadata": {"name": "team", "uid": "u-1", "resourceVersion": "9"}}
    await recorder.warn(cq, "EvaluationFailed", "m" * 2000)
    ((path, body),) = api.posts
    assert "/api/v1/namespaces/default/events" == path
    assert {"apiVersion": "tally.dev/v1alpha1", "kind": "ClusterQuota", "name": "team",
            "uid": "u-1", "resourceVersion": "9"} == body["involvedObject"]  # fmt: skip
    assert ("Warning", "EvaluationFailed", 1024) == (
        body["type"], body["reason"], len(body["message"])
    )  # fmt: skip
    assert body["metadata"]["name"].startswith("team.")


async def test_a_warning_about_a_namespaced_object_lives_beside_it() -> None:
    api = RecordingApi()
    recorder = WarningRecorder(
        api,  # type: ignore[arg-type]
        kind="ResourceQuota", api_version="v1", component="tally",
    )  # fmt: skip
    await recorder.warn({"metadata": {"name": "q", "namespace": "team-a"}}, "R", "words")
    ((path, body),) = api.posts
    assert "/api/v1/namespaces/team-a/events" == path
    assert ("team-a", "ResourceQuota") == (
        body["involvedObject"]["namespace"], body["involvedObject"]["kind"]
    )  # fmt: skip


# -- pool renewal


async def test_a_renewed_pool_keeps_the_limit_and_proxy_and_never_reads_the_environment(
    clean_proxy_env: pytest.MonkeyPatch,
) -> None:
    clean_proxy_env.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    configuration = client.Configuration()
    configuration.host = HOST
    configuration.connection_pool_maxsize = 8
    api = client.ApiClient(configuration)
    rest.read_environment_once(api, HOST)
    old = api.rest_client
    try:
        retired = rest.renew_pool(api)
        assert retired is old
        assert api.rest_client is not old
        session = api.rest_client.pool_manager
        assert session is not old.pool_manager
        assert 8 == session.connector.limit
        assert session.trust_env is False
        assert "http://proxy.example:3128" == api.rest_client.proxy
        # The retired pool stays open: requests sent before the renewal finish on it.
        assert not old.pool_manager.closed
    finally:
        await old.close()
        await api.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _idle(api: client.ApiClient, connections: int) -> None:
    """As if ``api``'s pool had opened ``connections`` that nothing needed since."""
    pool = api.rest_client
    assert isinstance(pool, rest.CountingPool)
    pool.peak, pool.recent_peak = connections, 0


async def _counted_client() -> client.ApiClient:
    api = await _client()
    await rest.renew_pool(api).close()  # the default pool, unused, is not counted
    return api


async def test_retired_pools_close_after_the_grace_and_all_at_stop() -> None:
    apis = [await _counted_client(), await _counted_client()]
    clock = _Clock()
    # The same client twice (a runtime without a dedicated client) is renewed once.
    renewal = rest.PoolRenewal([apis[0], apis[1], apis[0]], 60, grace=100, clock=clock)
    first = [api.rest_client for api in apis]
    try:
        for api in apis:
            _idle(api, rest.MIN_IDLE_CONNECTIONS)
        await renewal.renew_once()
        assert 2 == renewal.retired
        assert all(not pool.pool_manager.closed for pool in first)
        second = [api.rest_client for api in apis]
        assert not set(map(id, second)) & set(map(id, first))

        clock.now = 99.0
        for api in apis:
            _idle(api, rest.MIN_IDLE_CONNECTIONS)
        await renewal.renew_once()
        assert 4 == renewal.retired  # 99 s < 100 s: the first ones are still open
        assert all(not pool.pool_manager.closed for pool in first)

        clock.now = 100.0
        await renewal.renew_once()  # nothing idle: none renewed, the due ones closed
        assert all(pool.pool_manager.closed for pool in first)
        assert 2 == renewal.retired
        assert all(not pool.pool_manager.closed for pool in second)

        await renewal.stop()
        assert 0 == renewal.retired
        assert all(pool.pool_manager.closed for pool in second)
        # The clients' current pools are their owners' to close.
        assert all(not api.rest_client.pool_manager.closed for api in apis)
    finally:
        for api in apis:
            await api.close()


async def test_only_a_pool_with_connections_the_period_did_not_need_is_renewed() -> None:
    busy, idle, uncounted = await _counted_client(), await _counted_client(), await _client()
    renewal = rest.PoolRenewal([busy, idle, uncounted], 60, grace=100)
    pools = {name: api.rest_client for name, api in (("busy", busy), ("idle", idle))}
    try:
        # Busy: 16 opened, and 16 were in flight at once during the period.
        busy.rest_client.peak = busy.rest_client.recent_peak = 16
        # Idle but one short: 30 opened by a burst, 27 needed since.
        idle.rest_client.peak, idle.rest_client.recent_peak = 30, 30 - rest.MIN_IDLE_CONNECTIONS + 1
        await renewal.renew_once()
        # A pool whose use is not counted is renewed every time.
        assert 1 == renewal.renewals
        assert busy.rest_client is pools["busy"]
        assert idle.rest_client is pools["idle"]
        # The look restarted at what is in flight now (nothing): the burst's 30 are idle.
        await renewal.renew_once()
        assert idle.rest_client is not pools["idle"]
        assert busy.rest_client is not pools["busy"]  # nothing was in flight all period either
        assert 0 == idle.rest_client.peak  # a fresh pool has opened nothing
    finally:
        await renewal.stop()
        for api in (busy, idle, uncounted):
            await api.close()


async def test_requests_waiting_for_a_connection_are_not_connections() -> None:
    # A pool limited to 16 had 200 requests in flight (184 waiting for a connection): it holds
    # at most 16, and a period with 16 in flight needed them all.
    configuration = client.Configuration()
    configuration.host = HOST
    configuration.connection_pool_maxsize = 16
    api = client.ApiClient(configuration)
    await rest.renew_pool(api).close()
    pool = api.rest_client
    try:
        pool.peak, pool.recent_peak = 200, 16
        assert 0 == pool.look()
        pool.recent_peak = 5
        assert 11 == pool.look()
    finally:
        await api.close()


async def test_a_counting_pool_counts_requests_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    release = asyncio.Event()

    async def request(self: object, *args: object, **kwargs: object) -> str:
        await release.wait()
        return "answer"

    monkeypatch.setattr(client.rest.RESTClientObject, "request", request)
    api = await _counted_client()
    pool = api.rest_client
    try:
        three = [asyncio.create_task(pool.request("GET", HOST)) for _ in range(3)]
        await asyncio.sleep(0)
        assert (3, 3, 3) == (pool.in_flight, pool.peak, pool.recent_peak)
        assert 0 == pool.look()  # all three were needed
        assert 3 == pool.recent_peak  # the next look starts at what is in flight
        release.set()
        assert ["answer"] * 3 == await asyncio.gather(*three)
        assert (0, 3) == (pool.in_flight, pool.peak)
        assert 0 == pool.look()
        assert 3 == pool.look()  # a whole look with nothing in flight: all three idle
    finally:
        await api.close()


@pytest.mark.parametrize(
    ("period", "grace", "message"), [(0, 75, "positive"), (-1, 75, "positive"), (60, -1, "grace")]
)
def test_a_renewal_period_must_be_positive_and_the_grace_not_negative(
    period: float, grace: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        rest.PoolRenewal([], period, grace=grace)
