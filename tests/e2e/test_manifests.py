"""manifests/: what ``kubectl apply -k manifests/`` installs, and the RBAC proof.

* The server-side dry run and the apply on the operator-mode control plane: the Deployment's
  two pods are created, scheduled and Running on the plane's simulated nodes (kwok plays their
  kubelet; nothing runs the image, so they are not what the RBAC proof below runs).
* The RBAC proof: tally runs out of cluster with a token of the manifests' ServiceAccount
  (TokenRequest API, ``kubectl create token``) and nothing else, and passes the smoke scenarios:
  it starts, keeps its certificate in the Secret the manifests' Role grants
  (TALLY_WEBHOOK_CERT_SECRET, as in the Deployment), registers its webhook with a *Service*
  client config (TALLY_WEBHOOK_SERVICE, as in the Deployment), leads through the Lease the
  manifests' Role grants (TALLY_LEADER_ELECTION, as in the Deployment), writes a quota's
  ``status.used``, refuses a create over quota, and creates a PodSet's pods. The Service here
  is an ExternalName one pointing at ``localhost`` (the API server resolves ExternalName
  services to that host), since no pod runs: the API server still checks the certificate
  against ``<svc>.<ns>.svc``, as in a cluster.
* One rule shown needed: without ``update`` on ``resourcequotas/status`` a quota's status is
  never written and tally logs the refusal.
* The built-in quota probe's Role: with it the probe concludes (in ``tally-system``); without
  its binding tally logs which request was refused and starts anyway.
* PodSet Events are created and, once aggregated, patched (``patch`` on ``events``) with the
  ServiceAccount alone.

Everything installed is removed at the end of the module (the CRD only if this module created
it), so other modules see the control plane as they would without it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client
from operator_process import TallyProcess

import builders
import cluster
from tally_e2e import ControlPlane, eventually

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
NAMESPACE = "tally-system"
SERVICE_ACCOUNT = "tally"
CLUSTER_ROLE = "tally"
CRD = "podsets.tally.dev"
# The Service the test's webhook configuration names (ExternalName -> localhost).
LOCAL_SERVICE = "tally-webhook-local"
SA_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
# The built-in quota probe's quota, and the Role (rbac-builtin-quota-probe.yaml) it needs.
PROBE = "tally-builtin-quota-probe"
PROBE_ROLE = "tally-builtin-quota-probe"
CERT_SECRET = "tally-webhook-tls"


@dataclass
class Installed:
    """The rendered manifests, applied."""

    objects: list[dict[str, Any]]
    webhook_name: str
    token_kubeconfig: Path

    def of_kind(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = (o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name)
        return found


class SaTally(TallyProcess):
    """tally with the ServiceAccount's kubeconfig; its webhook configuration has its own name."""

    def __init__(self, installed: Installed, plane: ControlPlane, log: Path) -> None:
        webhook_port = cluster.free_port()
        super().__init__(
            installed.token_kubeconfig,
            log,
            admin_kubeconfig=plane.kubeconfig,
            bin_dir=plane.bin_dir,
            # The token this module made, under the roles this module applied and changes.
            credentials="kubeconfig",
            env={
                "TALLY_WEBHOOK_PORT": str(webhook_port),
                "TALLY_WEBHOOK_CONFIG_NAME": installed.webhook_name,
                "TALLY_WEBHOOK_SERVICE": f"{NAMESPACE}/{LOCAL_SERVICE}:{webhook_port}",
                "TALLY_NAMESPACE": NAMESPACE,
                # Like the Deployment: the certificate in the Secret rbac-webhook-tls.yaml grants.
                "TALLY_WEBHOOK_CERT_SECRET": f"{NAMESPACE}/{CERT_SECRET}",
                # Like the Deployment: the configuration stays when tally stops (the module
                # deletes it at the end).
                "TALLY_WEBHOOK_REMOVE_ON_EXIT": "false",
                # Like the Deployment: the controllers run on the holder of the Lease
                # tally-system/tally (rbac-leader-election.yaml). The Deployment's own pods
                # never run here (no kubelet), so this process is the only candidate.
                "TALLY_LEADER_ELECTION": "true",
            },
        )


def _kubectl_k(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return plane.kubectl(*args, "-k", str(MANIFESTS), check=False)


def _render(plane: ControlPlane) -> list[dict[str, Any]]:
    out = plane.kubectl("kustomize", str(MANIFESTS)).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def _apply(plane: ControlPlane, objects: list[dict[str, Any]]) -> None:
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))


