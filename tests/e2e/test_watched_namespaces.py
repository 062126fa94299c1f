"""TALLY_NAMESPACES: tally manages the listed namespaces and leaves the others alone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from operator_process import TallyProcess

from tally_e2e import ControlPlane, eventually, wait_for_default_service_account


@pytest_asyncio.fixture
async def two_namespaces(api: client.ApiClient) -> AsyncIterator[tuple[str, str]]:
    core = client.CoreV1Api(api)
    names = (f"e2e-in-{uuid.uuid4().hex[:6]}", f"e2e-out-{uuid.uuid4().hex[:6]}")
    for name in names:
        await core.create_namespace({"metadata": {"name": name}})
        await wait_for_default_service_account(api, name)
    yield names
    for name in names:
        await core.delete_namespace(name)


async def test_only_watched_namespaces_are_managed(
    control_plane: ControlPlane,
    api: client.ApiClient,
    two_namespaces: tuple[str, str],
    tmp_path: Path,
) -> None:
    inside, outside = two_namespaces
    tally = TallyProcess(
        control_plane.kubeconfig,
        tmp_path / "tally.log",
        bin_dir=control_plane.bin_dir,
        env={"TALLY_NAMESPACES": inside},
    )
    tally.start()
    try:
        core = client.CoreV1Api(api)
        quota = {"metadata": {"name": "q"}, "spec": {"hard": {"secrets": "1"}}}
        for namespace in (inside, outside):
            await core.create_namespaced_resource_quota(namespace, quota)

        async def used(namespace: str) -> object:
            read = await core.read_namespaced_resource_quota("q", namespace)
            return (read.status.used or {}) if read.status else {}

        await eventually(lambda: used(inside), until=lambda u: u == {"secrets": "0"}, within=5)
        await core.create_namespaced_secret(inside, {"metadata": {"name": "a"}})
        assert await used(inside) == {"secrets": "1"}
        with pytest.raises(client.ApiException) as denied:
            await core.create_namespaced_secret(inside, {"metadata": {"name": "b"}})
        assert denied.value.status == 403
        # Outside: no usage computed ...
        await asyncio.sleep(2)
        assert await used(outside) == {}
        # ... and no admission: a quota whose status says it is full refuses nothing there
        # (inside, the same status refuses: the first test above).
        await core.replace_namespaced_resource_quota_status(
            "q",
            outside,
            {
                "metadata": {"name": "q", "namespace": outside},
                "spec": quota["spec"],
                "status": {"hard": {"secrets": "1"}, "used": {"secrets": "1"}},
            },
        )
        await core.create_namespaced_secret(outside, {"metadata": {"name": "b"}})
        assert await used(outside) == {"secrets": "1"}
    finally:
        tally.stop()
