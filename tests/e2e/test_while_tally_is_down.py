"""While no tally answers: what a fail-closed webhook stops, and what it must not.

tally's webhook configuration stays when tally stops (``TALLY_WEBHOOK_REMOVE_ON_EXIT=false``, as
in the Deployment), with failurePolicy Fail: a quota is a limit only if what it would charge is
refused while nobody can judge it. Everything else must go on, or a tally that is down keeps the
cluster, and tally itself, from coming back:

* an exempt namespace (``TALLY_EXEMPT_NAMESPACES``: where a cluster's add-ons run, CNI, CSI,
  cert-manager) creates pods;
* a namespace tally does not manage (``TALLY_NAMESPACES`` set) creates pods;
* in a managed namespace, updates that charge nothing (a ConfigMap's, a Secret's: object
  counts change on create only) and deletes pass; creates of charged kinds, ClusterQuota writes
  and PodSet writes are refused, naming tally's webhook (``docs/install.md``, "When tally is
  down", says the same).

Each test runs a tally of its own with a webhook configuration of its own, stops it hard
(SIGKILL: nothing removed), and deletes the configuration it left at the end.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from operator_process import TallyProcess

import builders
from builders import container, podset
from tally_e2e import ControlPlane, wait_for_default_service_account

pod = functools.partial(builders.pod, container_name="c")


@pytest_asyncio.fixture
async def namespaces(api: client.ApiClient) -> AsyncIterator[dict[str, str]]:
    """Three fresh namespaces: ``managed``, ``addons`` (to be exempt), ``other``."""
    core = client.CoreV1Api(api)
    suffix = uuid.uuid4().hex[:6]
    names = {role: f"e2e-down-{role}-{suffix}" for role in ("managed", "addons", "other")}
    for name in names.values():
        await core.create_namespace({"metadata": {"name": name}})
        await wait_for_default_service_account(api, name)
    yield names
    for name in names.values():
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(name)


@contextlib.contextmanager
def stopped_tally(plane: ControlPlane, log: Path, **env: str) -> Iterator[TallyProcess]:
    """A tally that registered its webhook and was then killed: its configuration stays."""
    tally = TallyProcess(
        plane.kubeconfig,
        log,
        bin_dir=plane.bin_dir,
        env={
            "TALLY_WEBHOOK_CONFIG_NAME": f"tally-down-{uuid.uuid4().hex[:6]}.tally.dev",
            "TALLY_WEBHOOK_REMOVE_ON_EXIT": "false",
            **env,
        },
    )
    try:
        tally.start()
        assert tally.process is not None
        tally.process.kill()
        tally.process.wait()
        assert tally.webhook_registered()
        yield tally
    finally:
        tally.kill()
        plane.kubectl("delete", tally.webhook_configuration, "--ignore-not-found", check=False)


async def refusal(call: object) -> tuple[int, str]:
    """The status and message of a request that must fail."""
    with pytest.raises(client.ApiException) as refused:
        await call  # type: ignore[misc]
    return refused.value.status, str(json.loads(refused.value.body)["message"])


async def test_exempt_namespaces_and_uncharged_writes_go_on(
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespaces: dict[str, str],
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api)
    managed, addons = namespaces["managed"], namespaces["addons"]
    await core.create_namespaced_config_map(managed, {"metadata": {"name": "settings"}})
    await core.create_namespaced_secret(managed, {"metadata": {"name": "token"}})
    await core.create_namespaced_pod(managed, pod("before"))
    with stopped_tally(
        control_plane, tmp_path / "tally.log", TALLY_EXEMPT_NAMESPACES=f"kube-system,{addons}"
    ):
        # An add-on's namespace: created as if tally were not there.
        await core.create_namespaced_pod(addons, pod("cni-agent"))
        # Managed: what charges nothing on update or delete passes ...
        await core.patch_namespaced_config_map(
            "settings", managed, {"data": {"k": "v"}}, _content_type="application/merge-patch+json"
        )
        await core.patch_namespaced_secret(
            "token", managed, {"metadata": {"labels": {"rotated": "yes"}}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        await core.delete_namespaced_pod("before", managed, grace_period_seconds=0)
        # ... what a quota would charge is refused, naming tally's webhook.
        for call in (
            core.create_namespaced_pod(managed, pod("after")),
            core.create_namespaced_config_map(managed, {"metadata": {"name": "new"}}),
        ):
            status, message = await refusal(call)
            assert status == 500, message
            assert 'failed calling webhook "quota.tally.dev"' in message
        status, message = await refusal(
            client.CustomObjectsApi(api).create_cluster_custom_object(
                "tally.dev", "v1alpha1", "clusterquotas",
                {"apiVersion": "tally.dev/v1alpha1", "kind": "ClusterQuota",
                 "metadata": {"name": f"down-{uuid.uuid4().hex[:6]}"},
                 "spec": {"namespaceSelector": {}, "quota": {"hard": {"pods": "1"}}}},
            )
        )  # fmt: skip
        assert status == 500, message
        assert 'failed calling webhook "clusterquotas.tally.dev"' in message
        status, message = await refusal(
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "tally.dev",
                "v1alpha1",
                managed,
                "podsets",
                podset("web", 0, containers=[container("c")]),
            )
        )
        assert status == 500, message
        assert 'failed calling webhook "podsets.tally.dev"' in message


async def test_namespaces_tally_does_not_manage_go_on(
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespaces: dict[str, str],
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api)
    managed, other = namespaces["managed"], namespaces["other"]
    with stopped_tally(control_plane, tmp_path / "tally.log", TALLY_NAMESPACES=managed):
        await core.create_namespaced_pod(other, pod("elsewhere"))
        status, message = await refusal(core.create_namespaced_pod(managed, pod("here")))
        assert status == 500, message
        assert 'failed calling webhook "quota.tally.dev"' in message