def _token_kubeconfig(plane: ControlPlane, directory: Path) -> Path:
    token = plane.kubectl(
        "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration=2h"
    ).stdout.strip()
    admin = yaml.safe_load(plane.kubeconfig.read_text())
    cluster_entry = admin["clusters"][0]["cluster"]
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": cluster_entry["server"],
                    "certificate-authority-data": cluster_entry["certificate-authority-data"],
                },
            }
        ],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": SERVICE_ACCOUNT}}],
        "current-context": "sa",
    }
    path = directory / "sa-kubeconfig"
    path.write_text(json.dumps(kubeconfig))
    path.chmod(0o600)
    return path


def _cleanup(plane: ControlPlane, installed: list[dict[str, Any]], *, crd_was_there: bool) -> None:
    objects = [
        o for o in installed if not (crd_was_there and o["kind"] == "CustomResourceDefinition")
    ]
    plane.kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-",
        input=yaml.safe_dump_all(objects), check=False,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        gone = [
            plane.kubectl("get", kind, name, check=False).returncode != 0
            for kind, name in (("namespace", NAMESPACE), ("crd", CRD))
            if kind == "namespace" or not crd_was_there
        ]
        if all(gone):
            return
        time.sleep(0.5)


# -- the install


@pytest.fixture(scope="module")
def manifests(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[dict[str, Any]]]:
    """The rendered manifests; everything they create is removed after the module."""
    objects = _render(control_plane)
    crd_was_there = control_plane.kubectl("get", "crd", CRD, check=False).returncode == 0
    try:
        yield objects
    finally:
        _cleanup(control_plane, objects, crd_was_there=crd_was_there)


def test_server_side_dry_run(control_plane: ControlPlane, manifests: list[dict[str, Any]]) -> None:
    # On a fresh cluster a server-side dry run cannot create objects in a namespace that the
    # same dry run only pretends to create: those, and only those, fail NotFound. (Other
    # modules ran tally in tally-system: the cluster is made fresh in that respect first.)
    control_plane.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true",
                          "--timeout=90s")  # fmt: skip
    fresh = _kubectl_k(control_plane, "apply", "--dry-run=server")
    errors = [line for line in fresh.stderr.splitlines() if line.strip()]
    namespaced = [o for o in manifests if o["metadata"].get("namespace") == NAMESPACE]
    assert len(errors) == len(namespaced), fresh.stderr
    assert all(f'namespaces "{NAMESPACE}" not found' in line for line in errors), fresh.stderr

    # With the namespace there, the whole dry run passes, without a warning (the pod template
    # meets the namespace's "restricted" Pod Security level), and creates nothing.
    control_plane.kubectl("apply", "-f", str(MANIFESTS / "namespace.yaml"))
    result = _kubectl_k(control_plane, "apply", "--dry-run=server")
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    assert len(result.stdout.splitlines()) == len(manifests), result.stdout
    assert control_plane.kubectl("get", "deployment/tally", "-n", NAMESPACE, check=False).returncode


async def test_apply_creates_everything(
    control_plane: ControlPlane, manifests: list[dict[str, Any]], api: client.ApiClient
) -> None:
    result = _kubectl_k(control_plane, "apply")
    assert result.returncode == 0, result.stderr
    for obj in manifests:
        namespace = obj["metadata"].get("namespace")
        args = ["get", f"{obj['kind']}/{obj['metadata']['name']}", "-o", "name"]
        if namespace:
            args += ["-n", namespace]
        assert control_plane.kubectl(*args, check=False).returncode == 0, obj["kind"]

    # The Deployment makes its two pods (admitted by Pod Security "restricted"), which the
    # scheduler binds and the simulated kubelet runs.
    core = client.CoreV1Api(api)

    async def pods() -> list[Any]:
        listed = await core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/name=tally"
        )
        return list(listed.items)

    found = await eventually(
        pods,
        until=lambda found: len(found) == 2 and all(p.status.phase == "Running" for p in found),
        what="tally's pods Running",
    )
    for pod in found:
        assert pod.spec.node_name.startswith(cluster.NODE_NAME_PREFIX)
        assert pod.spec.service_account_name == SERVICE_ACCOUNT
        (container,) = pod.spec.containers
        assert container.security_context.read_only_root_filesystem is True
        env = {e.name: e.value for e in container.env if e.value is not None}
        assert env["TALLY_WEBHOOK_SERVICE"] == "tally-system/tally-webhook:443"
        assert env["TALLY_WEBHOOK_REMOVE_ON_EXIT"] == "false"
        assert env["TALLY_WEBHOOK_CERT_SECRET"] == f"{NAMESPACE}/{CERT_SECRET}"
        assert env["TALLY_LEADER_ELECTION"] == "true"
        assert container.lifecycle.pre_stop.sleep.seconds == 5


# -- the RBAC proof


