"""``/metrics`` behind authentication and authorization, as the Deployment serves it.

tally runs as deployed (its ServiceAccount, the manifests' roles) with
``TALLY_METRICS_AUTH=kubernetes`` (what ``auto`` means off loopback: the Deployment binds
0.0.0.0). Two ServiceAccounts scrape it: ``reader``, bound to the manifests' ClusterRole
``tally-metrics-reader``, and ``other``, bound to nothing. Over HTTPS (tally's own certificate,
not verified, as a Prometheus with ``insecure_skip_verify`` scrapes):

* no token: 401 with ``WWW-Authenticate: Bearer``; a token the API server does not know: 401;
* ``other``: 403, in the API server's own words;
* ``reader``: 200 and tally's metrics;
* plain HTTP gets no answer.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from operator_process import TallyProcess

import cluster
from tally_e2e import ControlPlane, eventually

READER_ROLE = "tally-metrics-reader"


@pytest.fixture(scope="module")
def secured(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TallyProcess]:
    tally = TallyProcess(
        control_plane.kubeconfig,
        tmp_path_factory.mktemp("secure-metrics") / "tally.log",
        bin_dir=control_plane.bin_dir,
        env={
            "TALLY_METRICS_AUTH": "kubernetes",
            "TALLY_WEBHOOK_CONFIG_NAME": f"tally-metrics-{uuid.uuid4().hex[:6]}.tally.dev",
        },
    )
    try:
        tally.start()
        yield tally
    finally:
        tally.kill()
        control_plane.kubectl(
            "delete", tally.webhook_configuration, "--ignore-not-found", check=False
        )


@pytest.fixture(scope="module")
def tokens(control_plane: ControlPlane) -> Iterator[dict[str, str]]:
    """Tokens of two fresh ServiceAccounts: ``reader`` (bound to the reader role), ``other``."""
    namespace = f"e2e-scrapers-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    binding = f"e2e-metrics-reader-{namespace}"
    try:
        for account in ("reader", "other"):
            control_plane.kubectl("create", "serviceaccount", account, "-n", namespace)
        control_plane.kubectl(
            "create", "clusterrolebinding", binding, f"--clusterrole={READER_ROLE}",
            f"--serviceaccount={namespace}:reader",
        )  # fmt: skip
        yield {
            account: control_plane.kubectl(
                "create", "token", account, "-n", namespace
            ).stdout.strip()
            for account in ("reader", "other")
        } | {"namespace": namespace}
    finally:
        control_plane.kubectl("delete", "clusterrolebinding", binding, check=False)
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


async def scrape(url: str, token: str | None) -> tuple[int, dict[str, str], str]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers, ssl=context, timeout=aiohttp.ClientTimeout(10)) as got,
    ):
        return got.status, dict(got.headers), await got.text()


async def test_only_a_reader_scrapes(secured: TallyProcess, tokens: dict[str, str]) -> None:
    url = secured.metrics_url.replace("http://", "https://")
    status, headers, _ = await scrape(url, None)
    assert 401 == status
    assert headers.get("WWW-Authenticate", "").startswith("Bearer")
    status, _, _ = await scrape(url, "not-a-token")
    assert 401 == status

    status, _, body = await scrape(url, tokens["other"])
    assert 403 == status, body
    user = f"system:serviceaccount:{tokens['namespace']}:other"
    assert f'forbidden: User "{user}" cannot get path "/metrics"' in body

    status, _, body = await scrape(url, tokens["reader"])
    assert 200 == status, body
    assert "tally_leader" in body or "tally_admission" in body

    # Plain HTTP: a TLS port does not answer it.
    with pytest.raises(aiohttp.ClientError):
        async with (
            aiohttp.ClientSession() as session,
            session.get(secured.metrics_url, timeout=aiohttp.ClientTimeout(5)) as got,
        ):
            raise AssertionError(f"plain HTTP answered {got.status}")
    # The reviews tally made were allowed under the manifests' roles.
    assert not secured.refused_by_rbac()


@pytest.fixture
def prometheus(secured: TallyProcess, tokens: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A Prometheus scraping tally as docs/configuration.md says ("Secure metrics"): HTTPS
    without verifying tally's own certificate, with the reader's token (job ``reader``), and
    the same without a token (job ``anonymous``); its URL."""
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is not on PATH: run `make prometheus` (hack/prometheus.sh)"
    token = tmp_path / "reader.token"
    token.write_text(tokens["reader"])
    job = {
        "metrics_path": "/metrics",
        "scheme": "https",
        "tls_config": {"insecure_skip_verify": True},
        "static_configs": [{"targets": [urllib.parse.urlsplit(secured.metrics_url).netloc]}],
    }
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {**job, "job_name": "reader", "authorization": {"credentials_file": str(token)}},
            {**job, "job_name": "anonymous"},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = cluster.free_port()
    with open(tmp_path / "prometheus.log", "wb") as sink:
        process = subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=sink, stderr=sink,
        )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=20)


async def test_prometheus_scrapes_with_the_readers_token(prometheus: str) -> None:
    async def up() -> dict[str, str]:
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"{prometheus}/api/v1/query", params={"query": "up"}) as response,
            ):
                body = await response.json()
        except aiohttp.ClientError:
            return {}  # not ready yet
        return {r["metric"]["job"]: r["value"][1] for r in body["data"]["result"]}

    found = await eventually(
        up, until=lambda jobs: set(jobs) == {"reader", "anonymous"}, within=60,
        what="both jobs scraped",
    )  # fmt: skip
    assert {"reader": "1", "anonymous": "0"} == found
