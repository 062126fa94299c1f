"""What a namespace's own users may do with PodSets, through the built-in roles alone.

The manifests' ``rbac-namespace-users.yaml`` labels two ClusterRoles for aggregation into the
built-in ``view``, ``edit`` and ``admin`` (the cluster's clusterrole-aggregation controller
folds them in, as it does for the built-in workloads). Here two service accounts of one
namespace hold nothing but a RoleBinding there, one to ``edit`` and one to ``view``, and act with
their own tokens through kubectl, as a team member would. The expectations are the built-in
roles' on ReplicaSets: ``edit`` creates, scales (``kubectl scale``, the scale subresource) and
deletes in its namespace and is refused anywhere else; ``view`` reads and is refused every write.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from podset_e2e import install_podset_crd

import builders
from tally_e2e import (
    ControlPlane,
    RunningOperator,
    eventually,
    token_kubeconfig,
    wait_for_default_service_account,
)

WITHIN_S = 30.0
"""Aggregation of the roles after tally's RBAC is applied, and PodSet pods after a scale."""


@pytest.fixture(scope="module")
def podset_crd(control_plane: ControlPlane) -> None:
    install_podset_crd(control_plane)


@pytest_asyncio.fixture
async def elsewhere(api: client.ApiClient) -> AsyncIterator[str]:
    """A second namespace, where the users of the first hold nothing."""
    core = client.CoreV1Api(api)
    name = f"e2e-elsewhere-{uuid.uuid4().hex[:8]}"
    await core.create_namespace({"metadata": {"name": name}})
    await wait_for_default_service_account(api, name)
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(name)


async def bound_account(
    api: client.ApiClient, plane: ControlPlane, namespace: str, role: str, directory: Path
) -> Path:
    """A service account of ``namespace`` bound there to the built-in ClusterRole ``role`` by a
    RoleBinding, and a kubeconfig with its token."""
    account = f"{role}-user"
    await client.CoreV1Api(api).create_namespaced_service_account(
        namespace, {"metadata": {"name": account}}
    )
    await client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, {
        "metadata": {"name": account},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    })  # fmt: skip
    return token_kubeconfig(plane, namespace, account, directory / account)


