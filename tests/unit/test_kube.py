"""tally.kube.rest: the API client asks the environment once, not on every request."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from tally.kube import rest

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