@pytest.fixture(scope="module")
def installed(
    control_plane: ControlPlane,
    manifests: list[dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installed]:
    """Applied manifests (whatever the test order), the token kubeconfig, and the local
    ExternalName Service; the ClusterRole's webhook resourceName follows the test's own
    webhook configuration name."""
    webhook_name = f"tally-manifests-{uuid.uuid4().hex[:6]}.tally.dev"
    objects = [_with_webhook_name(o, webhook_name) for o in manifests]
    _apply(control_plane, objects)
    _apply(
        control_plane,
        [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": LOCAL_SERVICE, "namespace": NAMESPACE},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            }
        ],
    )
    directory = tmp_path_factory.mktemp("manifests")
    try:
        yield Installed(objects, webhook_name, _token_kubeconfig(control_plane, directory))
    finally:
        control_plane.kubectl(
            "delete", "validatingwebhookconfiguration", webhook_name, "--ignore-not-found",
            check=False,
        )  # fmt: skip


def _with_webhook_name(obj: dict[str, Any], webhook_name: str) -> dict[str, Any]:
    if obj["kind"] != "ClusterRole" or obj["metadata"]["name"] != CLUSTER_ROLE:
        return obj
    rules = [
        {**rule, "resourceNames": [webhook_name]} if rule.get("resourceNames") else rule
        for rule in obj["rules"]
    ]
    return {**obj, "rules": rules}


@pytest_asyncio.fixture
async def sa_tally(
    control_plane: ControlPlane, installed: Installed, tmp_path: Path
) -> AsyncIterator[SaTally]:
    tally = SaTally(installed, control_plane, tmp_path / "tally.log")
    try:
        await asyncio.to_thread(tally.start)
        yield tally
    finally:
        await asyncio.to_thread(tally.kill)


_pod = functools.partial(builders.pod, container_name="c", image="registry.k8s.io/pause:3.10")


async def test_tally_works_with_the_service_account_alone(
    control_plane: ControlPlane,
    installed: Installed,
    sa_tally: SaTally,
    api: client.ApiClient,
    namespace: str,
) -> None:
    # Registered with a Service client config, as in the Deployment.
    config = json.loads(
        control_plane.kubectl(
            "get", f"validatingwebhookconfiguration/{installed.webhook_name}", "-o", "json"
        ).stdout
    )
    for webhook in config["webhooks"]:
        assert "url" not in webhook["clientConfig"]
        assert webhook["clientConfig"]["service"]["name"] == LOCAL_SERVICE

    # The certificate is kept in the Secret the Role names (created by tally), and the
    # configuration trusts its CA.
    core = client.CoreV1Api(api)
    secret = await core.read_namespaced_secret(CERT_SECRET, NAMESPACE)
    assert secret.type == "kubernetes.io/tls"
    assert secret.metadata.labels == {"app.kubernetes.io/managed-by": "tally"}
    assert {"ca.crt", "ca.key", "tls.crt", "tls.key"} == set(secret.data)
    for webhook in config["webhooks"]:
        assert webhook["clientConfig"]["caBundle"] == secret.data["ca.crt"]

    await core.create_namespaced_resource_quota(
        namespace, builders.resource_quota("q", {"pods": "1", "count/podsets.tally.dev": "1"})
    )

    async def used() -> dict[str, str]:
        quota = await core.read_namespaced_resource_quota("q", namespace)
        return dict((quota.status and quota.status.used) or {})

    await eventually(
        used,
        until=lambda u: u == {"pods": "0", "count/podsets.tally.dev": "0"},
        what="status.used written by tally",
    )

    # Admission: the API server reaches tally through the Service and tally denies.
    await core.create_namespaced_pod(namespace, _pod("one"))
    with pytest.raises(client.ApiException) as denied:
        await core.create_namespaced_pod(namespace, _pod("two"))
    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    assert message == (
        'admission webhook "quota.tally.dev" denied the request: exceeded quota: q, '
        "requested: pods=1, used: pods=1, limited: pods=1"
    )

    # PodSet: its pods created by tally (another namespace: this one's pod quota is used up).
    await core.delete_namespaced_resource_quota("q", namespace)
    await core.delete_namespaced_pod("one", namespace)
    custom = client.CustomObjectsApi(api)
    await custom.create_namespaced_custom_object(
        "tally.dev",
        "v1alpha1",
        namespace,
        "podsets",
        {
            "apiVersion": "tally.dev/v1alpha1",
            "kind": "PodSet",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
                },
            },
        },
    )

    async def owned_pods() -> list[str]:
        listed = await core.list_namespaced_pod(namespace, label_selector="app=web")
        return sorted(
            p.metadata.name
            for p in listed.items
            if any(ref.kind == "PodSet" for ref in p.metadata.owner_references or [])
        )

    await eventually(owned_pods, until=lambda names: len(names) == 2, what="PodSet's pods")

    async def podset_status() -> dict[str, Any]:
        podset = await custom.get_namespaced_custom_object(
            "tally.dev", "v1alpha1", namespace, "podsets", "web"
        )
        return dict(podset.get("status") or {})

    await eventually(
        podset_status, until=lambda s: s.get("replicas") == 2, what="PodSet status.replicas"
    )
    log = sa_tally.log_text(tail=10_000)
    assert "forbidden" not in log.lower()
    # It led through the Lease in tally-system (created, read and renewed with the Role's
    # permissions alone).
    lease = json.loads(
        control_plane.kubectl("get", "lease", "tally", "-n", NAMESPACE, "-o", "json").stdout
    )
    assert lease["spec"]["holderIdentity"]
    assert f"acquired lease {NAMESPACE}/tally" in log
    # The built-in quota probe ran in tally's namespace with the Role's permissions alone, and
    # could tell (operator mode: upstream's quota system off).
    assert "the cluster's built-in quota system is off. " in log
    assert f"(Probe: quota {NAMESPACE}/{PROBE}, " in log


