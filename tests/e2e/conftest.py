"""Fixtures for end-to-end tests on the real local control plane (``hack/cluster.py``).

* ``control_plane``: an operator-mode control plane for the whole session, started in a
  temporary directory (the binaries come from the cache; a missing one is built). Set
  ``TALLY_E2E_KUBECONFIG`` to reuse a running one instead (e.g. the one ``make run`` started).
* ``reference_plane``: the same in reference mode (upstream quota on), started only when a test
  asks for it; ``TALLY_E2E_REFERENCE_KUBECONFIG`` reuses one.
* ``operator``: tally itself, ``kopf run operator/main.py`` as a subprocess against
  ``control_plane``, once per test module (so modules that need no tally run without one),
  its webhook requiring the API server's client certificate (mutual TLS).
* ``api`` / ``reference_api``: kubernetes-asyncio clients; ``namespace`` /
  ``reference_namespace``: a fresh namespace per test, deleted afterwards.

A control plane that cannot start fails the tests that need it. Nothing here skips.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client, config
from operator_process import WEBHOOK_CONFIGURATION, mutual_tls_env, webhook_ports

import cluster
from tally_e2e import ControlPlane, RunningOperator, wait_for_default_service_account

REPO = Path(__file__).resolve().parents[2]
OPERATOR_START_TIMEOUT_S = 60.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test under tests/e2e is an e2e test, marked so `-m e2e` / `-m unit` select right.
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.e2e)


@contextlib.contextmanager
def _plane(mode: str, reuse_env: str) -> Iterator[ControlPlane]:
    reuse = os.environ.get(reuse_env)
    if reuse:
        yield ControlPlane(kubeconfig=Path(reuse), mode=mode, bin_dir=cluster.ensure_binaries())
        return
    directory = Path(tempfile.mkdtemp(prefix=f"tally-e2e-{mode}-"))
    try:
        with cluster.running(directory, mode) as state:
            yield ControlPlane(
                kubeconfig=Path(state.kubeconfig), mode=mode, bin_dir=Path(state.bin_dir)
            )
    finally:
        cluster.down(directory, clean=True, quiet=True)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with _plane("operator", "TALLY_E2E_KUBECONFIG") as plane:
        yield plane


@pytest.fixture(scope="session")
def reference_plane() -> Iterator[ControlPlane]:
    with _plane("reference", "TALLY_E2E_REFERENCE_KUBECONFIG") as plane:
        yield plane


async def _api_client(plane: ControlPlane) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(plane.kubeconfig), client_configuration=configuration
    )
    return client.ApiClient(configuration)


@pytest_asyncio.fixture(scope="session")
async def api(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api_client = await _api_client(control_plane)
    yield api_client
    await api_client.close()


@pytest_asyncio.fixture(scope="session")
async def reference_api(reference_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api_client = await _api_client(reference_plane)
    yield api_client
    await api_client.close()


async def _fresh_namespace(api_client: client.ApiClient) -> AsyncIterator[str]:
    core = client.CoreV1Api(api_client)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    await core.create_namespace({"metadata": {"name": name, "labels": {"tally.dev/e2e": "true"}}})
    await wait_for_default_service_account(api_client, name)
    yield name
    with contextlib.suppress(client.ApiException):
        await core.delete_namespace(name)


@pytest_asyncio.fixture
async def namespace(api: client.ApiClient) -> AsyncIterator[str]:
    async for name in _fresh_namespace(api):
        yield name


@pytest_asyncio.fixture
async def reference_namespace(reference_api: client.ApiClient) -> AsyncIterator[str]:
    async for name in _fresh_namespace(reference_api):
        yield name


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningOperator]:
    port = cluster.free_port()
    liveness_url = f"http://127.0.0.1:{port}/healthz"
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    metrics_port = cluster.free_port()
    webhook_port = cluster.free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(control_plane.kubeconfig),
        "TALLY_METRICS_ADDR": "127.0.0.1",
        "TALLY_METRICS_PORT": str(metrics_port),
        "TALLY_WEBHOOK_PORT": str(webhook_port),
        # The webhook requires the API server's client certificate (mutual TLS).
        **mutual_tls_env(control_plane.kubeconfig),
    }
    command = [
        sys.executable, "-m", "kopf", "run", str(REPO / "operator" / "main.py"),
        "--all-namespaces", "--standalone", f"--liveness={liveness_url}",
    ]  # fmt: skip
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=sink)
    pki = cluster.webhook_client_pki(control_plane.kubeconfig.parent)
    running = RunningOperator(
        process,
        liveness_url,
        log,
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        webhook_client=None if pki is None else (pki.cert, pki.key),
    )
    try:
        deadline = time.monotonic() + OPERATOR_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"the operator exited with {process.returncode}:\n{running.log_text()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(liveness_url, timeout=2) as response,
            ):
                if response.status == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(
                    f"the operator's liveness endpoint never answered:\n{running.log_text()}"
                )
            time.sleep(0.2)
        # Admission is on only once tally's webhook configuration points at this process (a
        # killed tally may have left one behind that points at a dead port).
        while webhook_ports(
            control_plane.bin_dir, control_plane.kubeconfig, WEBHOOK_CONFIGURATION
        ) != {webhook_port}:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the operator never registered its webhook:\n{running.log_text()}")
            time.sleep(0.2)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
