"""Fixtures for end-to-end tests on the real local control plane (``hack/cluster.py``).

* ``control_plane``: an operator-mode control plane for the whole session, started in a
  temporary directory (the binaries come from the cache; a missing one is built). Set
  ``TALLY_E2E_KUBECONFIG`` to reuse a running one instead (e.g. the one ``make run`` started).
* ``reference_plane``: the same in reference mode (upstream quota on), started only when a test
  asks for it; ``TALLY_E2E_REFERENCE_KUBECONFIG`` reuses one.
* ``operator``: tally itself, ``kopf run operator/main.py`` as a subprocess against
  ``control_plane`` (``operator_process.TallyProcess``), once per test module (so modules that
  need no tally run without one): as deployed, with its ServiceAccount's token under the RBAC of
  ``manifests/``, in its namespace ``tally-system``, its webhook requiring the API server's
  client certificate (mutual TLS).
* ``api`` / ``reference_api``: kubernetes-asyncio clients; ``namespace`` /
  ``reference_namespace``: a fresh namespace per test, deleted afterwards.

A control plane that cannot start fails the tests that need it. Nothing here skips.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from operator_process import OperatorError, TallyProcess

import cluster
from tally_e2e import (
    NODES,
    ControlPlane,
    RunningOperator,
    api_client,
    wait_for_default_service_account,
)

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
        with cluster.running(directory, mode, nodes=NODES) as state:
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


@pytest_asyncio.fixture(scope="session")
async def api(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    made = await api_client(control_plane)
    yield made
    await made.close()


@pytest_asyncio.fixture(scope="session")
async def reference_api(reference_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    made = await api_client(reference_plane)
    yield made
    await made.close()


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
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    tally = TallyProcess(control_plane.kubeconfig, log, bin_dir=control_plane.bin_dir)
    try:
        tally.start(timeout=OPERATOR_START_TIMEOUT_S)
    except OperatorError as error:
        tally.kill()
        pytest.fail(str(error))
    assert tally.process is not None
    pki = cluster.webhook_client_pki(control_plane.kubeconfig.parent)
    try:
        yield RunningOperator(
            tally.process,
            tally.liveness_url,
            log,
            metrics_url=tally.metrics_url,
            webhook_client=None if pki is None else (pki.cert, pki.key),
        )
    finally:
        tally.kill()
    # Under the shipped roles, nothing tally did in the module may have been refused for want
    # of a right: that is a rule missing from manifests/.
    refused = tally.refused_by_rbac()
    assert not refused, "tally was refused by RBAC:\n" + "\n".join(refused[:20])