def _wait_for_probe_permission(plane: ControlPlane, *, granted: bool) -> None:
    """Until the API server's authorizer agrees (it follows RoleBindings through an informer)."""
    can_i = ("auth", "can-i", "create", "resourcequotas", "-n", NAMESPACE, f"--as={SA_USER}")
    deadline = time.monotonic() + 30
    while (plane.kubectl(*can_i, check=False).returncode == 0) != granted:
        assert time.monotonic() < deadline, f"create resourcequotas never became {granted}"
        time.sleep(0.2)


def test_without_the_probe_role_tally_cannot_tell_and_starts(
    control_plane: ControlPlane, installed: Installed, tmp_path: Path
) -> None:
    # The Role is what lets the start-up probe see whether upstream's quota system is off.
    # Without it tally cannot tell: it says which request was refused, and starts (fail-open).
    binding = installed.of_kind("RoleBinding", PROBE_ROLE)
    control_plane.kubectl("delete", "rolebinding", PROBE_ROLE, "-n", NAMESPACE)
    _wait_for_probe_permission(control_plane, granted=False)
    tally = SaTally(installed, control_plane, tmp_path / "tally.log")
    try:
        tally.start()
        log = tally.log_text(tail=10_000)
    finally:
        tally.kill()
        _apply(control_plane, [binding])
        _wait_for_probe_permission(control_plane, granted=True)
    (line,) = [line for line in log.splitlines() if "could not tell whether" in line]
    assert "[WARNING ]" in line
    assert (
        f'User "{SA_USER}" cannot create resource "resourcequotas" in API group "" in the '
        f'namespace "{NAMESPACE}"'
    ) in line
    assert "failed permanently" not in log


async def test_podset_events_are_created_and_patched_with_the_service_account(
    installed: Installed, sa_tally: SaTally, api: client.ApiClient, namespace: str
) -> None:
    """11 creates: the 10th Event is the aggregate (a create), the 11th counts it (a patch)."""
    labels = {"app": "burst"}
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        "tally.dev",
        "v1alpha1",
        namespace,
        "podsets",
        {
            "apiVersion": "tally.dev/v1alpha1",
            "kind": "PodSet",
            "metadata": {"name": "burst"},
            "spec": {
                "replicas": 11,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
                },
            },
        },
    )
    core = client.CoreV1Api(api)

    async def counts() -> list[tuple[str, int]]:
        found = await core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=burst"
        )
        return sorted((e.message.split(":")[0], e.count) for e in found.items)

    await eventually(
        counts,
        until=lambda c: (
            c == sorted([("Created pod", 1)] * 9 + [("(combined from similar events)", 2)])
        ),
        within=60,
        what="9 Events and an aggregate counted twice",
    )
    assert "forbidden" not in sa_tally.log_text(tail=10_000).lower()


async def test_without_quota_status_update_no_status_is_written(
    control_plane: ControlPlane,
    installed: Installed,
    api: client.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    role = installed.of_kind("ClusterRole", CLUSTER_ROLE)
    reduced = {
        **role,
        "rules": [r for r in role["rules"] if r["resources"] != ["resourcequotas/status"]],
    }
    assert len(reduced["rules"]) == len(role["rules"]) - 1
    _apply(control_plane, [reduced])
    tally = SaTally(installed, control_plane, tmp_path / "tally.log")
    try:
        await asyncio.to_thread(tally.start)
        core = client.CoreV1Api(api)
        await core.create_namespaced_resource_quota(
            namespace, builders.resource_quota("q", {"pods": "1"})
        )

        async def log() -> str:
            return tally.log_text(tail=10_000)

        text = await eventually(
            log,
            until=lambda t: "resourcequotas/status" in t and "forbidden" in t.lower(),
            what="tally logging the refused status write",
        )
        assert f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}" in text
        quota = await core.read_namespaced_resource_quota("q", namespace)
        assert not (quota.status and quota.status.used)
    finally:
        await asyncio.to_thread(tally.kill)
        _apply(control_plane, [role])