def kubectl_as(
    plane: ControlPlane, kubeconfig: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(plane.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def owned_pods(api: client.ApiClient, namespace: str, name: str) -> int:
    """Pods of ``namespace`` whose controller is the PodSet ``name`` and that are not being
    deleted."""
    response = await client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    return sum(
        1
        for pod in json.loads(await response.read())["items"]
        if not pod["metadata"].get("deletionTimestamp")
        and any(
            ref.get("controller") and ref.get("kind") == "PodSet" and ref.get("name") == name
            for ref in pod["metadata"].get("ownerReferences") or []
        )
    )


async def test_edit_runs_podsets_in_its_namespace_and_view_reads_them(
    podset_crd: None,
    operator: RunningOperator,
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    elsewhere: str,
    tmp_path: Path,
) -> None:
    editor = await bound_account(api, control_plane, namespace, "edit", tmp_path)
    viewer = await bound_account(api, control_plane, namespace, "view", tmp_path)

    async def can_create() -> str:
        return kubectl_as(control_plane, editor, "auth", "can-i", "create",
                          "podsets.tally.dev").stdout.strip()  # fmt: skip

    # The aggregation controller folds the labelled rules into `edit` a moment after they exist.
    await eventually(can_create, until=lambda answer: answer == "yes", within=WITHIN_S,
                     what="edit to include the PodSet rules")  # fmt: skip

    body = builders.podset(
        "web", 1, selector={"app": "web"},
        containers=[builders.container("app", {"cpu": "10m"})],
    )  # fmt: skip
    manifest = json.dumps(body)

    created = kubectl_as(control_plane, editor, "create", "-f", "-", stdin=manifest)
    assert (0, "") == (created.returncode, created.stderr)
    assert "podset.tally.dev/web created\n" == created.stdout

    # Nothing in another namespace: the RoleBinding is in this one only.
    refused = kubectl_as(control_plane, editor, "create", "-n", elsewhere, "-f", "-",
                         stdin=manifest)  # fmt: skip
    assert 1 == refused.returncode
    assert (
        'Error from server (Forbidden): error when creating "STDIN": podsets.tally.dev is '
        f'forbidden: User "system:serviceaccount:{namespace}:edit-user" cannot create resource '
        f'"podsets" in API group "tally.dev" in the namespace "{elsewhere}"\n'
    ) == refused.stderr

    scaled = kubectl_as(control_plane, editor, "scale", "podset/web", "--replicas=3")
    assert (0, "podset.tally.dev/web scaled\n") == (scaled.returncode, scaled.stdout)
    await eventually(lambda: owned_pods(api, namespace, "web"), until=lambda n: n == 3,
                     within=WITHIN_S, what="three pods of the scaled PodSet")  # fmt: skip

    # The viewer lists it, reads its scale, and writes nothing.
    listed = kubectl_as(control_plane, viewer, "get", "podsets", "-o", "name")
    assert (0, "podset.tally.dev/web\n") == (listed.returncode, listed.stdout)
    scale_path = f"/apis/tally.dev/v1alpha1/namespaces/{namespace}/podsets/web/scale"
    scale = kubectl_as(control_plane, viewer, "get", "--raw", scale_path)
    assert 0 == scale.returncode, scale.stderr
    assert 3 == json.loads(scale.stdout)["spec"]["replicas"]
    viewer_user = f'User "system:serviceaccount:{namespace}:view-user"'
    for args, verb, resource in (
        (("scale", "podset/web", "--replicas=1"), "patch", "podsets/scale"),
        (("delete", "podset/web"), "delete", "podsets"),
    ):
        denied = kubectl_as(control_plane, viewer, *args)
        assert 1 == denied.returncode
        assert (
            f'{viewer_user} cannot {verb} resource "{resource}" in API group "tally.dev" in the '
            f'namespace "{namespace}"'
        ) in denied.stderr, denied.stderr

    deleted = kubectl_as(control_plane, editor, "delete", "podset/web", "--wait=false")
    assert (0, f'podset.tally.dev "web" deleted from {namespace} namespace\n') == (
        deleted.returncode,
        deleted.stdout,
    )
    gone = kubectl_as(control_plane, viewer, "get", "podsets", "-o", "name")
    assert (0, "") == (gone.returncode, gone.stdout)


async def test_admin_holds_what_edit_holds_and_view_writes_nothing(
    podset_crd: None,
    control_plane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The rights themselves, as the API server's authorizer answers them (``kubectl auth
    can-i``), for every verb the built-in roles give on ReplicaSets."""
    users = {role: await bound_account(api, control_plane, namespace, role, tmp_path)
             for role in ("admin", "edit", "view")}  # fmt: skip
    writes = [("create", ""), ("update", ""), ("patch", ""), ("delete", ""),
              ("deletecollection", ""), ("update", "scale"), ("patch", "scale")]  # fmt: skip
    reads = [("get", ""), ("list", ""), ("watch", ""), ("get", "scale"), ("get", "status")]
    expected = {
        "admin": {check: "yes" for check in writes + reads},
        "edit": {check: "yes" for check in writes + reads},
        "view": {**{check: "no" for check in writes}, **{check: "yes" for check in reads}},
    }

    def answers(role: str) -> dict[tuple[str, str], str]:
        found = {}
        for verb, subresource in writes + reads:
            args = ["auth", "can-i", verb, "podsets.tally.dev"]
            if subresource:
                args.append(f"--subresource={subresource}")
            found[(verb, subresource)] = kubectl_as(
                control_plane, users[role], *args
            ).stdout.strip()
        return found

    async def all_answers() -> dict[str, dict[tuple[str, str], str]]:
        return {role: answers(role) for role in users}

    # eventually: the aggregation controller may still be folding the rules in.
    await eventually(all_answers, until=lambda found: found == expected, within=WITHIN_S,
                     what="the built-in roles' PodSet rights")  # fmt: skip
    # Nobody but tally writes a PodSet's status.
    for role in users:
        status = kubectl_as(control_plane, users[role], "auth", "can-i", "update",
                            "podsets.tally.dev", "--subresource=status")  # fmt: skip
        assert "no" == status.stdout.strip(), role
